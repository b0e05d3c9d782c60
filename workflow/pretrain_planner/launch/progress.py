"""How far a job has come, so that a requeue that cannot bring it further is refused. Imports no torch.

SLURM sends USR2 `signal_delay_s` before the time limit; submitit then calls the job's `checkpoint` and
requeues it. If the limit is so short that the warning comes right after a requeued job restarts, every
attempt loops through its requeues without progress. The rank-0 process counts its progress here
(`mark`); on a time-out the job compares it with what the previous time-out of the same job saw
(`requeues.json` in the job's folder) and refuses to requeue when nothing moved: a benchmark cell restarts
from its first step (one time-out requeue is allowed: compile caches are warm the second time), a
checkpointing run must have checkpointed further. The refusal is written to `no_progress.json`, which the
driver turns into a failure naming the site key to raise, without submitting the same job again.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

HISTORY = "requeues.json"
VERDICT = "no_progress.json"

_STATE: dict[str, Any] = {"units": None, "what": None, "t": None}


def mark(units: int, what: str = "") -> None:
    """Record this process's progress (monotone units: optimizer steps checkpointed, ...)."""
    _STATE.update(units=int(units), what=what, t=time.time())


def current() -> int | None:
    return _STATE["units"]


def timed_out(started: float, time_limit_min: float) -> bool:
    """submitit's rule for a USR2 that means the time limit (not a preemption): the job ran for at least
    min(80% of its limit, the limit - 10 min)."""
    limit_s = time_limit_min * 60
    return time.time() - started >= min(0.8 * limit_s, limit_s - 600)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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
    history = [h for h in (_read(folder / HISTORY) or []) if h.get("job_id") == job_id]
    entry = {"job_id": job_id, "at": dt.datetime.now().isoformat(timespec="seconds"), "progress": units}
    atomic_write_text(folder / HISTORY, json.dumps([*history, entry], indent=1) + "\n")
    if not history:
        return None
    last = history[-1].get("progress")
    if not restartable and units is not None and (last is None or units > last):
        return None
    slurm = slurm or {}
    gpu = slurm.get("gpu_type", "<gpu>")
    why = "a benchmark restarts from its first step" if restartable else f"progress {units} vs {last} last time"
    reason = (
        f"{what}: job {job_id} reached its time limit again without getting further "
        f"({why}"
        f"; time limit {slurm.get('time_limit_min')} min, warning signal {slurm.get('signal_delay_s')} s before it). "
        f"Requeueing cannot finish it: raise `time_limit_min` for GPU type {gpu} in the site file "
        f"({slurm.get('site', 'launcher.site')}: gpus.{gpu}.time_limit_min), or lower its `signal_delay_s`."
    )
    verdict = {"job_id": job_id, "reason": reason, "time_limit_min": slurm.get("time_limit_min"),
               "signal_delay_s": slurm.get("signal_delay_s"), "identity": slurm.get("identity"),
               "pid": os.getpid()}  # fmt: skip
    atomic_write_text(folder / VERDICT, json.dumps(verdict, indent=1) + "\n")
    return reason


def verdict_for(folder: str | Path, identity: str, slurm: dict[str, Any] | None) -> dict[str, Any] | None:
    """A refusal recorded for this same job (identity and time settings), if any: the driver fails the job
    again at once instead of submitting it to loop again."""
    verdict = _read(Path(folder) / VERDICT)
    if not verdict or not slurm:
        return None
    same = (
        verdict.get("identity") == identity
        and verdict.get("time_limit_min") == slurm.get("time_limit_min")
        and verdict.get("signal_delay_s") == slurm.get("signal_delay_s")
    )
    return verdict if same else None
