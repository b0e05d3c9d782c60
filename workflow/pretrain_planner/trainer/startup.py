"""What one start of a run costs before it trains: the start-up phases a benchmark cell, a train run and a budget
run record (result.json `startup`; a run that trains also `starts`, one entry per process start, and `checkpoint`,
its checkpoint writes and reads), from which a calendar prices a restart after a time limit: the process starting
until its rank is up (the process group joined), the model built from its config, the method applied to it, the
first batches made, the first step's extra time (torch.compile's), and a resumed run's checkpoint read.

The process's start is Linux's own record of it (/proc/self/stat field 22, `starttime`, in clock ticks since boot,
placed on the wall clock by the boot time: now minus /proc/uptime, to 10 ms; /proc/stat's `btime`, whole seconds,
when /proc/uptime cannot be read). It is used only where the process was started for this run (a submitit job's
task, torchrun's rank, `python -m` of the run's entry) and for its first run: a run inside a longer-lived process
(the debug launcher's, a test's) starts its clock when the run begins instead, and says so (`process_start`).
Imports no torch."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pretrain_planner.launch.hostpool import start_epoch
from pretrain_planner.launch.warm import PRELOAD_ENV

PHASES = ("process_to_rank_s", "model_build_s", "method_wrap_s", "data_ready_s", "compile_s")

_RUNS = [0]  # runs begun in this process (only the first may take the process's own start)


def process_start_epoch() -> float | None:
    """The wall-clock time this process started (Linux: /proc/self/stat's starttime + the boot time); None where
    /proc cannot tell."""
    return start_epoch(os.getpid())


def own_process(entries: Iterable[str] = ()) -> bool:
    """Whether this process was started for the run it runs: a submitit job's task (local or SLURM), a torchrun
    rank, or `python -m` of one of `entries` (module names)."""
    if os.environ.get("SUBMITIT_EXECUTOR") in ("local", "slurm") or "TORCHELASTIC_RUN_ID" in os.environ:
        return True
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None) or ""
    return any(name in (e, f"{e}.__main__") for e in entries)


class Clock:
    """One run's start-up clock, begun where the run begins (`began`: run_rank, train_plan, pretrain). Its zero is
    the process's start ("proc") when the process was started for this run and this is its first run, else the
    run's beginning (`fallback` names it)."""

    def __init__(self, own: bool, fallback: str) -> None:
        self.began = time.time()
        _RUNS[0] += 1
        start = process_start_epoch() if own and _RUNS[0] == 1 else None
        preload = float(os.environ.get(PRELOAD_ENV) or 0)
        if start is not None and start <= self.began and preload > 0:
            # forked warm: its fork, plus the imports its interpreter made once (what a fresh process pays)
            self.zero, self.process_start = start - preload, "proc+preload"
        elif start is not None and start <= self.began:
            self.zero, self.process_start = start, "proc"
        else:
            self.zero, self.process_start = self.began, fallback
        self.rank_up_s: float | None = None

    def rank_up(self) -> float:
        """The rank is up (its process group joined, or none needed): seconds since the clock's zero."""
        self.rank_up_s = max(0.0, time.time() - self.zero)
        return self.rank_up_s


def compile_cost(first_step_s: float | None, steady_s: float | None) -> float | None:
    """The first step's extra time over a steady step (torch.compile's, autotuning, allocator growth), >= 0."""
    if first_step_s is None or steady_s is None:
        return None
    return max(0.0, first_step_s - steady_s)


def phases(values: dict[str, float | None], process_start: str, rule: str, **extra: Any) -> dict[str, Any]:
    """The `startup` record: every phase (None read as 0), their sum `total_s`, where the clock started, the rule."""
    out: dict[str, Any] = {k: float(values.get(k) or 0.0) for k in PHASES}
    out["total_s"] = sum(out[k] for k in PHASES)
    out["process_start"] = process_start
    out.update(extra)
    out["rule"] = rule
    return out


CELL_RULE = (
    "process_to_rank_s: this process's start (process_start 'proc': /proc/self/stat starttime + boot time; "
    "'proc+preload': a rank forked from a warm interpreter (launch/warm.py), its fork less the seconds that "
    "interpreter took to start and import what a rank imports, so it counts what a fresh process pays; "
    "'run_rank': run_rank's beginning, where the process is not the cell's own) until init_rank returned (the "
    "process group joined); model_build_s: trainer.methodbuild.build's model from its config (settings resolved, "
    "weights drawn, model-level kernels), and method_wrap_s: the method applied to it (parallel.apply_method + the "
    "optimizer + TrainStep, or DeepSpeed's engine), both of the cell's first build only (the micro-batch search may "
    "build again: not summed), the device synchronised around each; data_ready_s: making the timed run's batches; "
    "compile_s = compile_trial_s + first_step_extra_s: the micro-batch search's trial at the timed size, its first "
    "forward + backward minus its last (the same micro-batch again: torch.compile's tracing and code generation at "
    "that shape, which the timed instance then reuses), plus the timed run's first step minus its median timed step "
    "(what a fresh instance's first step still adds: the optimizer's first step, a compiled optimizer step), each "
    "clipped at 0 and near 0 eager; each phase the slowest rank's; total_s: the five phases' sum, what one restart "
    "of this setting costs before it trains (a run that resumes adds its checkpoint read)"
)

RUN_RULE = (
    "per process start (`starts`, kept in the checkpoint across requeues): process_to_rank_s from this process's "
    "start (process_start 'proc': /proc/self/stat starttime + boot time; 'proc+preload': forked warm, its fork less "
    "its interpreter's start and imports; else the run's own beginning, in a process that was not started for it) "
    "until its ranks were up; model_build_s and method_wrap_s: "
    "trainer.methodbuild.build's model from its config and the method applied to it; data_ready_s: the task's data "
    "made ready (prepared or read back, the sampler set up); compile_s: that start's first step minus the run's "
    "median step (steps.jsonl, warm-up and each start's first step left out), clipped at 0; read_s: the checkpoint "
    "read when it resumed (torch.load + the state dicts loaded), else null; each the slowest rank's; total_s: the "
    "five phases' sum (the read is apart). `startup` is the last start's"
)


def steady_step(steps: list[dict[str, Any]], first_steps: set[int]) -> float | None:
    """The run's median step (steps.jsonl records): warm-up steps and each start's first step left out (all the
    steps when that leaves none)."""
    times = [float(s["step_time_s"]) for s in steps if not s.get("warmup") and int(s["step"]) not in first_steps]
    if not times:
        times = [float(s["step_time_s"]) for s in steps]
    return statistics.median(times) if times else None


def normal_starts(starts: list[Any]) -> list[dict[str, Any]]:
    """A checkpoint's `starts`, each a dict (an older train checkpoint kept the start steps alone)."""
    return [s if isinstance(s, dict) else {"step": int(s), "read_s": None, "first_step_s": None} for s in starts]


def run_starts(starts: list[Any], steps: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float | None]:
    """Every start of a run with its compile_s (its first step minus the run's steady step) and total_s; and the
    steady step."""
    starts = normal_starts(starts)
    steady = steady_step(steps, {int(s["step"]) + 1 for s in starts})
    out = []
    for s in starts:
        entry = dict(s)
        if all(k in s for k in PHASES[:-1]):
            entry["compile_s"] = compile_cost(s.get("first_step_s"), steady)
            entry["total_s"] = sum(float(entry[k] or 0.0) for k in PHASES)
        out.append(entry)
    return out, steady


def startup_record(
    starts: list[dict[str, Any]], steady_s: float | None = None, note: str | None = None
) -> dict[str, Any] | None:
    """result.json `startup` of a run: the last start's phases (its step, checkpoint read and the run's steady step
    beside them)."""
    last = next((s for s in reversed(starts) if "total_s" in s), None)
    if last is None:
        return None
    rule = RUN_RULE + (f"; {note}" if note else "")
    return phases(last, last.get("process_start") or "unknown", rule, step=last["step"], read_s=last.get("read_s"),
                  steady_step_s=steady_s)  # fmt: skip


def checkpoint_bytes(run_dir: Path, ckpt: str, ds_dir: str) -> int | None:
    """Bytes on disk of the run's checkpoint: checkpoint.pt plus DeepSpeed's shard folder (None: none written)."""
    path = run_dir / ckpt
    if not path.is_file():
        return None
    total = path.stat().st_size
    ds = run_dir / ds_dir
    if ds.is_dir():
        total += sum(p.stat().st_size for p in ds.rglob("*") if p.is_file())
    return total


CHECKPOINT_RULE = (
    "writes: checkpoints written over the run (every start's, the last included); write_s: the mean seconds of "
    "the writes timed (rank 0: the state dicts gathered, torch.save to a temporary file, renamed; no fsync, so the "
    "page cache may hide the disk; a write that a later start resumed from is counted but was not timed: its "
    "process ended before the time was kept), write_total_s their sum; read_s: the mean seconds of the reads of "
    "the starts that resumed (null: never resumed); bytes: checkpoint.pt plus the DeepSpeed shard folder on disk "
    "after the last write; write_gb_s: bytes / write_s / 1e9"
)


def checkpoint_record(state: dict[str, Any], starts: list[dict[str, Any]], nbytes: int | None) -> dict[str, Any]:
    """result.json `checkpoint`: the writes and reads of the run (see CHECKPOINT_RULE)."""
    writes = int(state.get("checkpoints", 0))
    timed = int(state.get("checkpoints_timed", writes))
    total = float(state.get("checkpoint_s", 0.0))
    write_s = total / timed if timed else None
    reads = [float(s["read_s"]) for s in starts if s.get("read_s") is not None]
    return {
        "writes": writes,
        "writes_timed": timed,
        "write_s": write_s,
        "write_total_s": total,
        "read_s": statistics.fmean(reads) if reads else None,
        "reads": len(reads),
        "bytes": nbytes,
        "write_gb_s": nbytes / write_s / 1e9 if nbytes and write_s else None,
        "rule": CHECKPOINT_RULE,
    }
