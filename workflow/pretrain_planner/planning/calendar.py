"""Calendar time on a shared cluster (issue 38): what a training of D compute-hours becomes when a partition's jobs
may run at most L hours and each job waits in a queue.

- Segments: n = ceil(D / (L - max(checkpoint, warning) - restart - read)) jobs; every job pays a start-up
  (`restart_s`: process start to the first steady step), every job but the first reads the checkpoint (`read_s`)
  and every job but the last ends with a checkpoint write (`checkpoint_s`) when the warning signal comes
  (`margin_s`, the site's signal_delay_s before the limit), so the run's wall time is
  D + n x restart + (n - 1) x (checkpoint + read). A limit no longer than one restart and one checkpoint trains
  nothing: an error naming the partition, not an infinite count.
- Calendar: the wait for the first job + the segments' wall time + (n - 1) x the wait to start again (the same
  estimate unless the site file gives `requeue_wait_h`). A wait the scheduler did not estimate is unknown, and so is
  every sum it is part of: never zero.
- SLURM's own words, parsed here: a partition's MaxTime (`max_time_hours`) and `sbatch --test-only`'s expected
  start (`expected_start`).

Imports no torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from pretrain_planner.schema import ConfigError


def _hours(h: float) -> str:
    """3 significant digits in hours, or in minutes / seconds under one (a tiny model's start-up is seconds)."""
    if h >= 1:
        return f"{h:.3g} h"
    return f"{h * 60:.3g} min" if h * 60 >= 1 else f"{h * 3600:.3g} s"


@dataclass(frozen=True)
class Segments:
    """A training cut into jobs of at most `limit_h` hours (None: one job, no limit)."""

    compute_h: float
    limit_h: float | None
    checkpoint_s: float
    restart_s: float
    count: int
    partition: str | None = None
    read_s: float = 0.0
    margin_s: float = 0.0

    @property
    def lost_h(self) -> float:
        """Hours not spent training: a start-up per job, a checkpoint write per job but the last and a checkpoint
        read per job but the first."""
        return (self.count * self.restart_s + (self.count - 1) * (self.checkpoint_s + self.read_s)) / 3600

    @property
    def wall_h(self) -> float:
        """The jobs' run time together (queue waits aside)."""
        return self.compute_h + self.lost_h

    def text(self) -> str:
        """E.g. "30 segments, 9.5 h lost to restarts"."""
        if self.count == 1:
            return f"1 segment, {_hours(self.lost_h)} of start-up"
        return f"{self.count} segments, {_hours(self.lost_h)} lost to restarts"


def segments(
    compute_h: float,
    limit_h: float | None,
    checkpoint_s: float,
    restart_s: float,
    partition: str | None = None,
    where: str = "",
    read_s: float = 0.0,
    margin_s: float = 0.0,
) -> Segments:
    """The segments of `compute_h` hours of training on a partition whose jobs run at most `limit_h` hours (`where`:
    where the limit comes from, for the error); `read_s` a checkpoint read, `margin_s` how long before the limit
    the job is warned (it stops training then; its checkpoint write takes the longer of the two)."""
    if min(compute_h, checkpoint_s, restart_s, read_s, margin_s) < 0:
        raise ValueError(f"negative time: compute {compute_h} h, checkpoint {checkpoint_s} s, restart {restart_s} s, "
                         f"read {read_s} s, warning {margin_s} s")  # fmt: skip
    if limit_h is None:
        return Segments(compute_h, None, checkpoint_s, restart_s, 1, partition, read_s, margin_s)
    usable_s = limit_h * 3600 - max(checkpoint_s, margin_s) - restart_s - read_s
    if usable_s <= 0:
        name = f"partition {partition}" if partition else "the partition"
        warned = f", warned {margin_s:.0f} s before it" if margin_s > checkpoint_s else ""
        raise ConfigError(
            f"{name}'s time limit of {limit_h * 60:g} min{f' ({where})' if where else ''}{warned} is no longer than "
            f"one start-up ({restart_s:.0f} s{f' and a checkpoint read of {read_s:.0f} s' if read_s else ''}) and one "
            f"checkpoint write "
            f"({checkpoint_s:.0f} s): no job on it can train. Use a partition with a longer limit (time_limit_min), "
            "a shorter signal_delay_s, or a setting whose state checkpoints faster."
        )
    count = max(1, math.ceil(compute_h * 3600 / usable_s - 1e-9))
    return Segments(compute_h, limit_h, checkpoint_s, restart_s, count, partition, read_s, margin_s)


@dataclass(frozen=True)
class Wait:
    """A queue wait in hours (None: unknown) and how it was known."""

    hours: float | None
    how: str

    def text(self) -> str:
        return "wait unknown" if self.hours is None else f"{self.hours:.3g} h"


NO_QUEUE = Wait(0.0, "local processes: no queue")


@dataclass(frozen=True)
class Calendar:
    """Calendar hours of a training: the first wait, the segments, the waits to start again."""

    segments: Segments
    first_wait: Wait
    requeue_wait: Wait

    @property
    def hours(self) -> float | None:
        """None where a wait it needs is unknown (the requeue wait only matters with more than one segment)."""
        waits = [self.first_wait] + ([self.requeue_wait] if self.segments.count > 1 else [])
        if any(w.hours is None for w in waits):
            return None
        again = (self.segments.count - 1) * (self.requeue_wait.hours or 0.0)
        return (self.first_wait.hours or 0.0) + self.segments.wall_h + again

    def finish(self, start: datetime) -> datetime | None:
        return None if self.hours is None else start + timedelta(hours=self.hours)


_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def max_time_hours(value: str) -> float | None:
    """SLURM's time format (a partition's MaxTime, a job's TimeLimit) in hours; None for UNLIMITED / INFINITE.
    "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes",
    "days-hours:minutes:seconds" (sbatch(1), --time)."""
    v = value.strip()
    if v.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _TIME.match(v)
    if not m:
        raise ValueError(f"not a SLURM time: {value!r}")
    days, a, b, c = m.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = int(a), int(b or 0), int(c or 0)
        return int(days) * 24 + hours + minutes / 60 + seconds / 3600
    if c is not None:  # hours:minutes:seconds
        return int(a) + int(b) / 60 + int(c) / 3600
    if b is not None:  # minutes:seconds
        return int(a) / 60 + int(b) / 3600
    return int(a) / 60  # minutes


_START = re.compile(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")


def expected_start(output: str, now: datetime, how: str = "sbatch --test-only") -> Wait:
    """The wait `sbatch --test-only` expects ("Job 12 to start at 2026-12-03T17:00:00 using 2 processors on nodes
    ... in partition ..."), from `now` (the scheduler's clock, local time); unknown when it gives no start."""
    m = _START.search(output)
    if not m:
        line = next((ln.strip() for ln in output.splitlines() if ln.strip()), "no output")
        return Wait(None, f"{how}: no expected start ({line[:160]})")
    start = datetime.fromisoformat(m.group(1))
    return Wait(max(0.0, (start - now).total_seconds() / 3600), f"{how}: expected start {m.group(1)}")


# SLURM's timing, measured on the testbed (SLURM 22.05; docs/cluster.md "Segments"): slurmctld checks time limits every
# 30 s and sends a job's --signal at the first check that finds at most signal_delay_s + 30 s left (sbatch(1): "the
# signal may be sent up to 60 seconds earlier than specified"); a requeued job starts in step with those checks and
# is warned 30 x (floor(signal_delay_s / 30) + 1) s before its limit. A requeued job is held until its BeginTime,
# cred_expire + 1 s after the requeue (slurm.conf AuthInfo, default 120 s), then waits for the next scheduler pass.
LIMIT_CHECK_S = 30
SCHEDULER_PASS_S = 30
DEFAULT_CRED_EXPIRE_S = 120


def warning_margin_s(signal_delay_s: float) -> float:
    """How long before its limit a job is warned, given the site's signal_delay_s (LIMIT_CHECK_S's resolution)."""
    return LIMIT_CHECK_S * (signal_delay_s // LIMIT_CHECK_S + 1) if signal_delay_s else 0.0


def requeue_hold_s(cred_expire_s: float | None) -> float:
    """How long SLURM holds a requeued job before it can start again: cred_expire + 1 s, then a scheduler pass."""
    return (DEFAULT_CRED_EXPIRE_S if cred_expire_s is None else cred_expire_s) + 1 + SCHEDULER_PASS_S


def asks_no_requeue(extra_sbatch: dict | None) -> bool:
    """Whether a GPU type's jobs are submitted not requeueable (`extra_sbatch: {no-requeue: true}`: a site that
    refuses requeue): each segment is then a new job the driver submits when the last one ends."""
    extra = extra_sbatch or {}
    return bool(extra.get("no-requeue") or extra.get("no_requeue"))


def requeue_wait(settings: dict, first: Wait, hold_s: float | None = None, hold_how: str = "") -> Wait:
    """The wait of a requeued job: the site's `requeue_wait_h` where it gives one, else the first job's again plus
    SLURM's requeue hold (`hold_s`; default requeue_hold_s of SLURM's default cred_expire). Where the site refuses
    requeue the driver submits a new job that resumes from the checkpoint (launch/slurm.py): no requeue hold, but
    the first job's wait again from its submission, up to one poll interval (`poll_s`) after the last one ends."""
    where = f"{settings['site']}: " if settings.get("site") else ""
    if settings.get("requeue_wait_h") is not None:
        return Wait(float(settings["requeue_wait_h"]), f"{where}gpus.{settings.get('gpu_type', '?')}.requeue_wait_h")
    if asks_no_requeue(settings.get("extra_sbatch")):
        poll_s = float(settings.get("poll_s") or 0)
        hours = None if first.hours is None else first.hours + poll_s / 3600
        return Wait(hours, f"a new job per segment ({where}gpus.{settings.get('gpu_type', '?')}.extra_sbatch: "
                           f"no-requeue): the first job's wait again ({first.how}) + the driver's notice of the "
                           f"last job's end (<= {poll_s:.0f} s)")  # fmt: skip
    if hold_s is None:
        hold_s, hold_how = requeue_hold_s(None), f"SLURM's default cred_expire {DEFAULT_CRED_EXPIRE_S} s"
    hours = None if first.hours is None else first.hours + hold_s / 3600
    return Wait(hours, f"the first job's wait again ({first.how}) + SLURM's requeue hold of {hold_s:.0f} s "
                       f"({hold_how}: cred_expire + 1 s, then a scheduler pass)")  # fmt: skip


def training_calendar(
    compute_h: float,
    settings: dict | None,
    restart_s: float,
    checkpoint_s: float,
    read_s: float,
    first_wait: Wait,
    hold_s: float | None = None,
    hold_how: str = "",
) -> Calendar:
    """The calendar of a training of `compute_h` hours run as the train stage runs it: on SLURM (`settings`: the
    GPU type's site settings, site.gpu_settings) each job asks the site's `time_limit_min`, is warned
    `signal_delay_s` before it (at SLURM's resolution: warning_margin_s), checkpoints and is requeued (held
    `hold_s`, requeue_hold_s); locally (`settings` None) one process, no queue."""
    if settings is None:
        return Calendar(segments(compute_h, None, checkpoint_s, restart_s, read_s=read_s), NO_QUEUE, NO_QUEUE)
    where = f"{settings.get('site') or 'site file'}: gpus.{settings.get('gpu_type', '?')}.time_limit_min"
    margin = warning_margin_s(float(settings.get("signal_delay_s") or 0))
    seg = segments(compute_h, settings["time_limit_min"] / 60, checkpoint_s, restart_s, settings.get("partition"),
                   where, read_s, margin)  # fmt: skip
    return Calendar(seg, first_wait, requeue_wait(settings, first_wait, hold_s, hold_how))


# The checkpoint of a training (trainer/loop.py: the method's full state dicts): fp32 weights (4 bytes per
# parameter: the trainer keeps fp32 weights under bf16/fp16 autocast) and Adam's two fp32 moments (8); DeepSpeed's
# ZeRO also writes its 16-bit module weights (2) beside its fp32 master partitions.
CHECKPOINT_BYTES_PER_PARAM = 12
ZERO_EXTRA_BYTES_PER_PARAM = 2


def checkpoint_bytes(params: float, zero: bool = False) -> float:
    """Bytes of a training's checkpoint of a model of `params` parameters (a lower bound: buffers, the loss
    scaler and the data position are small beside them)."""
    return params * (CHECKPOINT_BYTES_PER_PARAM + (ZERO_EXTRA_BYTES_PER_PARAM if zero else 0))


WRITE_PROBE_BYTES = 64 * 2**20


def disk_write_rate(folder: str, nbytes: int = WRITE_PROBE_BYTES) -> tuple[float | None, str]:
    """(GB/s, how) of a write of `nbytes` into `folder` made durable (fsync), as a checkpoint's is: the file
    system the runs write their checkpoints to. The file is removed. At most a quarter of the free space is
    written; a file system too full to measure (or a write that fails) gives None and says why, never a rate."""
    import os
    import time

    folder = os.path.abspath(folder)
    while not os.path.isdir(folder):  # not made yet (a CLI question before any run): the file system it will be on
        folder = os.path.dirname(folder)
    block = 2**20
    try:
        st = os.statvfs(folder)
        size = min(nbytes, st.f_bavail * st.f_frsize // 4) // block * block
    except OSError as exc:
        return None, f"not measured ({exc})"
    if size < block:
        return None, f"not measured: {folder} has too little free space to write a probe"
    path = os.path.join(folder, f".disk-rate-probe-{os.getpid()}")
    data = os.urandom(block)
    t0 = time.perf_counter()
    try:
        with open(path, "wb") as fh:
            for _ in range(size // block):
                fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        dt = time.perf_counter() - t0
    except OSError as exc:
        return None, f"not measured: writing {path} failed ({exc.strerror or exc})"
    finally:
        if os.path.exists(path):
            os.remove(path)
    rate = size / max(dt, 1e-6) / 1e9
    return rate, f"measured: {size / 2**20:.0f} MiB written and fsynced in {folder} at {rate:.2f} GB/s"
