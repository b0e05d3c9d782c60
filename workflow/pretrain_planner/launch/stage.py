"""Launching a stage's job (benchmark cells, the train stage, the budget stage's pre-training and GLUE).

`torch_job`: the jobs of one Snakemake process (--force-use-threads) share torch's global RNG and thread settings,
so a torch job run in the driver's process (the debug launcher, or a test calling a stage function) takes its
turn (TORCH_LOCK), deterministic given its seed; a process group it leaves behind is destroyed at its end.
Imports no torch.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

TORCH_LOCK = threading.RLock()


@contextlib.contextmanager
def torch_job() -> Iterator[None]:
    """A torch job of this process: one at a time (TORCH_LOCK); a process group it leaves behind (a failed run's,
    or a one-rank sharded run's in-process group) is destroyed at its end."""
    with TORCH_LOCK:
        try:
            yield
        finally:
            import torch.distributed as torch_dist  # a torch job's, at run time: this module imports no torch

            if torch_dist.is_available() and torch_dist.is_initialized():
                torch_dist.destroy_process_group()
