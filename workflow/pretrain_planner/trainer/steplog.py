"""The step logs of a run that trains (steps.jsonl, validation.jsonl): one JSON record per line, flushed as
written (a killed run keeps what it logged), cut back to a checkpoint's step on resume; and the loss ends a
result reports. Imports no torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pretrain_planner.results import atomic_write_text


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep the lines of a step log up to `step` (what a resumed run has not redone)."""
    if not path.exists():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
    atomic_write_text(path, "".join(ln + "\n" for ln in keep))


def append_jsonl(fh, rec: dict[str, Any]) -> None:
    """One record of a step log, flushed: a killed run keeps what it logged."""
    fh.write(json.dumps(rec) + "\n")
    fh.flush()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def loss_ends(losses: list[float]) -> tuple[float | None, float | None]:
    """The mean loss over the first and over the last tenth of the steps (a result's loss_first, loss_last)."""
    if not losses:
        return None, None
    k = max(1, len(losses) // 10)
    return float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
