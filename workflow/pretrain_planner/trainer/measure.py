"""Find the largest micro-batch that fits, then time whole optimizer steps honestly.

Honest means: every timed region is bounded by device synchronisation; warm-up steps (compile,
autotune, allocator growth) are dropped; a step is a whole optimizer step with its real gradient
accumulation and the gradient synchronisation where it happens; each step's time is the slowest rank's;
the median is reported with p10/p90. Batches are made before timing, so no data work is timed. The timed steps
run on the one training loop (trainer.loop, as the budget and train stages do), so the step measured is the step
that trains.

The search runs on scratch instances of the trained model (`build(micro_batch, accum)`; DeepSpeed needs
one per micro-batch size); the timed steps run on a fresh instance, so every method starts timing from
the same initial weights. Each trial and the timing run under `oom.guarded`: an out-of-memory error on
any rank is every rank's verdict, and all go on with the next smaller micro-batch together. FSDP2 tries a size
with one reduce-scatter per step first and, if that ran out of memory while holding the accumulated unsharded
gradients, the same size with one per micro-batch (`grad_sync`).

fp16: a step the loss scaler skipped (inf/nan gradients: no optimizer step, under ZeRO-Offload no CPU Adam)
is much shorter than a real one. It is never timed: it is counted (`skipped_steps`) and another step runs
instead; each timed step records the loss scale it ran with.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as torch_dist

from pretrain_planner.launch import progress
from pretrain_planner.planning.grid import largest_micro_batch
from pretrain_planner.trainer.config import RunConfig
from pretrain_planner.trainer.loop import Hooks, Loop
from pretrain_planner.trainer.oom import Verdict, free_memory, guarded, is_oom
from pretrain_planner.trainer.rank import RankEnv
from pretrain_planner.trainer.ranks import Ranks
from pretrain_planner.trainer.step import ACCUMULATING, TrainStep
from pretrain_planner.trainer.tasks import synthetic_batch

BATCH_POOL = 2  # distinct micro-batches cycled through a step (bounded memory for image models)
MAX_SKIPPED = 24  # steps the fp16 loss scaler may skip while timing (2^16 backs off to 1 in 16)
Builder = Callable[[int, int], TrainStep]  # (micro_batch, accumulation) -> a fresh step

__all__ = ["BATCH_POOL", "Builder", "find_micro_batch", "is_oom", "measure", "time_steps"]


def micro_batch_candidates(per_rank_batch: int, cap: int | None) -> list[int]:
    """Powers of two from the largest allowed (grid.largest_micro_batch) down to 1."""
    top = largest_micro_batch(per_rank_batch, cap)
    out = []
    while top >= 1:
        out.append(top)
        top //= 2
    return out


def batches_for(cfg: RunConfig, env: RankEnv, micro_batch: int, count: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(cfg.bench.seed * 1000 + env.rank)
    return [
        {k: v.to(env.device, non_blocking=True) for k, v in synthetic_batch(cfg.model, micro_batch, gen).items()}
        for _ in range(count)
    ]


@dataclass
class Search:
    micro_batch: int | None
    trials: list[dict[str, Any]] = field(default_factory=list)
    grad_sync: str | None = None  # FSDP2: the gradient synchronisation that fitted ("last" or "every")
    trial_micro_s: tuple[float, float] | None = None  # the fitting trial's first and last micro-batch seconds


def _close(env: RankEnv, step: TrainStep | None) -> None:
    if step is not None:
        step.close()
    free_memory(env)


def _trial_entry(micro_batch: int, verdict: Verdict, seconds: float, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"micro_batch": micro_batch, "fits": not verdict.oom, **extra, "seconds": round(seconds, 4)}
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
    options: tuple[str, ...] = ()  # the gradient synchronisations the method offers (FSDP2: last, every)
    try:
        for micro_batch in candidates if start is None else [c for c in candidates if c < start]:
            sync_modes: list[str | None] = [None]
            while sync_modes:
                sync = sync_modes.pop(0)
                t0 = time.perf_counter()

                def trial(micro_batch: int = micro_batch, sync: str | None = sync) -> None:
                    nonlocal step, options
                    if step is None or not step.accepts(micro_batch):
                        _close(env, step)
                        step = None
                        step = build(micro_batch, per_rank // micro_batch)
                    options = step.grad_sync_options()
                    if sync is not None:
                        step.set_grad_sync(sync)
                    batch = batches_for(cfg, env, micro_batch, 1)
                    step.trial(batch[0], env.distributed, accumulates=per_rank // micro_batch > 1)

                verdict = guarded(env, trial)
                used = sync or (options[0] if options else None)
                extra = {"grad_sync": used} if used else {}
                search.trials.append(_trial_entry(micro_batch, verdict, time.perf_counter() - t0, **extra))
                k, fits = len(search.trials), "OOM" if verdict.oom else "fits"
                progress.mark(k, f"micro-batch search trial {k}: micro-batch {micro_batch} {fits}"
                              + (f" (gradient sync {used})" if used else ""), always=True)  # fmt: skip
                if verdict.oom:
                    phase = step.trial_phase if step is not None else 0
                    step = _after_oom(env, verdict, step)
                    # a step with accumulation that ran out of memory while holding its accumulated (unsharded)
                    # gradients: try the same size with one reduce-scatter per micro-batch
                    # (a collective: its condition must not depend on what this rank managed to build)
                    if sync is None and per_rank // micro_batch > 1 and env.distributed:
                        mine = len(options) > 1 and env.rank in verdict.ranks and phase >= ACCUMULATING
                        if _agree_any(env, mine):  # a rank got that far: every rank built the step, has options
                            sync_modes = list(options[1:])
                    continue
                search.micro_batch, search.grad_sync = micro_batch, used
                search.trial_micro_s = step.trial_micro_s if step is not None else None
                break
            if search.micro_batch is not None:
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
    loss_scales: list[float | None] = field(default_factory=list)  # per timed step: the scale it ran with
    skipped_before: list[int] = field(default_factory=list)  # per timed step: skipped steps just before it
    skipped_steps: int = 0  # steps the loss scaler skipped (warm-up and timing), none of them timed
    collectives: dict[str, int] | None = None  # c10d collectives in one whole step (the last warm-up step)
    data_s: float | None = None  # making the batches this timing cycles through (the device synchronised)
    first_step_s: float | None = None  # the first step of this timing (the slowest rank's): compile, warm-up

    @property
    def median(self) -> float:
        return statistics.median(self.step_times)

    @property
    def spread(self) -> float:
        """p90/p10 of the timed steps: how far this timing can be trusted (1.0 = every step alike)."""
        p10 = percentile(self.step_times, 0.1)
        return percentile(self.step_times, 0.9) / p10 if p10 > 0 else float("inf")


def _test_jitter() -> tuple[float, bool, str] | None:
    """Test hook PP_TEST_JITTER="<seconds>[x]:<first|all>": every other timed step sleeps that long inside the
    timed region, in the first timing only or in every timing (a noisy machine, made to order). With `x` the delay
    is that multiple of the undisturbed step before it, so the spread it makes is the same on any CPU."""
    raw = os.environ.get("PP_TEST_JITTER")
    if not raw:
        return None
    delay, _, which = raw.partition(":")
    relative = delay.endswith("x")
    return float(delay.rstrip("x")), relative, which or "all"


def count_collectives(fn: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    """Run `fn` under the profiler (CPU events only) and count the c10d collectives it issued, by kind."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn()
    kinds = {"reduce_scatter": "reduce_scatter", "allreduce": "all_reduce", "allgather": "all_gather",
             "broadcast": "broadcast"}  # fmt: skip
    counts: dict[str, int] = {}
    for ev in prof.events():
        if not ev.name.startswith("c10d::"):
            continue
        kind = next((v for k, v in kinds.items() if k in ev.name), "other")
        counts[kind] = counts.get(kind, 0) + 1
    return out, counts


def _agree_any(env: RankEnv, flag: bool) -> bool:
    """Whether `flag` holds on any rank (a MAX all-reduce): every rank decides alike."""
    if not env.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=env.device)
    torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
    return bool(t.item())


def _agree_skipped(env: RankEnv, skipped: bool) -> bool:
    """Every rank's loss scaler decides alike (the gradients, or their inf flags, are reduced); made sure of,
    so that every rank times the same steps."""
    return _agree_any(env, skipped)


class _TimedHooks(Hooks):
    """The benchmark's run on the one loop: the pre-made synthetic batches in turn, the recipe's learning rate
    (constant), and the PP_TEST_JITTER disturbance inside the timed region when `jitter_now`."""

    def __init__(
        self, batches: list[dict[str, torch.Tensor]], lr: float, jitter: tuple[float, bool, str] | None
    ) -> None:
        self.batches, self.lr_value, self.jitter = batches, lr, jitter
        self.jitter_now = False
        self.quiet_step_s = 0.0  # the last undisturbed step (a relative jitter's unit)

    def batch_at(self, index: int) -> dict[str, torch.Tensor]:
        return self.batches[index % len(self.batches)]

    def lr(self, state: dict[str, Any]) -> float:
        return self.lr_value

    def in_step(self, state: dict[str, Any]) -> None:
        if self.jitter is not None and self.jitter_now:
            delay, relative, _ = self.jitter
            time.sleep(delay * self.quiet_step_s if relative else delay)


def time_steps(cfg: RunConfig, env: RankEnv, step: TrainStep, micro_batch: int, repeat: int = 0) -> Timing:
    """Warm-up, then `timed_steps` whole optimizer steps on the one training loop (trainer.loop: the step of every
    run), each bounded by device syncs and lasting as long as its slowest rank; steps the fp16 loss scaler skipped
    are not timed (every rank agrees which)."""
    per_rank = cfg.recipe["global_batch"] // cfg.cell.world_size
    accum = per_rank // micro_batch
    env.sync()
    t_data = time.perf_counter()
    batches = batches_for(cfg, env, micro_batch, min(accum, BATCH_POOL))
    env.sync()
    data_s = time.perf_counter() - t_data
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    times: list[float] = []
    losses: list[float] = []
    scales: list[float | None] = []
    skipped_before: list[int] = []
    skipped = since = 0
    collectives: dict[str, dict[str, int]] = {}
    warmup = cfg.bench.warmup_steps
    attempt = 0
    first_step_s: float | None = None
    jitter = _test_jitter()
    hooks = _TimedHooks(batches, cfg.recipe["optimizer"]["lr"], jitter)
    loop = Loop.timed(step, Ranks.of(env), hooks, accum, cfg.bench.seed)
    n = cfg.bench.timed_steps
    again = " again (the first timing was spread out)" if repeat else ""
    plan = f"timing micro-batch {micro_batch} x {accum}{again}: {warmup} warm-up, {n} timed steps"
    progress.mark(0, plan, always=True)

    def counted(work: Callable[[], Any]) -> Any:  # the last warm-up step: which collectives a step runs
        out, collectives["counts"] = count_collectives(work)
        return out

    while len(times) < n and skipped <= MAX_SKIPPED:
        mark = step.overflow_mark()  # host reads stay outside the timed region
        scale = step.loss_scale()
        counting = attempt == warmup - 1 and env.distributed
        hooks.jitter_now = bool(jitter and (jitter[2] == "all" or repeat == 0) and attempt >= warmup and len(times) % 2)
        loop.step([], wrap=counted if counting else None)
        elapsed, loss = loop.last["step_time_s"], loop.last["loss"]
        if first_step_s is None:
            first_step_s = elapsed
        if not hooks.jitter_now:
            hooks.quiet_step_s = elapsed
        attempt += 1
        if mark is not None and _agree_skipped(env, step.was_skipped(mark)):
            skipped += 1
            since += 1
            continue
        if attempt > warmup:
            times.append(elapsed)
            losses.append(float(loss))
            scales.append(scale)
            skipped_before.append(since)
            since = 0
            progress.mark(len(times), f"timed step {len(times)} of {n} ({elapsed:.3g} s)", always=len(times) == n)
        else:
            progress.mark(attempt, f"warm-up step {attempt} of {warmup}")
    if not times:
        raise RuntimeError(
            f"the loss scaler skipped {skipped} steps in a row (inf/nan gradients at every scale): no step to time"
        )
    peak, kind = _peak_memory(env)
    return Timing(times, losses, peak, kind, scales, skipped_before, skipped, collectives.get("counts"), data_s,
                  first_step_s)  # fmt: skip


@dataclass
class Measured:
    micro_batch: int | None  # None: micro-batch 1 does not fit
    timing: Timing | None
    step: TrainStep | None  # the timed instance, still open (the caller closes it)
    trials: list[dict[str, Any]]
    spreads: list[float] = field(default_factory=list)  # p90/p10 of each timing (a second one if the first was noisy)

    @property
    def noisy(self) -> bool:
        return bool(self.spreads) and self.timing is not None and self.timing.spread > self.max_spread

    max_spread: float = float("inf")
    first: Timing | None = None  # the instance's first timing (its first step: compile), also when timed twice
    trial_micro_s: tuple[float, float] | None = None  # the search's fitting trial at this size: first, last micro


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
        micro_batch = search.micro_batch
        held: dict[str, Any] = {}
        t0 = time.perf_counter()

        def timed(
            micro_batch: int = micro_batch, held: dict[str, Any] = held, sync: str | None = search.grad_sync
        ) -> None:
            held["step"] = build(micro_batch, per_rank // micro_batch)
            if sync is not None:
                held["step"].set_grad_sync(sync)
            held["timing"] = time_steps(cfg, env, held["step"], micro_batch)

        verdict = guarded(env, timed)
        if not verdict.oom:
            first = held["timing"]
            spreads = [first.spread]
            if first.spread > cfg.bench.max_spread:  # a disturbed timing: once more, on the same instance

                def again(micro_batch: int = micro_batch, held: dict[str, Any] = held) -> None:
                    held["timing"] = time_steps(cfg, env, held["step"], micro_batch, repeat=1)

                second = guarded(env, again)
                if not second.oom:
                    spreads.append(held["timing"].spread)
                else:  # keep the first timing (still marked noisy); the group may need rebuilding
                    held["timing"] = first
                    if second.group_broken:
                        env.rebuild_group()
            return Measured(micro_batch, held["timing"], held["step"], trials, spreads, cfg.bench.max_spread, first,
                            search.trial_micro_s)  # fmt: skip
        # allocator growth or fragmentation: the trial fitted, the steps did not
        trials.append(_trial_entry(micro_batch, verdict, time.perf_counter() - t0, **{"while": "timing"}))
        _close(env, held.get("step"))
        if verdict.group_broken:
            env.rebuild_group()
        start = micro_batch
