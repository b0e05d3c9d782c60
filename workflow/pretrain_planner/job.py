"""The callable a cell's job runs on every rank. Picklable and torch-free until it is called."""

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
