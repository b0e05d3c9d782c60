"""The parts of the GPU run (benchmarks/gpu_all.py), in the order of their value, and their predicted time: which
cells each runs, in which processes, with which budget. Imports no torch."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import plans as P
from . import timeplan
from .losscheck import loss_plan, make_spec

SMOKE_SCALE = 3  # smoke: every budget x3 (a shared 2-core CPU, maybe 2x slower in CI): it checks the script
SMOKE_BLOCKED = ("polars", "snakemake", "pretrain_planner")  # not on the GPU machine (pretrain_planner: not
# installed there; workflow/ on the path instead): the smoke rehearses without them
FLASH_ATTN_NOTE = (
    "fa2 -> unsupported: no flash-attn wheel exists for the GPU image's Python 3.12 / torch 2.11+cu130, so none "
    "is carried (the cell says so with the reason)"
)


@dataclass
class Part:
    name: str
    value: str  # which of issue 28's figures
    title: str
    budget_s: float
    kind: str  # "env", "cells", "train" or "loss"
    groups: list[list[Any]] = field(default_factory=list)  # cells: the plans, one worker process per group
    lanes: int = 1  # worker processes at once (1 wherever a timing is the result)
    optional: bool = False  # runs only on time the others left
    min_s: float = 20.0  # not started with less time than this


def build_parts(smoke: bool) -> list[Part]:
    if smoke:
        big = P.lever_plans("tiny-gptneox", smoke=True, tag=" [1b]")
        small = P.lever_plans("tiny-gptneox", smoke=True, tag=" [410m]")
        # of the two-rank cells only ZeRO-3's (tests/test_gpu_paths.py runs FSDP2's out-of-memory rebuild)
        status = [
            *P.status_plans("tiny-gptneox", 2, smoke=True),
            P.multi_plans("tiny-gptneox", 4, smoke=True)[1],
            P.Plan("tiny-bert/fl+flce", "tiny-bert", "fl+flce", 2, compile=False),
        ]
        sustained, cg, lanes = P.sustained_plan(big, 4), P.cg_plan("tiny-gptneox"), 2
    else:
        big, small = P.lever_plans("pythia-1b", smoke=False), P.lever_plans("pythia-410m", smoke=False)
        status = [
            *P.status_plans("pythia-160m", P.STATUS_CAP["pythia-160m"], smoke=False),
            *P.multi_plans("pythia-160m", 8, smoke=False),
        ]
        sustained, cg, lanes = P.sustained_plan(big, 100), P.cg_plan("pythia-1b"), 3
    m_big, m_small, loss = big[0].model, small[0].model, loss_plan(smoke)
    scale = SMOKE_SCALE if smoke else 1
    parts = [
        Part("env", "5", "the machine: date, GPU, driver, versions, optional back-ends", 10, "env", min_s=5),
        Part(
            "p2_1b",
            "P2",
            f"the levers combined on {m_big}: {big[0].method} (fallback {big[1].method})",
            140,
            "cells",
            [[p] for p in big],
        ),
        Part(
            "p2_410m",
            "P2",
            f"the levers combined on {m_small}: {small[0].method} (fallback {small[1].method})",
            135,
            "cells",
            [[p] for p in small],
        ),
        Part(
            "p1_1b",
            "P1",
            f"{m_big}: the predicted step vs {sustained.steps} sustained steps",
            135,
            "cells",
            [[sustained]],
        ),
        Part(
            "p5_train",
            "P5",
            f"the train stage from the plan exported from p2_410m's cell ({m_small})",
            120,
            "train",
            [small],
        ),  # the cells whose plan it exports (the first that ended ok)
        Part(
            "p4_status",
            "P4",
            f"every method's status on {status[0].model}, cheapest first ({lanes} processes at "
            "once: statuses, not timings)",
            200,
            "cells",
            P.status_groups(status),
            lanes=lanes,
        ),
        Part(
            "p4_probes",
            "P4",
            "the OOM probe and the timing-honesty check",
            60,
            "cells",
            [[P.oom_probe(smoke)], [P.honesty_plan(smoke)]],
        ),
        Part(
            "p6_loss",
            "P6",
            f"the lever cells' loss against naive's on {loss.model} ({', '.join(loss.methods)}; time permitting)",
            200,
            "loss",
            [[loss]],
            optional=True,
        ),
        Part(
            "p2_cg",
            "P2",
            f"{cg.label}: CUDA graphs instead of the compiled step (time permitting)",
            60,
            "cells",
            [[cg]],
            optional=True,
        ),
    ]
    for part in parts:
        part.budget_s *= scale
    return parts


def predicted_s(part: Part, catalog, settings) -> float:
    """The part's predicted seconds (timeplan.py; the train stage: its start, data, compile and steps)."""
    if part.kind == "env":
        return 8.0 if settings.on_gpu else 15.0
    if part.kind == "train":
        lever = part.groups[0][-1]  # the fallback: the setting without Liger where the first would not run
        model = catalog.model(lever.model).to_dict()
        gpu = catalog.gpu(settings.gpu).to_dict()
        step = timeplan.step_s(model, lever.method, lever.global_batch or lever.cap, gpu, settings.on_gpu,
                               timeplan.machine(settings))  # fmt: skip
        fixed = train_overhead_s(model, settings)
        return fixed + (2 + train_steps(settings, step, part.budget_s - fixed)) * step
    if part.kind == "loss":
        return loss_check_s(part.groups[0][0], catalog, settings)
    return timeplan.groups_s(part.groups, catalog, settings, part.lanes)


def loss_check_s(plan, catalog, settings) -> float:
    """P6's predicted seconds: its process, a build per run the check plans (naive, its variants, naive at the
    levers' precision, each lever), each run's steps at the levers' step time, one compile per compiled lever."""
    m = timeplan.machine(settings)
    model = catalog.model(plan.model).to_dict()
    gpu = catalog.gpu(settings.gpu).to_dict()
    runs = len(make_spec(plan, catalog, settings.gpu, 1, Path())[1])
    step = timeplan.step_s(model, "fl", plan.global_batch, gpu, settings.on_gpu, m)
    # GPU: every lever's model is compiled (warm caches); CPU: the model stays eager, cstep's optimizer step compiles
    compiled = (len(plan.methods) if plan.compile_model else 0) if settings.on_gpu else 1
    return m.process_s + runs * (m.build_s + plan.steps * step) + compiled * timeplan.compile_s(model, m)


def train_overhead_s(model: dict[str, Any], settings) -> float:
    """The train stage's fixed costs: its process, the generated corpus and tokenizer, the compile (warm caches)."""
    m = timeplan.machine(settings)
    return m.process_s + 10 + (0.6 * timeplan.compile_s(model, m) if settings.on_gpu else 0.0)


def train_steps(settings, step_s: float, seconds: float) -> int:
    """P5's steps: "a few hundred" on a GPU (as many as `seconds` hold at `step_s`, 100 to 300); 6 in smoke mode."""
    if not settings.on_gpu:
        return 6
    return int(min(300, max(100, seconds / max(step_s, 1e-3))))


def known_before(settings, blocked: tuple[str, ...] = ()) -> list[str]:
    """What the plan can say before anything runs: the back-ends that are absent here, and so `unsupported`; what
    `blocked` makes unimportable (as on the GPU machine)."""
    out = []
    if importlib.util.find_spec("flash_attn") is None:
        out.append(FLASH_ATTN_NOTE if settings.on_gpu else "fa2 -> unsupported (flash-attn runs on CUDA only)")
    absent = {
        "liger_kernel": "liger-kernel is not installed: fl+liger and the lever cells with Liger -> unsupported (their "
        "fallback without Liger runs instead); flce uses the chunked PyTorch head",
        "deepspeed": "DeepSpeed is not installed: every ZeRO cell -> unsupported",
    }
    out += [why for module, why in absent.items() if importlib.util.find_spec(module) is None]
    if not settings.on_gpu:
        out.append("CPU: cg, fa2 and liger -> unsupported; no model is compiled but cstep's optimizer step")
    gone = [m for m in blocked if m != "pretrain_planner"]
    if gone:
        out.append(f"not importable here (as on the GPU machine): {', '.join(gone)}; nothing below needs them")
    if "pretrain_planner" in blocked:
        out.append("an installed pretrain_planner is masked: every process finds it in workflow/, as on the GPU "
                   "machine, where it is not installed")  # fmt: skip
    return out
