"""Budget stage: the time-based schedule (learning rate, validation points, early stop) depends on time only."""

from __future__ import annotations

import pytest
from pretrain_planner.budget import schedule

PEAK, BUDGET, WARM = 1e-3, 24 * 3600.0, 0.06


def test_lr_at_fixed_elapsed_times():
    assert schedule.lr_at(0.0, BUDGET, PEAK, WARM) == 0.0
    assert schedule.lr_at(0.03 * BUDGET, BUDGET, PEAK, WARM) == pytest.approx(PEAK / 2)
    assert schedule.lr_at(WARM * BUDGET, BUDGET, PEAK, WARM) == pytest.approx(PEAK)  # warm-up peak
    assert schedule.lr_at(0.53 * BUDGET, BUDGET, PEAK, WARM) == pytest.approx(PEAK / 2)  # half-way down the decay
    assert schedule.lr_at(0.5 * BUDGET, BUDGET, PEAK, WARM) == pytest.approx(PEAK * 0.5 / 0.94)
    assert schedule.lr_at(BUDGET, BUDGET, PEAK, WARM) == 0.0  # end of the budget
    assert schedule.lr_at(2 * BUDGET, BUDGET, PEAK, WARM) == 0.0


def test_lr_is_independent_of_the_step_rate():
    # a slow and a fast run (10 s vs 0.5 s per step) have the same lr whenever the elapsed time is the same
    slow = {10.0 * k: schedule.lr_at(10.0 * k, 3000, PEAK, WARM) for k in range(301)}
    fast = {0.5 * k: schedule.lr_at(0.5 * k, 3000, PEAK, WARM) for k in range(6001)}
    for t, lr in slow.items():
        assert fast[t] == pytest.approx(lr)
    assert max(slow.values()) == pytest.approx(PEAK)


def test_validation_is_denser_early_and_late():
    pts = schedule.validation_points({"every": 0.1, "dense_every": 0.0025, "dense_first": 0.05, "dense_last": 0.01})
    assert pts == sorted(pts) and pts[-1] == 1.0 and pts[0] > 0
    first = [p for p in pts if p <= 0.05]
    middle = [p for p in pts if 0.05 < p < 0.99]
    last = [p for p in pts if p >= 0.99]
    assert len(first) == 20 and len(last) == 5 and 8 <= len(middle) <= 10
    assert schedule.next_after(pts, 0.0) == 0
    assert pts[schedule.next_after(pts, 0.05)] > 0.05
    assert schedule.next_after(pts, 1.0) == len(pts)


def test_early_stop_markers():
    markers = [{"at_fraction": 0.125, "max_loss": 6.0}]  # the recipe: not <= 6 after 180 of 1440 minutes
    assert schedule.early_stop(markers, 0.1, 9.0) is None  # before the marker
    assert schedule.early_stop(markers, 0.2, 5.9) is None
    assert "early stop" in schedule.early_stop(markers, 0.2, 6.5)
    assert schedule.early_stop(markers, 0.2, None) is None
