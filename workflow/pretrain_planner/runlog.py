"""What a run leaves beside its outputs, for every stage that trains (the train and budget stages, their data
preparation, GLUE): its log file of timestamped lines (`FileLog`) and the fingerprint of what its outputs depend
on (`fingerprint`: a checkpoint or prepared data of another configuration is never reused). Imports no torch."""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path
from typing import Any


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-able values (what a stage's outputs depend on)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class FileLog:
    """Timestamped lines appended to a rule's log file (plain appends: no logging-module global state, which
    libraries loaded later may rewire). No path: lines are dropped (the ranks other than 0)."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def info(self, msg: str, *args: Any) -> None:
        if self.path is None:
            return
        stamp = datetime.datetime.now().isoformat(sep=" ", timespec="milliseconds")
        with self.path.open("a") as fh:
            fh.write(f"{stamp} {msg % args if args else msg}\n")
