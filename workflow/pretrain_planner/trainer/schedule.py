"""Schedules of a run that trains for real: what happens when, as a function of progress. Imports no torch.

- `recipe_lr`: the catalog recipes' schedules (constant, linear, cosine, time-linear) for the train stage, keyed
  on steps or on time (progress = step / steps, or elapsed time / time budget);
- a time budget's (the budget stage's; progress = elapsed time / time budget, never steps; the elapsed time is
  train.clock's: wall time since the run's start, the reference's, or training time): the learning rate
  (`lr_at`: linear warm-up over `warmup_fraction` of the budget, then linear decay to 0 at the end, or the
  reference's exp curve), validation points (every `dense_every` in the first `dense_first` and last
  `dense_last` of the budget, every `every` in between, and at the end), early-stop markers and fine-tuning
  checkpoints (fractions of the budget), and the stops on a non-finite loss or a loss scale at its floor.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pretrain_planner.planning.configtypes import BudgetValidation


def budget_seconds(hours: float) -> float:
    """A time budget in hours as seconds, rounded to the microsecond. `hours * 3600` alone is not exact for most
    budgets (511 / 3600 h -> 511.00000000000006 s), and a run on the fake clock (1 s steps) then takes one step
    more than its budget holds (512 of 511: seen in CI's chaos soak); a microsecond is far below any step."""
    return round(float(hours) * 3600.0, 6)


def lr_factor(progress: float, warmup_fraction: float) -> float:
    """Multiplier of the peak learning rate at `progress` in [0, 1]: 0 -> 1 at warm-up's end -> 0 at 1."""
    p = min(max(progress, 0.0), 1.0)
    if warmup_fraction > 0 and p < warmup_fraction:
        return p / warmup_fraction
    return max(0.0, (1.0 - p) / (1.0 - warmup_fraction))


def exp_factor(
    progress: float, warmup_fraction: float, budget_h: float, decay_rate: float, decay_step_h: float
) -> float:
    """The reference's `exp` curve (pretraining/schedules.py ExpCurve under its time scheduler): a quadratic
    warm-up, then decay_rate ** (hours since warm-up's end / decay_step_h) - no decay to 0 at the end."""
    p = min(max(progress, 0.0), 1.0)
    if warmup_fraction > 0 and p < warmup_fraction:
        return (p / warmup_fraction) ** 2
    return decay_rate ** ((p - warmup_fraction) * budget_h / decay_step_h)


def lr_at(elapsed_s: float, budget_s: float, peak_lr: float, warmup_fraction: float, tr: dict | None = None) -> float:
    """The learning rate after `elapsed_s` of a `budget_s` budget, on the curve of `tr` (train.curve: linear,
    the recipe's, or exp with train.decay_rate / train.decay_step_hours)."""
    progress = elapsed_s / budget_s
    if tr is not None and tr.get("curve", "linear") == "exp":
        return peak_lr * exp_factor(progress, warmup_fraction, budget_s / 3600.0, tr["decay_rate"],
                                    tr["decay_step_hours"])  # fmt: skip
    return peak_lr * lr_factor(progress, warmup_fraction)


def validation_points(v: BudgetValidation) -> list[float]:
    """Sorted fractions of the budget at which validation runs (the last is 1.0): the budget file's
    train.validation, typed."""
    pts: set[float] = set()

    def grid(start: float, stop: float, step: float) -> None:
        k = 1
        while start + k * step < stop - 1e-12:
            pts.add(round(start + k * step, 9))
            k += 1

    first, last = min(v.dense_first, 1.0), max(1.0 - v.dense_last, 0.0)
    grid(0.0, first, v.dense_every)
    if first > 0:
        pts.add(round(first, 9))
    grid(first, last, v.every)
    pts.add(round(last, 9))
    grid(last, 1.0, v.dense_every)
    pts.add(1.0)
    return sorted(p for p in pts if 0 < p <= 1.0)


def next_after(points: list[float], progress: float) -> int:
    """Index of the first point strictly after `progress` (len(points) when none)."""
    for i, p in enumerate(points):
        if p > progress + 1e-12:
            return i
    return len(points)


def early_stop(
    markers: list[dict[str, float]], progress: float, last_val_loss: float | None, elapsed_s: float | None = None
) -> str | None:
    """The reason to stop after a validation: its loss is NaN (the reference's check_if_early_stop), or a passed
    marker's threshold is exceeded - `at_fraction` of the budget reached, or more than `after_minutes` elapsed
    (the reference's rule: eval loss > early_stop_eval_loss once more than early_stop_time minutes passed)."""
    if last_val_loss is None:
        return None
    if math.isnan(last_val_loss):
        return "nan validation loss"
    for m in markers:
        if "after_minutes" in m:
            passed = elapsed_s is not None and elapsed_s / 60.0 > m["after_minutes"]
            when = f"after more than {m['after_minutes']:g} minutes"
        else:
            passed = progress >= m["at_fraction"]
            when = f"after {m['at_fraction']:.3f} of the budget"
        if passed and last_val_loss > m["max_loss"]:
            return f"early stop: validation loss {last_val_loss:.4f} > {m['max_loss']} {when}"
    return None


def nonfinite_loss(loss: float, step: int) -> str | None:
    """The reason to stop when a step's loss (the mean over ranks) is NaN or infinite."""
    if math.isfinite(loss):
        return None
    return f"non-finite loss: {loss} at step {step}"


def loss_scale_floor(scale: float | None, count: int, floor: float, limit: int) -> tuple[int, str | None]:
    """fp16's diverged-model stop (the reference's scale_cnt_limit): the count of optimizer steps in a row whose
    loss scale is at or below `floor` after this step's `scale` (None: no loss scaler, never counts), and the
    reason to stop once it reaches `limit`. The reference counts steps at DeepSpeed's min_loss_scale 1 within
    one data shard; here the count restarts when the scale rises above the floor."""
    if scale is None:
        return 0, None
    count = count + 1 if scale <= floor else 0
    if count >= limit:
        return count, f"loss scale stuck at its floor: {scale:g} <= {floor:g} for {count} steps in a row"
    return count, None


def recipe_lr(sched: dict[str, Any], peak_lr: float, step: int, progress: float, total_steps: int | None) -> float:
    """The learning rate of a catalog recipe's schedule (config/models.yaml `recipe.schedule`: constant, linear,
    cosine, time-linear; warmup_steps or warmup_fraction; min_lr_ratio or min_lr) before optimizer step `step`
    (0-based) at `progress` in [0, 1] (step / total steps, or elapsed time / time budget). Warm-up is linear from
    0, over `warmup_steps` steps or `warmup_fraction` of progress; then constant, linear to 0 (linear,
    time-linear) or a cosine to the floor (min_lr, or min_lr_ratio x peak, else 0). Under a time budget
    (`total_steps` None) a warm-up given in steps counts steps and the decay follows time."""
    name = sched.get("name", "constant")
    p = min(max(progress, 0.0), 1.0)
    floor = sched.get("min_lr")
    if floor is None:
        floor = peak_lr * float(sched.get("min_lr_ratio") or 0.0)
    w_steps, w_frac = sched.get("warmup_steps"), sched.get("warmup_fraction")
    if w_steps:
        if step < w_steps:
            return peak_lr * step / w_steps
        start = w_steps / total_steps if total_steps else 0.0
    elif w_frac:
        if p < w_frac:
            return peak_lr * p / w_frac
        start = w_frac
    else:
        start = 0.0
    if name == "constant":
        return peak_lr
    q = min(max((p - start) / (1.0 - start), 0.0), 1.0) if start < 1.0 else 1.0  # decay progress
    if name in ("linear", "time-linear"):
        return peak_lr * (1.0 - q)
    if name == "cosine":
        return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * q))
    raise ValueError(f"unknown schedule {name!r} (allowed: constant, linear, cosine, time-linear)")
