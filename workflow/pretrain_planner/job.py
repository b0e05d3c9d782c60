"""The callables a job runs on every rank (a benchmark cell, a budget-stage job). Picklable and torch-free
until called."""

from __future__ import annotations

from typing import Any

import submitit


class CellJob(submitit.helpers.Checkpointable):
    """Measure one cell. On preemption or time-out submitit calls `checkpoint`, which (inherited)
    requeues this same callable: a benchmark restarts cleanly from its first step."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def __call__(self) -> dict[str, Any]:
        from .trainer.run import run_rank  # torch is imported here, on the compute side only

        return run_rank(self.spec)


class BudgetJob(submitit.helpers.Checkpointable):
    """One job of the budget stage on every rank: `pretrain` (the time-budgeted run) or `finetune` (a GLUE
    task). On preemption or time-out the pre-training finishes its step and writes a checkpoint first
    (budget.pretrain chains submitit's handler), then submitit requeues this callable, which resumes."""

    def __init__(self, entry: str, kwargs: dict[str, Any]) -> None:
        if entry not in ("pretrain", "finetune"):
            raise ValueError(f"unknown budget job {entry!r}")
        self.entry, self.kwargs = entry, kwargs

    def __call__(self) -> Any:
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if self.entry == "pretrain":
            from .budget.pretrain import pretrain  # torch is imported here, on the compute side only

            return pretrain(**self.kwargs)
        from .budget.glue import finetune

        return finetune(**self.kwargs)
