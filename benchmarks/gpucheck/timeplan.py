"""The predicted seconds of each cell and each part of the GPU run, so the command can print its time plan before
it starts and set each cell's time cap. Estimates, not measurements: a step's time from the model's declared FLOPs
at an assumed MFU, compile times from the H200 run of 2026-11-29 (reference_h200.json `compile_s`), the rest
(process start, DeepSpeed's import and its cpu_adam build, Liger's Triton compile) rounded guesses, stated here so
that a run's predicted-vs-actual table (the summary) can correct them. Smoke mode (CPU, tiny models): constants
seen on this project's 2-core CI-sized machines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pretrain_planner.planning.catalog import Catalog
from pretrain_planner.planning.flops import param_count, train_flops_per_sample
from pretrain_planner.planning.methods import ZERO_STAGE, parse
from pretrain_planner.planning.settings import compiles

from .cells import Settings
from .plans import REFERENCE, Plan

# assumed MFU of a step (the H200 run: naive 9-32%, fl compiled 36-45%, Liger's fused head 46%)
MFU = {"naive": 0.2, "fl": 0.30, "compiled": 0.38, "levers": 0.45}


@dataclass(frozen=True)
class Machine:
    """The fixed costs of a run's machine, seconds."""

    process_s: float  # a worker's start: import torch and transformers, a CUDA context
    build_s: float  # one instance of a small model
    build_s_per_bparam: float  # + per billion parameters (build, move to the device)
    compile_s: float  # torch.compile of a model without a measured figure: this + compile_s_per_layer x layers
    compile_s_per_layer: float
    deepspeed_s: float  # DeepSpeed's import, once per process
    cpu_adam_build_s: float  # DeepSpeed's cpu_adam JIT build where none is prebuilt, once per process
    liger_s: float  # Liger's Triton kernels compiled on first use
    cell_s: float  # what every cell adds (the attention profile, the report, cleanup)
    multi_rank_s: float  # a two-rank cell: two more processes, a process group and its rebuild
    step_floor_s: float  # the shortest step (launch overheads)


GPU = Machine(12, 2, 3, 25, 1.0, 10, 90, 10, 3, 40, 0.02)
CPU = Machine(6, 0.5, 0, 40, 0, 6, 0, 0, 3, 25, 0.25)  # CPU: `cstep` compiles its optimizer step (~40 s)


def machine(s: Settings) -> Machine:
    return GPU if s.on_gpu else CPU


def step_s(model: dict[str, Any], method: str, gb: int, gpu: dict[str, Any], compiled: bool, m: Machine) -> float:
    """One optimizer step over `gb` samples at the assumed MFU; the machine's floor where no peak is declared."""
    flops = train_flops_per_sample(model) or 0.0
    peak = (gpu.get("peak_tflops") or {}).get(model["recipe"]["precision"])
    if not flops or not peak:
        return m.step_floor_s
    meth = parse(method)
    kind = "levers" if meth.fused_ce and compiled else "compiled" if compiled else "fl" if meth.free_lunch else "naive"
    return max(m.step_floor_s, gb * flops / (peak * 1e12 * MFU[kind]))


def compile_s(model: dict[str, Any], m: Machine) -> float:
    measured = REFERENCE["compile_s"].get(model["name"])
    if measured is not None and m is GPU:
        return float(measured)
    return m.compile_s + m.compile_s_per_layer * model["arch"].get("num_hidden_layers", 0)


def cell_s(plan: Plan, catalog: Catalog, s: Settings) -> float:
    """Predicted seconds of one plan in a warm process (its process's start is the group's: group_s)."""
    m = machine(s)
    if plan.kind == "honesty":
        model = catalog.model(plan.model).to_dict()
        mb = s.honesty_micro_batch or plan.cap
        step = step_s(model, "fl", mb * 8, catalog.gpu(s.gpu).to_dict(), False, m)
        return m.build_s + m.build_s_per_bparam * (param_count(model) or 0) / 1e9 + step * (1 + 1 + 4) + m.cell_s
    model = catalog.model(plan.model).to_dict()
    if plan.compile is not None:
        model["supports_compile"] = plan.compile
    meth = parse(plan.method)
    gpu = catalog.gpu(s.gpu).to_dict()
    cap = plan.cap if s.max_micro_batch is None or plan.expect_failed_trial else s.max_micro_batch
    gb = plan.global_batch or s.accum_factor * cap * plan.ranks
    compiled = compiles(meth, model)
    if plan.kind == "sustained":
        warm = 2
        one = step_s(model, plan.method, gb, gpu, compiled, m)
        comp = 0.6 * compile_s(model, m) if compiled else 0.0
        return m.build_s + comp + (warm + (plan.steps or 100)) * one + m.cell_s
    gpu_only = meth.liger or meth.flash_attn or meth.compile_mode == "cg"
    absent = (meth.flash_attn and not _importable("flash_attn")) or (meth.liger and not _importable("liger_kernel"))
    if plan.fallback:  # runs where its first cell (with Liger) cannot
        if s.on_gpu and _importable("liger_kernel"):
            return 1.0
    elif (gpu_only and not s.on_gpu) or absent:
        return 1.0  # unsupported before anything is built
    params_b = (param_count(model) or 0) / 1e9
    t = 2 * (m.build_s + m.build_s_per_bparam * params_b) + m.cell_s  # the trial's instance, then the timed one
    if compiled or meth.compile_mode == "cstep":
        c = compile_s(model, m) if compiled else 0.0
        t += 1.3 * c  # the timed instance recompiles on warm caches
        if meth.compile_mode in ("cstep", "cg"):
            t += 0.5 * c if compiled else m.compile_s  # the optimizer step (cstep) or the graphs' capture (cg)
    if meth.liger and s.on_gpu:
        t += m.liger_s
    if meth.sharding in ZERO_STAGE:
        t += m.deepspeed_s + (m.cpu_adam_build_s if meth.offload else 0.0)
    if plan.ranks > 1:
        if s.on_gpu and plan.ranks > s.visible_gpus:
            return 1.0  # skipped with the reason
        t += m.multi_rank_s
    warmup = plan.warmup_steps if plan.warmup_steps is not None else s.warmup_steps
    timed = plan.timed_steps if plan.timed_steps is not None else s.timed_steps
    step = step_s(model, plan.method, gb, gpu, compiled, m)
    if meth.offload:
        step += (param_count(model) or 0) * 16 / 2e9 if s.on_gpu else 0.0  # CPU Adam over fp32 states, ~2 GB/s
    t += (warmup + timed + 1) * step  # + one micro-batch of the trial and the attention profile
    if plan.expect_failed_trial:
        t += 4 * (1.0 if s.on_gpu else 0.2)  # failed trials end at the allocation that does not fit
    return t


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def group_s(plans: list[Plan], catalog: Catalog, s: Settings) -> float:
    """A worker process: its start and its cells in order (DeepSpeed imported, cpu_adam built, once)."""
    m = machine(s)
    methods = [parse(p.method) for p in plans if p.kind == "cell"]
    zero = sum(1 for x in methods if x.sharding in ZERO_STAGE)
    zero_off = sum(1 for x in methods if x.sharding in ZERO_STAGE and x.offload)
    once = max(0, zero - 1) * m.deepspeed_s + max(0, zero_off - 1) * m.cpu_adam_build_s
    return m.process_s + sum(cell_s(p, catalog, s) for p in plans) - once


def groups_s(groups: list[list[Plan]], catalog: Catalog, s: Settings, lanes: int) -> float:
    """Groups spread over `lanes` processes at once, each group to the lane that is free first."""
    ends = [0.0] * max(1, lanes)
    for g in groups:
        i = ends.index(min(ends))
        ends[i] += group_s(g, catalog, s)
    return max(ends)


def cap_s(plan: Plan, catalog: Catalog, s: Settings) -> float:
    """How long a cell may run before it is stopped: well above its prediction (a CI machine may be 2x slower
    than the one the constants come from), never below a minute."""
    return max(60.0, (2.5 if s.on_gpu else 4.0) * cell_s(plan, catalog, s))
