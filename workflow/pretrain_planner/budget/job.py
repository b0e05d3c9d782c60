"""The callable a budget-stage job runs on every rank (the time-budgeted pre-training or a GLUE fine-tune).
Picklable and torch-free until called; `budget.jobs` hands it to the launcher."""

from __future__ import annotations

import os
from typing import Any

from pretrain_planner.launch.rankjob import RankJob


class BudgetJob(RankJob):
    """One job of the budget stage on every rank: `pretrain` (the time-budgeted run) or `finetune` (a GLUE
    task). On preemption or time-out the pre-training finishes its step and writes a checkpoint first
    (budget.pretrain chains submitit's handler), then submitit requeues this callable, which resumes."""

    def __init__(self, entry: str, kwargs: dict[str, Any]) -> None:
        super().__init__()
        if entry not in ("pretrain", "finetune"):
            raise ValueError(f"unknown budget job {entry!r}")
        self.entry, self.kwargs = entry, kwargs
        self.restartable = entry != "pretrain"  # pre-training resumes from its checkpoint

    def run(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if self.entry == "pretrain":
            from pretrain_planner.budget.pretrain import pretrain  # torch is imported here, on the compute side only

            return pretrain(**self.kwargs)
        from pretrain_planner.budget.glue import finetune

        return finetune(**self.kwargs)
