"""The callables a job runs on every rank (a benchmark cell: launch/cell.py; a stage's entry: `EntryJob`).
Picklable and torch-free until called."""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

import submitit

from pretrain_planner import layout
from pretrain_planner.launch import progress

SLURM_RECORD = layout.SLURM_RECORD  # the SLURM job that measures a folder (written by the launcher)
LOCAL_RECORD = layout.LOCAL_RECORD  # the local job that measures a folder


def recorded_job(workdir: str | os.PathLike) -> str | None:
    """The job id the launcher recorded for `workdir` (None: no record). Only that job may write the
    folder's outputs: another one (requeued after its replacement was submitted, left by a killed driver)
    must not overwrite them."""
    name = SLURM_RECORD if os.environ.get("SLURM_JOB_ID") else LOCAL_RECORD
    try:
        return str(json.loads((Path(workdir) / name).read_text())["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def local_rank() -> int:
    for var in ("SUBMITIT_LOCAL_LOCALID", "SLURM_LOCALID", "LOCAL_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def global_rank() -> int:
    for var in ("SUBMITIT_LOCAL_GLOBALID", "SLURM_PROCID", "RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def job_id_here() -> str | None:
    """The id of the job this process belongs to (SLURM's, or submitit's local controller pid)."""
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")


def rendezvous_port(job_id: str, port_range: tuple[int, int] | None = None) -> int:
    """The port of a SLURM job's rendezvous (its TCPStore), the same on every rank: derived from the job id, as
    submitit does, but outside the kernel's ephemeral range. submitit's 20000-60000 overlaps it (32768-60999 by
    default), so a port picked there can already be held by any outgoing connection on the node (EADDRINUSE, seen
    in the chaos soak); ports below the range are never handed out that way."""
    if port_range is None:
        try:
            low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
        except (OSError, ValueError):
            low, high = 32768, 60999
    else:
        low, high = port_range
    first, last = (10000, low - 1) if low > 12000 else (high + 1, 65535)
    digits = "".join(c for c in str(job_id) if c.isdigit()) or "0"
    return first + (int(digits) * 2654435761) % (last - first)


def observe_rank() -> dict[str, Any]:
    """Where this rank runs, as the operating system and the scheduler see it."""
    out: dict[str, Any] = {
        "rank": global_rank(), "local_rank": local_rank(), "host": socket.gethostname(),
        "node": os.environ.get("SLURMD_NODENAME"), "pid": os.getpid(),
        "cpus": sorted(os.sched_getaffinity(0)), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }  # fmt: skip
    for var in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "GPU_DEVICE_ORDINAL"):
        if os.environ.get(var) is not None:
            out[var.lower()] = os.environ[var]
    return out


def _stacks_on_fatal_signal() -> None:
    """A rank that dies by a signal (SIGSEGV, SIGABRT from C++: gloo, NCCL, a kernel) prints every thread's Python
    stack into its task's stderr log, where otherwise only its exit status would say it ended. Not where stderr has
    no file descriptor (a captured stream): nothing could be written there."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # io.UnsupportedOperation is an OSError
        faulthandler.enable()


class RankJob(submitit.helpers.Checkpointable):
    """A job's callable. The launcher sets `context` before submitting: the job's folder (`workdir`), its
    record file, the devices it holds on this host (`placement`, local jobs) and what a refusal to requeue
    must say. Each rank first pins itself to its cores, then runs `run()`."""

    restartable = True  # a time-out requeue starts from scratch (see progress.py)

    def __init__(self) -> None:
        self.context: dict[str, Any] = {}

    def __call__(self) -> Any:
        ctx = getattr(self, "context", None) or {}
        if ctx.get("kind") in ("local", "slurm"):  # a process of its own (the debug launcher's runs in the driver's)
            _stacks_on_fatal_signal()
        place = ctx.get("placement")
        if place:
            cpus = place["cpus_by_rank"][local_rank() % len(place["cpus_by_rank"])]
            os.sched_setaffinity(0, cpus)  # before torch starts its thread pools: they inherit it
            os.environ["OMP_NUM_THREADS"] = str(place["threads_per_rank"])
        if os.environ.get("SLURM_JOB_ID") and "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(rendezvous_port(os.environ["SLURM_JOB_ID"]))  # before submitit picks one
        if ctx.get("workdir") and ctx.get("kind") == "local":
            pids = Path(ctx["workdir"]) / "local_ranks"
            pids.mkdir(parents=True, exist_ok=True)
            from pretrain_planner.launch.hostpool import start_time

            me = {"pid": os.getpid(), "start": start_time(os.getpid()), "job_id": job_id_here()}
            (pids / f"rank{global_rank()}.json").write_text(json.dumps(me))
        return self.run()

    def run(self) -> Any:
        raise NotImplementedError

    def progress_units(self) -> int | None:
        return progress.current()

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission | None:
        """On USR2 (rank 0): requeue, unless this is a time-out that would loop without progress."""
        ctx = getattr(self, "context", None) or {}
        slurm = ctx.get("slurm") or {}
        if ctx.get("workdir") and slurm.get("time_limit_min") and submitit_timed_out():
            reason = progress.decide_requeue(
                ctx["workdir"], job_id_here(), self.progress_units(), self.restartable, slurm, ctx.get("what", "job")
            )
            if reason:
                print(f"pretrain-planner: not requeued: {reason}", flush=True)
                return None  # submitit: "Job not requeued because: checkpoint function returned None"
        return super().checkpoint(*args, **kwargs)


def submitit_timed_out() -> bool:
    """Whether submitit takes the USR2 being handled for the job's time limit, not a pre-emption: asked of the
    signal handler submitit installed in this process (SignalHandler.has_timed_out: the job ran at least
    min(80% of its limit, the limit - 10 min)), so that its rule has one home, submitit's. False outside a
    submitit job (no handler: nothing requeues it)."""
    from submitit.core.job_environment import JobEnvironment

    handler = getattr(signal.getsignal(JobEnvironment._usr_sig()), "__self__", None)
    has_timed_out = getattr(handler, "has_timed_out", None)
    return bool(has_timed_out()) if callable(has_timed_out) else False


def entry(name: str) -> Any:
    """The function `module:function` names, imported where the job runs (a stage's entry imports torch: on the
    compute side only; a name keeps the launcher below the stages it runs)."""
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


class EntryJob(RankJob):
    """A stage's job on every rank: its entry (`module:function`) called with `kwargs`. `restartable` False: the
    entry resumes from its checkpoint, so a time-out requeue must show progress (progress.py)."""

    def __init__(self, name: str, kwargs: dict[str, Any], restartable: bool = True) -> None:
        super().__init__()
        self.name, self.kwargs, self.restartable = name, kwargs, restartable

    def run(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        return entry(self.name)(**self.kwargs)
