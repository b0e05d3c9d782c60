"""Find the largest micro-batch that fits, then time whole optimizer steps honestly.

Honest means: every timed region is bounded by device synchronisation; warm-up steps (compile,
autotune, allocator growth) are dropped; a step is a whole optimizer step with its real gradient
accumulation and the gradient synchronisation where it happens; each step's time is the slowest rank's;
the median is reported with p10/p90. Batches are made before timing, so no data work is timed.

The search runs on scratch instances of the trained model (`build(micro_batch, accum)`; DeepSpeed needs
one per micro-batch size); the timed steps run on a fresh instance, so every method starts timing from
the same initial weights. Each trial and the timing run under `oom.guarded`: an out-of-memory error on
any rank is every rank's verdict, and all go on with the next smaller micro-batch together.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as torch_dist

from .config import RunConfig
from .models import make_batch
from .oom import Verdict, free_memory, guarded, is_oom
from .parallel import RankEnv
from .step import TrainStep

BATCH_POOL = 2  # distinct micro-batches cycled through a step (bounded memory for image models)
Builder = Callable[[int, int], TrainStep]  # (micro_batch, accumulation) -> a fresh step

__all__ = ["BATCH_POOL", "Builder", "find_micro_batch", "is_oom", "measure", "time_steps"]


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


def _close(env: RankEnv, step: TrainStep | None) -> None:
    if step is not None:
        step.close()
    free_memory(env)


def _trial_entry(mb: int, verdict: Verdict, seconds: float, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"micro_batch": mb, "fits": not verdict.oom, **extra, "seconds": round(seconds, 4)}
    if verdict.oom:
        entry["oom_ranks"] = verdict.ranks
        entry["error"] = verdict.message
    return entry


def _after_oom(env: RankEnv, verdict: Verdict, step: TrainStep | None) -> TrainStep | None:
    """Free the memory. A one-rank model without sharding is kept for the next size (a compiled graph
    too); otherwise the model goes (FSDP or ZeRO state may be half-way through a step) and, if the
    process group was aborted, every rank joins a fresh one."""
    if step is not None and not verdict.group_broken and not step.applied.sharded:
        step.reset_after_trial()
        free_memory(env)
        return step
    _close(env, step)
    if verdict.group_broken:
        env.rebuild_group()
    return None


def find_micro_batch(cfg: RunConfig, env: RankEnv, build: Builder, start: int | None = None) -> Search:
    """Largest power-of-two micro-batch (below `start`) for which a step's peak fits on every rank.

    Each trial (`TrainStep.trial`) reproduces a step's peak; building the model is part of the first
    trial, so a model that does not fit at all is an OOM too. All ranks agree through `oom.guarded`.
    """
    per_rank = cfg.recipe["global_batch"] // cfg.cell.world_size
    search = Search(None)
    candidates = micro_batch_candidates(per_rank, cfg.bench.max_micro_batch)
    step: TrainStep | None = None
    try:
        for mb in candidates if start is None else [c for c in candidates if c < start]:
            t0 = time.perf_counter()

            def trial(mb: int = mb) -> None:
                nonlocal step
                if step is None or not step.accepts(mb):
                    _close(env, step)
                    step = None
                    step = build(mb, per_rank // mb)
                batch = batches_for(cfg, env, mb, 1)
                step.trial(batch[0], env.distributed)

            verdict = guarded(env, trial)
            search.trials.append(_trial_entry(mb, verdict, time.perf_counter() - t0))
            if verdict.oom:
                step = _after_oom(env, verdict, step)
                continue
            search.micro_batch = mb
            break
    finally:
        _close(env, step)
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


@dataclass
class Measured:
    micro_batch: int | None  # None: micro-batch 1 does not fit
    timing: Timing | None
    step: TrainStep | None  # the timed instance, still open (the caller closes it)
    trials: list[dict[str, Any]]


def measure(cfg: RunConfig, env: RankEnv, build: Builder) -> Measured:
    """Search, then time on a fresh instance; an OOM while timing resumes the search below that size."""
    per_rank = cfg.recipe["global_batch"] // cfg.cell.world_size
    trials: list[dict[str, Any]] = []
    start = None
    while True:
        search = find_micro_batch(cfg, env, build, start)
        trials.extend(search.trials)
        if search.micro_batch is None:
            return Measured(None, None, None, trials)
        mb = search.micro_batch
        held: dict[str, Any] = {}
        t0 = time.perf_counter()

        def timed(mb: int = mb, held: dict[str, Any] = held) -> None:
            held["step"] = build(mb, per_rank // mb)
            held["timing"] = time_steps(cfg, env, held["step"], mb)

        verdict = guarded(env, timed)
        if not verdict.oom:
            return Measured(mb, held["timing"], held["step"], trials)
        # allocator growth or fragmentation: the trial fitted, the steps did not
        trials.append(_trial_entry(mb, verdict, time.perf_counter() - t0, **{"while": "timing"}))
        _close(env, held.get("step"))
        if verdict.group_broken:
            env.rebuild_group()
        start = mb
