"""Answers that take seconds to compute and depend only on their inputs and this package's planning code, kept on
disk between processes: every CLI answer is a new process, and `fit` spent most of its time recalibrating the
cross-GPU model's out-of-sample errors on the same evidence each time (planning/crossgpu.py `fit`).

An entry's name is the SHA-256 of its key text and of the source of every planning module, so an edit to the code
that computes it (or to the evidence in the key) makes a new entry, never a stale answer. The folder is
$PP_CACHE_DIR, else $XDG_CACHE_HOME/pretrain-planner, else ~/.cache/pretrain-planner; a folder that cannot be
written (a read-only home) only costs the time: nothing fails for want of a cache. Imports no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

PLANNING = Path(__file__).resolve().parent


def folder() -> Path:
    """Where entries are kept (read each call: a test or a user may point PP_CACHE_DIR elsewhere)."""
    if os.environ.get("PP_CACHE_DIR"):
        return Path(os.environ["PP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pretrain-planner"


@cache
def _code() -> bytes:
    """The planning modules' source, digested once per process: what an entry was computed by."""
    h = hashlib.sha256()
    for path in sorted(PLANNING.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.digest()


def _path(kind: str, key: str) -> Path:
    digest = hashlib.sha256(_code() + b"\0" + kind.encode() + b"\0" + key.encode()).hexdigest()[:32]
    return folder() / kind / f"{digest}.json"


def get(kind: str, key: str) -> Any | None:
    """The JSON value stored under (kind, key) by this code, or None (absent, unreadable, or cut short)."""
    try:
        return json.loads(_path(kind, key).read_text())
    except (OSError, ValueError):
        return None


def put(kind: str, key: str, value: Any) -> None:
    """Store a JSON value under (kind, key): written whole or not at all (a temporary file renamed into place, so a
    reader never sees half of one, and two processes storing the same entry both leave a whole one)."""
    path = _path(kind, key)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(value, fh)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
