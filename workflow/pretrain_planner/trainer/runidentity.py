"""What a run's checkpoint belongs to, by name, so that a resume can say what differs. Imports no torch (the
driver and the CLI raise and catch `RunRefused` without it).

A checkpoint is resumed by every run that trains the same model on the same data in the same way: the model (its
name and its settings: architecture and recipe), the method, micro-batch x accumulation x ranks, the seed and the
data's content (the data layer's fingerprint). The budget is not part of it: a larger --steps or time budget
extends the run (its schedule recomputed over the new budget: train/run.py), a smaller one ends it where it is.
A checkpoint of another identity is refused in one line that names each part that differs and the two ways out.

The identity is in checkpoint.pt and beside it in identity.json (written with every checkpoint), so that a run can
refuse before it prepares its data (`precheck`: the parts known before the data; a run of another seed must not
rewrite the folder's data) and without reading the checkpoint's weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pretrain_planner.results import atomic_write_text, read_json
from pretrain_planner.runlog import fingerprint

IDENTITY_FILE = "identity.json"  # beside checkpoint.pt


class RunRefused(RuntimeError):
    """A run that must not start, for a reason the user can act on (one line, no traceback worth showing)."""


class CheckpointMismatch(RunRefused):
    """The run folder's checkpoint was made by a run of another identity."""


def identity_hash(identity: dict[str, Any]) -> str:
    """The checkpoint's `fingerprint`: a hash of the identity's parts."""
    return fingerprint(identity)


def _value(identity: dict[str, Any], notes: dict[str, Any], key: str) -> str:
    v = identity.get(key, "(not recorded)")
    note = notes.get(key)
    return f"{key} {v}" + (f" ({note})" if note else "")


def mismatch_message(
    ckpt: Path,
    run_dir: Path,
    made: dict[str, Any] | None,
    made_notes: dict[str, Any] | None,
    asked: dict[str, Any] | None,
    asked_notes: dict[str, Any] | None,
) -> str:
    """One line: which parts of the identity the checkpoint was made with differ from this run's, and the two ways
    out (start over, or run as it was made). `made` None: an older checkpoint that recorded no identity; `asked`
    None: a caller that keeps no identity (the fingerprint alone)."""
    if asked is None:  # a caller that checks the fingerprint alone (the budget stage)
        return f"{ckpt} belongs to another configuration or data: delete {run_dir} to start over"
    if made is None:
        return (f"{ckpt} was made by another configuration or data (an older checkpoint: what it belongs to is not "
                f"recorded): delete {run_dir} to start over")  # fmt: skip
    keys = [k for k in asked if made.get(k) != asked[k]] + [k for k in made if k not in asked]
    was = " and ".join(_value(made, made_notes or {}, k) for k in keys)
    now = " and ".join(_value(asked, asked_notes or {}, k) for k in keys)
    again = " and ".join(_value(made, {}, k) for k in keys)  # the values alone: their notes were said
    ways = f"delete {run_dir} to start over, or run with {again} to resume"
    return f"{ckpt} was made with {was}, this run asks {now}: {ways}"


def write_identity(run_dir: Path, identity: dict[str, Any], notes: dict[str, Any]) -> None:
    """identity.json beside the checkpoint (rank 0, with every checkpoint write)."""
    atomic_write_text(Path(run_dir) / IDENTITY_FILE, json.dumps({"identity": identity, "notes": notes}, indent=1))


def precheck(run_dir: Path, ckpt: Path, identity: dict[str, Any], notes: dict[str, Any]) -> None:
    """Before the data is prepared: refuse (CheckpointMismatch) when the folder's checkpoint was made with other
    values of the parts of `identity` given (those known before the data); nothing when there is no checkpoint or
    it recorded no identity (the checkpoint's own check decides then)."""
    rec = read_json(Path(run_dir) / IDENTITY_FILE) if ckpt.exists() else None
    if not isinstance(rec, dict) or not isinstance(rec.get("identity"), dict):
        return
    made = {k: v for k, v in rec["identity"].items() if k in identity}
    if made != identity:
        raise CheckpointMismatch(mismatch_message(ckpt, Path(run_dir), made, rec.get("notes"), identity, notes))
