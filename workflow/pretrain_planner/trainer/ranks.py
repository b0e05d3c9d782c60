"""A data-parallel run's ranks for the loop (trainer/loop.py): this process's place in the run, started from
submitit's environment (the local and SLURM launchers), from torchrun's (RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT), or alone; a sharded method on one rank gets an in-process group. After each step the
ranks agree on its time (the slowest rank's) and on any stop signal, so schedules keyed on time and the stop are
the same everywhere. A benchmark cell's ranks are trainer/rank.py's (`Ranks.of`).
"""

from __future__ import annotations

import os
from typing import Any

import torch


def env_world() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) from torchrun's environment, or None when it is not there."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    return None


def _submitit_tasks() -> int:
    """The tasks of the submitit job this process is one of (a run whose world size is the job's: the train stage)."""
    import submitit

    return int(submitit.JobEnvironment().num_tasks)


class Ranks:
    """This process's place in the data-parallel run: rank, world size, device, and the few collectives the loop
    needs (agreeing on elapsed time, on a stop signal, and the mean loss). One rank: no process group, unless a
    sharded method needs one (`group_for_one`).

    `world_size`: the ranks the run needs (None: as many as the environment says: the submitit job's tasks,
    torchrun's, or one).
    `device_of(local_rank)`: this rank's device."""

    def __init__(self, world_size: int | None, device_of, group_for_one: bool = False) -> None:
        import datetime as dt

        import torch.distributed as torch_dist

        self.rank, self.world, self.local_rank = 0, 1, 0
        self.backend: str | None = None
        self.launched_by = "single process"
        self._env_set: list[str] = []  # variables this process's one-rank group set (an in-process run)
        if "SUBMITIT_EXECUTOR" in os.environ and (world_size or _submitit_tasks()) > 1:
            from submitit.helpers import TorchDistributedEnvironment

            env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
            self.rank, self.world, self.local_rank = env.rank, env.world_size, env.local_rank
            self.launched_by = "submitit"
        elif (found := env_world()) is not None and found[1] > 1:
            self.rank, self.world, self.local_rank = found
            self.launched_by = "torchrun"
        elif world_size is not None and world_size > 1:
            raise RuntimeError(f"{world_size} ranks: run through the local or slurm launcher, or torchrun")
        if world_size is not None and self.world != world_size:
            raise RuntimeError(f"launched with {self.world} tasks, the setting needs {world_size}")
        self.device = device_of(self.local_rank)
        if self.world > 1 or group_for_one:
            from pretrain_planner.trainer.rank import eager_init_kwargs, one_rank_environment, process_group_backend

            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            # the trainer's: NCCL + gloo on GPUs (FSDP2 offload's CPU gradient norms), communicators made eagerly
            backend = process_group_backend(self.device)
            if self.world > 1:
                torch_dist.init_process_group(
                    backend, timeout=dt.timedelta(minutes=30), **eager_init_kwargs(self.device, self.world)
                )
            else:  # FSDP's mesh and DeepSpeed's engine need a process group even on one rank
                if torch_dist.is_initialized():
                    raise RuntimeError("a sharded method on one rank needs this process's process group: run it "
                                       "through the local or slurm launcher")  # fmt: skip
                self._env_set = one_rank_environment()  # close() takes them back
                torch_dist.init_process_group(backend, store=torch_dist.HashStore(), rank=0, world_size=1)
            self.backend = backend

    @classmethod
    def of(cls, env: Any) -> Ranks:
        """The ranks of a benchmark cell, whose process group trainer.rank set up (and tears down)."""
        ranks = cls.__new__(cls)
        ranks.rank, ranks.world, ranks.local_rank, ranks.device = env.rank, env.world_size, env.local_rank, env.device
        ranks.backend, ranks.launched_by, ranks._env_set = None, "trainer.rank", []
        return ranks

    def env(self):
        """The trainer's view of this rank (trainer.rank.RankEnv)."""
        from pretrain_planner.trainer.rank import RankEnv

        return RankEnv(self.rank, self.world, self.local_rank, self.device, self.backend)

    def _all_reduce(self, values, op: str) -> torch.Tensor:
        """The values (float64, on this rank's device) reduced over the ranks with ReduceOp `op`."""
        import torch.distributed as torch_dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch_dist.all_reduce(t, op=getattr(torch_dist.ReduceOp, op))
        return t

    def max(self, *values: float) -> list[float]:
        """The largest of each value over the ranks (elapsed time: the slowest rank's; a signal: anyone's)."""
        if self.world == 1:
            return list(values)
        return self._all_reduce(values, "MAX").tolist()

    def mean(self, value: float) -> float:
        """The mean over the ranks (the step's loss)."""
        if self.world == 1:
            return value
        return float(self._all_reduce([value], "SUM").item()) / self.world

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as torch_dist

            torch_dist.barrier()

    def close(self) -> None:
        from pretrain_planner.trainer.rank import forget_deepspeed_groups, take_back

        if self.backend is not None:
            import torch.distributed as torch_dist

            if torch_dist.is_initialized():
                torch_dist.destroy_process_group()
            forget_deepspeed_groups()
            self.backend = None
        take_back(self._env_set)
