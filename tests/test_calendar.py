"""Calendar time (issue 38): the segment arithmetic of a training on a time-limited partition, the waits that make a
finish date, and SLURM's words for both (a partition's MaxTime, `sbatch --test-only`'s expected start)."""

from __future__ import annotations

from datetime import datetime

import pytest
from pretrain_planner.planning.calendar import (
    NO_QUEUE,
    Calendar,
    Wait,
    expected_start,
    max_time_hours,
    segments,
)
from pretrain_planner.schema import ConfigError


def test_a_long_training_is_cut_into_jobs_that_each_pay_a_restart():
    """30 compute-days on a 24 h partition, 10 min to start and 5 min to checkpoint: a job trains 23.75 h, so 31
    jobs (30 x 24 h would leave the last 7.75 h out); 31 start-ups and 30 checkpoints lost."""
    s = segments(30 * 24, 24, checkpoint_s=300, restart_s=600, partition="gpu")
    assert s.count == 31
    assert s.lost_h == pytest.approx((31 * 600 + 30 * 300) / 3600)
    assert s.wall_h == pytest.approx(720 + s.lost_h)
    assert s.text() == "31 segments, 7.67 h lost to restarts"
    exact = segments(2 * 23.75, 24, 300, 600)  # exactly two jobs' worth: two, not three
    assert exact.count == 2


def test_no_limit_is_one_segment_and_a_short_training_one_too():
    assert segments(500, None, 300, 600).count == 1
    assert segments(0.5, 24, 300, 600).count == 1
    assert segments(0.5, 24, 300, 600).lost_h == pytest.approx(600 / 3600)  # one start-up, no checkpoint


def test_a_limit_shorter_than_a_restart_names_the_partition():
    says = (r"partition debug's time limit of 10 min \(site.yaml: gpus.a100\) is no longer than one start-up "
            r"\(500 s\) and one checkpoint write \(120 s\)")  # fmt: skip
    with pytest.raises(ConfigError, match=says):
        segments(10, 10 / 60, checkpoint_s=120, restart_s=500, partition="debug", where="site.yaml: gpus.a100")


def test_an_unknown_wait_makes_the_calendar_unknown_never_zero():
    s = segments(48, 24, 300, 600)
    assert s.count == 3
    known = Calendar(s, Wait(5.0, "asked"), Wait(2.0, "site"))
    assert known.hours == pytest.approx(5 + s.wall_h + 2 * 2)
    assert known.finish(datetime(2027, 1, 1)) > datetime(2027, 1, 3)
    unknown_first = Calendar(s, Wait(None, "no estimate"), Wait(2.0, "site"))
    assert unknown_first.hours is None and unknown_first.finish(datetime(2027, 1, 1)) is None
    assert Calendar(s, Wait(1.0, "asked"), Wait(None, "no estimate")).hours is None
    one = segments(10, 24, 300, 600)  # one segment: the requeue wait does not matter
    assert Calendar(one, Wait(1.0, "asked"), Wait(None, "no estimate")).hours == pytest.approx(1 + one.wall_h)
    assert Wait(None, "x").text() == "wait unknown"
    assert Calendar(one, NO_QUEUE, NO_QUEUE).hours == pytest.approx(one.wall_h)


@pytest.mark.parametrize(
    ("value", "hours"),
    [("UNLIMITED", None), ("INFINITE", None), ("30", 0.5), ("30:00", 0.5), ("1:30:00", 1.5), ("2-00:00:00", 48.0),
     ("1-12", 36.0), ("1-12:30", 36.5), ("0:45", 0.75 / 60)],
)  # fmt: skip
def test_slurm_time_limits_in_hours(value, hours):
    got = max_time_hours(value)
    assert got == (None if hours is None else pytest.approx(hours))


def test_a_malformed_time_limit_is_an_error():
    with pytest.raises(ValueError, match="not a SLURM time"):
        max_time_hours("a day")


def test_sbatch_test_only_gives_the_expected_start():
    now = datetime(2026, 12, 3, 12, 0, 0)
    out = "sbatch: Job 4242 to start at 2026-12-03T15:30:00 using 2 processors on nodes node-a100 in partition a100"
    w = expected_start(out, now)
    assert w.hours == pytest.approx(3.5) and "2026-12-03T15:30:00" in w.how
    assert expected_start(out.replace("15:30", "11:00"), now).hours == 0.0  # already free: no wait
    none = expected_start("sbatch: error: Batch job submission failed: Requested node configuration is not available",
                          now)  # fmt: skip
    assert none.hours is None and "Requested node configuration" in none.how
