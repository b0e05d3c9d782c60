"""The callable a train-stage job runs on every rank. Picklable and torch-free until called; `train.jobs` hands it
to the launcher."""

from __future__ import annotations

import os
from typing import Any

from pretrain_planner.launch.rankjob import RankJob


class TrainJob(RankJob):
    """A plan's run on every rank. On pre-emption or time-out the loop finishes its step and checkpoints first
    (trainer.loop chains submitit's handler), then submitit requeues this callable, which resumes."""

    restartable = False  # resumes from its checkpoint: a time-out requeue must show progress (launch/progress.py)

    def __init__(self, plan: str, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.plan, self.kwargs = plan, kwargs

    def run(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from pretrain_planner.train.run import train_plan  # torch is imported here, on the compute side only

        return train_plan(self.plan, **self.kwargs)
