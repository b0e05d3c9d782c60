"""Budget stage: the time-based schedule (learning rate, validation points, early stop) depends on time only."""

from __future__ import annotations

import pytest
from pretrain_planner.planning.configtypes import BudgetValidation
from pretrain_planner.trainer import schedule

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
    v = BudgetValidation(every=0.1, dense_every=0.0025, dense_first=0.05, dense_last=0.01, max_samples=1, rotate=True)
    pts = schedule.validation_points(v)
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


def test_the_reference_early_stop_counts_minutes_strictly():
    """run_pretraining.py check_if_early_stop: stop when more than early_stop_time minutes passed and the eval loss
    is above early_stop_eval_loss (not <= 6 after 180 minutes); a NaN eval loss stops at any time."""
    markers = [{"after_minutes": 180, "max_loss": 6.0}]
    assert schedule.early_stop(markers, 0.5, 6.5, elapsed_s=180 * 60) is None  # not yet more than 180 minutes
    assert "more than 180 minutes" in schedule.early_stop(markers, 0.5, 6.5, elapsed_s=180 * 60 + 1)
    assert schedule.early_stop(markers, 0.5, 6.0, elapsed_s=200 * 60) is None  # <= 6 is fine
    assert schedule.early_stop(markers, 0.01, float("nan"), elapsed_s=60) == "nan validation loss"


def test_loss_scale_floor_rule():
    """fp16 (the reference's scale_cnt_limit): steps in a row with the scale at or below the floor; the count
    restarts when the scale rises above it; no scaler (bf16 / fp32) never counts."""
    count, why = 0, None
    for scale in [65536.0, 2.0, 1.0, 1.0, 0.5]:
        count, why = schedule.loss_scale_floor(scale, count, 1.0, 3)
    assert count == 3 and why == "loss scale stuck at its floor: 0.5 <= 1 for 3 steps in a row"
    count = 0
    for scale in [1.0, 1.0, 2.0, 1.0, 1.0]:
        count, why = schedule.loss_scale_floor(scale, count, 1.0, 3)
        assert why is None
    assert count == 2
    assert schedule.loss_scale_floor(None, 99, 1.0, 3) == (0, None)
    assert schedule.loss_scale_floor(1.0, 99, 1.0, 100)[1] is not None  # the reference's limit: 100
    assert schedule.nonfinite_loss(float("inf"), 7) == "non-finite loss: inf at step 7"
    assert schedule.nonfinite_loss(3.2, 7) is None
