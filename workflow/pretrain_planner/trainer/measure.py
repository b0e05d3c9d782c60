"""Find the largest micro-batch that fits, then time whole optimizer steps honestly.

Honest means: every timed region is bounded by device synchronisation; warm-up steps (compile,
autotune, allocator growth) are dropped; a step is a whole optimizer step with its real gradient
accumulation and the all-reduce only on the last micro-batch; each step's time is the slowest rank's;
the median is reported with p10/p90. Batches are made before timing, so no data work is timed.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as torch_dist

from .config import RunConfig
from .models import make_batch
from .parallel import RankEnv
from .step import TrainStep

BATCH_POOL = 2  # distinct micro-batches cycled through a step (bounded memory for image models)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _any_rank(env: RankEnv, flag: bool) -> bool:
    """True on every rank if `flag` is true on any rank (a collective: all ranks must call it)."""
    if not env.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=env.device)
    torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
    return bool(t.item())


def _free(env: RankEnv) -> None:
    gc.collect()
    if env.device.type == "cuda":
        torch.cuda.empty_cache()


def micro_batch_candidates(per_rank_batch: int, cap: int | None) -> list[int]:
    """Powers of two from the largest allowed down to 1 (per-rank batches are powers of two)."""
    top = per_rank_batch if cap is None else min(per_rank_batch, cap)
    top = 1 << (max(1, top).bit_length() - 1)
    out = []
    while top >= 1:
        out.append(top)
        top //= 2
    return out


def batches_for(cfg: RunConfig, env: RankEnv, micro_batch: int, count: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(cfg.bench.seed * 1000 + env.rank)
    return [
        {k: v.to(env.device, non_blocking=True) for k, v in make_batch(cfg.model, micro_batch, gen).items()}
        for _ in range(count)
    ]


@dataclass
class Search:
    micro_batch: int | None
    trials: list[dict[str, Any]] = field(default_factory=list)


def find_micro_batch(cfg: RunConfig, env: RankEnv, step: TrainStep, start: int | None = None) -> Search:
    """Largest power-of-two micro-batch for which a step's peak fits on every rank.

    The trial reproduces a step's peak: micro-batch, optimizer step (allocates the optimizer state),
    then another micro-batch while that state and the accumulated gradients are held. Its backward runs
    without the gradient all-reduce, so a rank that runs out of memory cannot leave the others waiting
    inside a collective; all ranks then agree through `_any_rank`.
    """
    per_rank = cfg.recipe["global_batch"] // cfg.cell.world_size
    search = Search(None)
    candidates = micro_batch_candidates(per_rank, cfg.bench.max_micro_batch)
    for mb in candidates if start is None else [c for c in candidates if c < start]:
        oom, t0 = False, time.perf_counter()
        try:
            batch = batches_for(cfg, env, mb, 1)
            step.micro(batch[0], 1.0, sync_grads=not env.distributed)
            step.optimizer_step()
            step.micro(batch[0], 1.0, sync_grads=not env.distributed)
            step.micro(batch[0], 1.0, sync_grads=not env.distributed)
            env.sync()
        except Exception as exc:  # only OOM is expected; anything else is a real failure
            if not is_oom(exc):
                raise
            oom = True
        batch = None
        step.reset_after_trial()
        oom = _any_rank(env, oom)
        search.trials.append({"micro_batch": mb, "fits": not oom, "seconds": round(time.perf_counter() - t0, 4)})
        if oom:
            _free(env)
            continue
        search.micro_batch = mb
        break
    return search


def _peak_memory(env: RankEnv) -> tuple[float, str]:
    if env.device.type == "cuda":
        return torch.cuda.max_memory_allocated(env.device) / 2**30, "cuda_max_allocated"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "cpu_process_max_rss"


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 1])."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class Timing:
    step_times: list[float]
    losses: list[float]
    peak_mem_gib: float
    peak_mem_kind: str

    @property
    def median(self) -> float:
        return statistics.median(self.step_times)


def time_steps(cfg: RunConfig, env: RankEnv, step: TrainStep, micro_batch: int) -> Timing:
    per_rank = cfg.recipe["global_batch"] // cfg.cell.world_size
    accum = per_rank // micro_batch
    batches = batches_for(cfg, env, micro_batch, min(accum, BATCH_POOL))
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    times, losses = [], []
    for i in range(cfg.bench.warmup_steps + cfg.bench.timed_steps):
        env.sync()
        t0 = time.perf_counter()
        loss = step(batches, accum)
        env.sync()
        elapsed = time.perf_counter() - t0
        if i >= cfg.bench.warmup_steps:
            times.append(elapsed)
            losses.append(float(loss))
    if env.distributed:  # a step lasts as long as its slowest rank
        t = torch.tensor(times, dtype=torch.float64, device=env.device)
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
        times = t.tolist()
    peak, kind = _peak_memory(env)
    return Timing(times, losses, peak, kind)
