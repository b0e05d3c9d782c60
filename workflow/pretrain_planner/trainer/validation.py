"""The validation loss of a run that trains for real (the train stage): a held-out slice of the task's data, never
trained on, evaluated under no_grad at a set interval and at the end of the run.

- Held out: the last `holdout(n)` rows of an array-like data set (the causal-LM token blocks, the images): 1%, at
  least one row, none of one row; the training stream samples only the rows before them (trainer/tasks.py). The
  masked LM evaluates its own held-out shards (data/mlm.py's validation split; data/shards.validation_loss).
- Evaluated: the first `batches` micro-batches of the held-out rows, in order, on every rank alike (the same number
  of forwards on every rank, which FSDP2 and ZeRO-3 need; the figure is the same whatever the number of ranks, so
  a resumed run on another launcher or rank count compares), under the method's autocast; the mean of the
  micro-batches' losses (packed blocks and images weigh alike).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

HOLDOUT_SHARE = 0.01  # the share of the rows held out


def holdout(n: int) -> int:
    """How many of `n` rows are held out: 1%, at least one; none when there is a single row (nothing to train)."""
    return 0 if n < 2 else max(1, int(n * HOLDOUT_SHARE))


Evaluate = Callable[[torch.nn.Module, int, int, Any, Any], float]  # (net, micro_batch, batches, device, autocast)


def rows_evaluator(first: int, n: int, get: Callable[[np.ndarray], dict[str, torch.Tensor]]) -> Evaluate | None:
    """An evaluator over rows first..n-1 of a data set (`get(indices)`: their batch, on the CPU); None when none."""
    if n <= first:
        return None

    def evaluate(net: torch.nn.Module, micro_batch: int, batches: int, device: Any, autocast: Any) -> float:
        losses = []
        for b in range(batches):
            lo = first + b * micro_batch
            if lo >= n:
                break
            idx = np.arange(lo, min(n, lo + micro_batch))
            batch = {k: v.to(device, non_blocking=True) for k, v in get(idx).items()}
            with autocast():
                losses.append(float(net(**batch).loss))
        return float(np.mean(losses))

    return evaluate


def validation_loss(evaluate: Evaluate, built: Any, micro_batch: int, batches: int, device: Any) -> float:
    """The held-out loss of the model now: `evaluate` on the model underneath the method (`applied.raw`: sharded
    in place under FSDP2, every rank calls), eval mode and no_grad, the method's autocast; the model back in train
    mode after it."""
    net = built.step.applied.raw
    dtype = built.autocast_dtype

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()

    net.eval()
    try:
        with torch.no_grad():
            return evaluate(net, micro_batch, batches, device, autocast)
    finally:
        net.train()
