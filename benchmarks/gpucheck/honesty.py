"""Timing honesty: the "$100K" benchmark's timer against ours, on the same model, optimizer and batch.

Reference: 1 warm-up + 3 steps of ONE micro-batch each, perf_counter around forward/backward and around the
optimizer step, no device synchronisation; step = mean(micro) x accum + mean(optimizer). The same loop with
synchronisation, then our measurement: whole synchronised `accum`-micro-batch steps (trainer.measure.time_steps),
warm-up dropped, median. Settings as in the H200 reference harness (reference_h200.json): SDPA, bf16 autocast,
fused AdamW (on CUDA), TF32, no compile. On a CPU there is no asynchronous queue to hide work: the comparison means
something on a GPU only.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from pretrain_planner.planning.catalog import Catalog

from .cells import Settings, folder_of, make_spec, recorded
from .plans import Plan

ACCUM, REPS = 8, 3


def _reference_loop(step, batch, env, accum: int, reps: int, sync: bool) -> dict[str, Any]:
    """The "$100K" timer: 1 warm-up + `reps` steps of one micro-batch; optionally synchronised."""
    micro, opt = [], []
    env.sync()
    for i in range(1 + reps):
        if sync:
            env.sync()
        t0 = time.perf_counter()
        step.micro(batch, 1.0 / accum, sync_grads=True)
        if sync:
            env.sync()
        t1 = time.perf_counter()
        step.optimizer_step()
        if sync:
            env.sync()
        t2 = time.perf_counter()
        if i >= 1:
            micro.append(t1 - t0)
            opt.append(t2 - t1)
    env.sync()  # let queued work finish before the next measurement starts
    return {"step_s": statistics.mean(micro) * accum + statistics.mean(opt), "micro_s": micro, "optimizer_s": opt}


def _measure(cfg, env, mb: int) -> dict[str, Any]:
    import torch
    from pretrain_planner.trainer import methodbuild
    from pretrain_planner.trainer.measure import batches_for, time_steps

    torch.manual_seed(0)
    # the one build path (trainer/methodbuild.py), as a cell builds its step
    built = methodbuild.build(cfg.run_spec(env), env, mb, 1, 0, attn="sdpa", lr_every_step=False,
                              lr_schedule="constant (the timing-honesty check)")  # fmt: skip
    step = built.step
    batch = batches_for(cfg, env, mb, 1)[0]
    out: dict[str, Any] = {"method_settings": built.settings}
    # the reference runs first, on the fresh model, as it would in the reference benchmark
    out["reference_unsynchronised"] = _reference_loop(step, batch, env, ACCUM, REPS, sync=False)
    out["reference_synchronised"] = _reference_loop(step, batch, env, ACCUM, REPS, sync=True)
    timing = time_steps(cfg, env, step, mb)
    out["actual"] = {
        "step_s": timing.median,
        "step_times_s": timing.step_times,
        "warmup_steps": cfg.bench.warmup_steps,
        "peak_mem_gib": timing.peak_mem_gib,
    }
    out["error_unsynchronised"] = out["reference_unsynchronised"]["step_s"] / timing.median - 1
    out["error_synchronised"] = out["reference_synchronised"]["step_s"] / timing.median - 1
    return out


def run_honesty(plan: Plan, catalog: Catalog, s: Settings) -> dict[str, Any]:
    """The check as a record: status ok with `honesty` (the three timers), or error with the traceback."""
    from pretrain_planner.trainer.config import RunConfig
    from pretrain_planner.trainer.rank import close_rank, init_rank

    mb = s.honesty_micro_batch or plan.cap
    rec: dict[str, Any] = {"label": plan.label, "plan": plan.to_json(), "status": None}
    cell = Plan(plan.label, plan.model, "fl", mb, global_batch=mb * ACCUM)
    spec, override = make_spec(cell, catalog, s, folder_of(s, plan.label))
    spec["compile_model"] = False  # the reference harness's "eager"
    spec["model"]["recipe"]["precision"] = "bf16"  # as the reference harness (the 410M recipe is fp16 + GradScaler)
    h: dict[str, Any] = {
        "model": plan.model,
        "micro_batch": mb,
        "accum": ACCUM,
        "reference_steps": f"1 warm-up + {REPS}",
        "settings": "fl without compile (SDPA, TF32 on GPU, fused AdamW on GPU), bf16 autocast, grad clip 1.0",
    }
    rec["override"] = {
        **override,
        "precision": f"bf16 (recipe: {catalog.model(plan.model).recipe.precision})",
        "compile": False,
    }
    rec["honesty"] = h
    with recorded(rec):
        cfg = RunConfig.from_spec(spec)
        env = init_rank(cfg)
        try:
            h.update(_measure(cfg, env, mb))
        finally:
            close_rank(env)
        rec["status"] = "ok"
    return rec
