"""How far a job has come, so that a requeue that cannot bring it further is refused. Imports no torch.

SLURM sends USR2 `signal_delay_s` before the time limit; submitit then calls the job's `checkpoint` and
requeues it. If the limit is so short that the warning comes right after a requeued job restarts, every
attempt loops through its requeues without progress. The rank-0 process counts its progress here
(`mark`); on a time-out the job compares it with what the previous time-out of the same job saw
(`requeues.json` in the job's folder) and refuses to requeue when nothing moved: a benchmark cell restarts
from its first step (one time-out requeue is allowed: compile caches are warm the second time), a
checkpointing run must have checkpointed further. The refusal is written to `no_progress.json`, which the
driver turns into a failure naming the site key to raise, without submitting the same job again.

The same marks are what a running cell shows of itself: when a progress file is configured (`report_to`,
rank 0 of a benchmark cell), `mark` also appends a JSON line there (what, units, elapsed seconds), at most one
every `MIN_INTERVAL_S` unless the mark is one that must be seen (a micro-batch trial, the last timed step).
The rank writes its own file, never the cell's log: the driver copies the lines into cell.log (one writer
per file, also on a shared file system) and `pretrain-planner status --watch` shows the latest.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.results import read_json

HISTORY = "requeues.json"
VERDICT = "no_progress.json"

PROGRESS_FILE = layout.CELL_PROGRESS  # a benchmark cell's progress lines, in its folder
MIN_INTERVAL_S = 2.0

_STATE: dict[str, Any] = {"units": None, "what": None, "t": None}
# where this thread's marks go: per thread, as the debug launcher runs cells in threads of the driver
_SINK = threading.local()


def report_to(path: str | Path | None) -> None:
    """Append this thread's marks to `path` from now on (None: stop); elapsed seconds count from here."""
    _SINK.path = Path(path) if path else None
    _SINK.t0 = time.time()
    _SINK.last = float("-inf")


def mark(units: int, what: str = "", always: bool = False) -> None:
    """Record this process's progress (units: optimizer steps checkpointed, ...: what a time-out requeue
    compares; for a benchmark cell, which restarts from scratch, only informative). With a progress file
    configured, also append `what` to it, rate-limited unless `always`."""
    t = time.time()
    _STATE.update(units=int(units), what=what, t=t)
    path = getattr(_SINK, "path", None)
    if path is None or not what or (not always and t - _SINK.last < MIN_INTERVAL_S):
        return
    _SINK.last = t
    line = json.dumps({"t": round(t, 3), "elapsed_s": round(t - _SINK.t0, 1), "units": int(units), "what": what})
    try:
        with open(path, "a") as fh:
            fh.write(line + "\n")
    except OSError:  # progress is for people to watch: never a reason for a measurement to fail
        pass


def read_lines(path: str | Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The complete progress lines of `path` from byte `offset` on, and the offset after them (a line being
    written is left for the next read; a file shorter than `offset` was started anew: read from 0)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() < offset:
                offset = 0
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    out = []
    for raw in data[:end].splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("what"):
            out.append(entry)
    return out, offset + end


def last_line(path: str | Path, tail_bytes: int = 4096) -> dict[str, Any] | None:
    """The latest progress line of `path`, or None."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    lines, _ = read_lines(path, max(0, size - tail_bytes))
    return lines[-1] if lines else None


def describe(entry: dict[str, Any]) -> str:
    """One progress line as people read it."""
    return f"{entry['what']} (elapsed {entry.get('elapsed_s', 0):.0f} s)"


def current() -> int | None:
    return _STATE["units"]


def decide_requeue(
    folder: str | Path,
    job_id: str | None,
    units: int | None,
    restartable: bool,
    slurm: dict[str, Any] | None,
    what: str,
) -> str | None:
    """On a time-out: None to requeue, else the reason not to (also written to `no_progress.json`).
    `restartable`: the job starts over from scratch (a benchmark cell), so only one time-out requeue."""
    from pretrain_planner.results import atomic_write_text

    folder = Path(folder)
    history = [h for h in (read_json(folder / HISTORY) or []) if h.get("job_id") == job_id]
    entry = {"job_id": job_id, "at": dt.datetime.now().isoformat(timespec="seconds"), "progress": units}
    atomic_write_text(folder / HISTORY, json.dumps([*history, entry], indent=1) + "\n")
    if not history:
        return None
    last = history[-1].get("progress")
    if not restartable and units is not None and (last is None or units > last):
        return None
    why = "a benchmark restarts from its first step" if restartable else f"progress {units} vs {last} last time"
    return refuse(folder, job_id, slurm, f"{what}: job {job_id} reached its time limit again without getting further "
                  f"({why}")  # fmt: skip


def refuse(
    folder: str | Path, job_id: str | None, slurm: dict[str, Any] | None, what_happened: str, whole: bool = False
) -> str:
    """Write the refusal to requeue or resubmit (`no_progress.json`) and return its reason, which names the site key
    to raise. `what_happened` is the reason's start; the time settings close its parenthesis (`whole`: it is the
    whole reason, e.g. a job that pends for ever, launch/pending.py)."""
    from pretrain_planner.results import atomic_write_text

    slurm = slurm or {}
    gpu = slurm.get("gpu_type", "<gpu>")
    reason = what_happened if whole else (
        f"{what_happened}; time limit {slurm.get('time_limit_min')} min, warning signal "
        f"{slurm.get('signal_delay_s')} s before it). "
        f"Requeueing cannot finish it: raise `time_limit_min` for GPU type {gpu} in the site file "
        f"({slurm.get('site', 'launcher.site')}: gpus.{gpu}.time_limit_min), or lower its `signal_delay_s`."
    )  # fmt: skip
    verdict = {"job_id": job_id, "reason": reason, "time_limit_min": slurm.get("time_limit_min"),
               "signal_delay_s": slurm.get("signal_delay_s"), "identity": slurm.get("identity"),
               "pid": os.getpid()}  # fmt: skip
    atomic_write_text(Path(folder) / VERDICT, json.dumps(verdict, indent=1) + "\n")
    return reason


def verdict_for(folder: str | Path, identity: str, slurm: dict[str, Any] | None) -> dict[str, Any] | None:
    """A refusal recorded for this same job (identity and time settings), if any: the driver fails the job
    again at once instead of submitting it to loop again."""
    verdict = read_json(Path(folder) / VERDICT)
    if not verdict or not slurm:
        return None
    same = (
        verdict.get("identity") == identity
        and verdict.get("time_limit_min") == slurm.get("time_limit_min")
        and verdict.get("signal_delay_s") == slurm.get("signal_delay_s")
    )
    return verdict if same else None
