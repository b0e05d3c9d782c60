"""What the GPU check runs: cells (a model with a method, its micro-batch cap and overrides) and the groups of them
that share a process, in the order of their value.

A method's parts come from `pretrain_planner.planning.methods.parse`, never from its spelling. A plan that is
`risky` (a path no GPU run has exercised yet: Liger's Triton kernels, a compiled optimizer step, CUDA graphs) runs
in a process of its own, so a CUDA fault there cannot poison the cells after it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pretrain_planner.planning.methods import parse

HERE = Path(__file__).resolve().parent
REFERENCE = json.loads((HERE / "reference_h200.json").read_text())  # the H200 figures this repo carries


@dataclass(frozen=True)
class Plan:
    """One cell to run. `global_batch` None = accum_factor x cap (the recipe's batch is overridden)."""

    label: str
    model: str
    method: str
    cap: int  # benchmark.max_micro_batch
    global_batch: int | None = None
    warmup_steps: int | None = None  # None = the command line's
    timed_steps: int | None = None
    expect_failed_trial: bool = False  # the micro-batch search must hit OOM and back off
    reference: str | None = None  # key into REFERENCE["cells"]
    kind: str = "cell"  # "cell" (run_rank), "honesty" (the timing-honesty check), "sustained" (a run of `of`)
    compile: bool | None = None  # override the model's supports_compile (None: the catalog's)
    run_invalid: bool = False  # run even if the grid rules the cell out (world size 1 sharding, CPU kernels)
    may_be_unsupported: bool = False  # `unsupported` with a reason is a pass (back-end absent here)
    expect_unsupported: bool = False  # `unsupported` is the only pass (a GPU-only back-end on the CPU)
    fake_oom_above: int | None = None  # CPU: force an OOM above this micro-batch (trainer.oom.FakeOom)
    ranks: int = 1  # >1: one process per rank (benchmarks/multirank.py), one GPU each
    one_gpu_per_task: bool = False  # GPU: each rank sees only its own GPU (CUDA_VISIBLE_DEVICES), as --gpus-per-task
    fake_oom: str | None = None  # PRETRAIN_PLANNER_FAKE_OOM_ABOVE for the ranks, e.g. "4:1@build"
    issue_items: str | None = None  # which items of issue 14 this cell checks (for the report)
    of: tuple[str, ...] = ()  # sustained: the cells whose setting it runs (the first that ended ok);
    # a fallback: the cells that must not have ended ok for it to run
    fallback: bool = False
    steps: int | None = None  # sustained: optimizer steps timed as one block
    target: dict[str, Any] | None = field(default=None, hash=False)  # {"mfu", "tokens_per_s", "source"}

    @property
    def risky(self) -> bool:
        """A path that may fault the CUDA context: run it in its own process."""
        m = parse(self.method)
        return m.liger or m.compile_mode in ("cstep", "cg")

    def to_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        return cls(**{**d, "of": tuple(d.get("of") or ())})


def slug(label: str) -> str:
    """A cell's folder name: its label with only letters, digits, '.', '_', '-', '+'."""
    return "".join(c if c.isalnum() or c in "._-+" else "_" for c in label)


# Issue 28's targets on one H200 for the levers combined (P2); today's figures 44.7% and 36.4% MFU.
LEVER_TARGETS = {
    "pythia-1b": {"mfu": 0.52, "tokens_per_s": 82_000, "source": "issue 28 (P2); today 44.7% MFU"},
    "pythia-410m": {"mfu": 0.45, "tokens_per_s": 163_000, "source": "issue 28 (P2); today 36.4% MFU"},
}
LEVERS = "fl+liger+flce+cstep"  # every throughput lever that composes (cstep and cg exclude each other)
LEVERS_FALLBACK = "fl+flce+cstep"  # where Liger does not import: the chunked fused head, still compiled
LEVERS_CG = "fl+liger+flce+cg"  # CUDA graphs instead of the compiled step, if time remains
LEVER_CAP = 32  # micro-batch cap of the lever cells (Liger's fused head fits 1B at 32: reference_h200.json)
_REFS = {("pythia-1b", LEVERS): "1b-liger-head-mb32", ("pythia-410m", LEVERS): "410m-liger-head-mb32"}

# Every method on one model, cheapest first: instant (the back-end is absent here), then the uncompiled paths,
# then the risky ones (each in its own process), then ZeRO-Offload (DeepSpeed JIT-builds its cpu_adam op on a
# machine without a prebuilt one: a minute or more), then DeepSpeed's and FSDP2's own compile paths. torch.compile
# only where the method is about compiling (`cstep`, `cg`, and those two last cells): the compiled `fl` path
# is what the lever cells measure. (method, compile the model?, may be unsupported here, label suffix)
STATUS_METHODS: list[tuple[str, bool | None, bool, str]] = [
    ("fl+fa2", False, True, ""),  # no flash-attn wheel for the GPU image's Python / torch: unsupported at once
    ("naive", False, False, ""),
    ("fl", False, False, ""),
    ("fl+ac", False, False, ""),
    ("fl+flce", False, False, ""),
    ("fl+zero1", False, True, ""),
    ("fl+zero2", False, True, ""),
    ("fl+zero3", False, True, ""),
    ("fl+fsdp-grad", False, False, ""),
    ("fl+fsdp-full", False, False, ""),
    ("fl+fsdp-grad+off", False, False, ""),
    ("fl+fsdp-full+off", False, False, ""),
    ("fl+liger", False, True, ""),
    ("fl+cstep", None, False, ""),
    ("fl+cg", None, True, ""),
    ("fl+zero1+off", False, True, ""),
    ("fl+zero2+off", False, True, ""),
    ("fl+zero3+off", False, True, ""),
    ("fl+zero2", None, True, " compiled"),  # DeepSpeedEngine.compile
    ("fl+fsdp-grad", None, False, " compiled"),  # FSDP2 with per-block compile
]
GPU_ONLY = ("fl+cg", "fl+fa2", "fl+liger")  # unsupported on a CPU, with the reason
STATUS_CAP = {"pythia-160m": 8}  # a status sweep: small steps (the lever cells measure speed)


def status_plans(model: str, cap: int, smoke: bool) -> list[Plan]:
    """Every method on `model`, cheapest first (STATUS_METHODS). Smoke: no model compile (a CPU compile is ~40 s;
    `cstep` still compiles its optimizer step), the GPU-only parts must be `unsupported`, no compiled extras."""
    out = []
    for method, compile_, maybe, suffix in STATUS_METHODS:
        if smoke and suffix:
            continue
        out.append(
            Plan(
                f"{model}/{method}{suffix}",
                model,
                method,
                cap,
                compile=False if smoke else compile_,
                run_invalid=True,
                may_be_unsupported=maybe,
                expect_unsupported=smoke and method in GPU_ONLY,
            )
        )
    return out


def multi_plans(model: str, cap: int, smoke: bool) -> list[Plan]:
    """Issue 14 on two ranks. An out-of-memory error is forced on rank 1 above cap/2 (at build time for FSDP2:
    before that rank's first collective), so both ranks must agree, rebuild the group and halve together."""
    half = cap // 2
    return [
        Plan(
            f"{model}/fl+fsdp-full+off x2 OOM@build",
            model,
            "fl+fsdp-full+off",
            cap,
            ranks=2,
            compile=False,
            run_invalid=True,
            fake_oom=f"{half}:1@build",
            issue_items="1 offload+clipping on NCCL+gloo, 3 fp16 scaler after rebuild, 6 eager NCCL + OOM before a "
            "collective, 7 meta build, 8 one reduce-scatter per step, 9 skipped steps",
        ),
        Plan(
            f"{model}/fl+zero3 x2 one GPU per task",
            model,
            "fl+zero3",
            cap,
            ranks=2,
            one_gpu_per_task=True,
            compile=False if smoke else None,
            run_invalid=True,
            may_be_unsupported=True,
            fake_oom=f"{half}:1",
            issue_items="4 device rule, 5 DeepSpeed groups after rebuild, 7 zero.Init, 9 skipped steps, 11 compile",
        ),
    ]


def lever_plans(model: str, smoke: bool, tag: str = "") -> list[Plan]:
    """P2: the levers combined on `model`, compiled, micro-batch cap 32, global batch = the cap (so a sustained run
    of 100 steps fits in minutes), the pipeline's warm-up and timed steps; a fallback without Liger runs only if
    the first does not end ok. Smoke (CPU): Liger is unsupported there, so the fallback runs (uncompiled); `tag`
    tells apart the labels of the same tiny model standing in for two."""
    if smoke:
        first = Plan(
            f"{model}{tag}/fl+liger+flce",
            model,
            "fl+liger+flce",
            2,
            global_batch=4,
            compile=False,
            run_invalid=True,
            may_be_unsupported=True,
        )
        fallback = Plan(
            f"{model}{tag}/fl+flce",
            model,
            "fl+flce",
            2,
            global_batch=4,
            compile=False,
            of=(first.label,),
            fallback=True,
        )
        return [first, fallback]
    target = LEVER_TARGETS.get(model)
    first = Plan(
        f"{model}/{LEVERS}",
        model,
        LEVERS,
        LEVER_CAP,
        global_batch=LEVER_CAP,
        warmup_steps=2,
        timed_steps=5,
        reference=_REFS.get((model, LEVERS)),
        run_invalid=True,
        may_be_unsupported=True,
        target=target,
    )
    fallback = Plan(
        f"{model}/{LEVERS_FALLBACK}",
        model,
        LEVERS_FALLBACK,
        LEVER_CAP,
        global_batch=LEVER_CAP,
        warmup_steps=2,
        timed_steps=5,
        of=(first.label,),
        fallback=True,
        target=target,
    )
    return [first, fallback]


def cg_plan(model: str) -> Plan:
    """P2's `+cg` variant (CUDA graphs instead of the compiled optimizer step), run only if time remains."""
    return Plan(
        f"{model}/{LEVERS_CG}",
        model,
        LEVERS_CG,
        LEVER_CAP,
        global_batch=LEVER_CAP,
        warmup_steps=2,
        timed_steps=5,
        run_invalid=True,
        may_be_unsupported=True,
        target=LEVER_TARGETS.get(model),
    )


def sustained_plan(levers: list[Plan], steps: int) -> Plan:
    """P1: `steps` optimizer steps of the first lever cell that ended ok, on a fresh instance, timed as one block."""
    first = levers[0]
    return Plan(
        f"{first.model}/levers sustained {steps} steps",
        first.model,
        first.method,
        first.cap,
        global_batch=first.global_batch,
        kind="sustained",
        of=tuple(p.label for p in levers),
        steps=steps,
    )


def oom_probe(smoke: bool) -> Plan:
    """A micro-batch that cannot fit: the search must hit out-of-memory and back off. GPU: Pythia-1B `naive` (eager
    attention, 50k-wide logits) at 128 in 141 GB (16 fits: gpu_check_h200.md); one timed step after backing off.
    CPU: trainer.oom.FakeOom raises one above micro-batch 2, the same back-off path."""
    model, cap = ("tiny-gptneox", 8) if smoke else ("pythia-1b", 128)
    return Plan(f"{model}/naive OOM probe", model, "naive", cap, global_batch=cap, warmup_steps=0, timed_steps=1,
                expect_failed_trial=True, fake_oom_above=2 if smoke else None)  # fmt: skip


def honesty_plan(smoke: bool) -> Plan:
    """The timing-honesty check (honesty.py): Pythia-410M at micro-batch 16 on GPU, as measured there before."""
    if smoke:
        return Plan("timing honesty", "tiny-gptneox", "fl", 2, kind="honesty")
    return Plan("timing honesty", "pythia-410m", "fl", 16, kind="honesty")


def status_groups(plans: list[Plan]) -> list[list[Plan]]:
    """The processes of a status sweep: each risky plan alone, the ZeRO-Offload cells together (they share one
    cpu_adam build), the compiled extras together, every other plan in one process, in the sweep's order."""
    safe, offload, compiled, out = [], [], [], []
    for p in plans:
        m = parse(p.method)
        if p.risky:
            out.append([p])
        elif m.sharding and m.sharding.startswith("zero") and m.offload:
            offload.append(p)
        elif p.label.endswith(" compiled"):
            compiled.append(p)
        else:
            safe.append(p)
    return [g for g in (safe, *out, offload, compiled) if g]
