"""Calendar time on a shared cluster (issue 38): what a training of D compute-hours becomes when a partition's jobs
may run at most L hours and each job waits in a queue.

- Segments: n = ceil(D / (L - checkpoint - restart)) jobs; every job pays a start-up (`restart_s`: process start
  to the first step) and every job but the last ends with a checkpoint write (`checkpoint_s`), so the run's wall
  time is D + n x restart + (n - 1) x checkpoint. A limit no longer than one restart and one checkpoint trains
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


@dataclass(frozen=True)
class Segments:
    """A training cut into jobs of at most `limit_h` hours (None: one job, no limit)."""

    compute_h: float
    limit_h: float | None
    checkpoint_s: float
    restart_s: float
    count: int
    partition: str | None = None

    @property
    def lost_h(self) -> float:
        """Hours not spent training: a start-up per job, a checkpoint write per job but the last."""
        return (self.count * self.restart_s + (self.count - 1) * self.checkpoint_s) / 3600

    @property
    def wall_h(self) -> float:
        """The jobs' run time together (queue waits aside)."""
        return self.compute_h + self.lost_h

    def text(self) -> str:
        """E.g. "30 segments, 9.5 h lost to restarts"."""
        if self.count == 1:
            return f"1 segment, {self.lost_h:.2g} h of start-up"
        return f"{self.count} segments, {self.lost_h:.3g} h lost to restarts"


def segments(
    compute_h: float,
    limit_h: float | None,
    checkpoint_s: float,
    restart_s: float,
    partition: str | None = None,
    where: str = "",
) -> Segments:
    """The segments of `compute_h` hours of training on a partition whose jobs run at most `limit_h` hours (`where`:
    where the limit comes from, for the error)."""
    if compute_h < 0 or checkpoint_s < 0 or restart_s < 0:
        raise ValueError(f"negative time: compute {compute_h} h, checkpoint {checkpoint_s} s, restart {restart_s} s")
    if limit_h is None:
        return Segments(compute_h, None, checkpoint_s, restart_s, 1, partition)
    usable_s = limit_h * 3600 - checkpoint_s - restart_s
    if usable_s <= 0:
        name = f"partition {partition}" if partition else "the partition"
        raise ConfigError(
            f"{name}'s time limit of {limit_h * 60:g} min{f' ({where})' if where else ''} is no longer than one "
            f"start-up ({restart_s:.0f} s) and one checkpoint write ({checkpoint_s:.0f} s): no job on it can train. "
            "Use a partition with a longer limit, or a setting whose state checkpoints faster."
        )
    return Segments(compute_h, limit_h, checkpoint_s, restart_s, max(1, math.ceil(compute_h * 3600 / usable_s)),
                    partition)  # fmt: skip


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
