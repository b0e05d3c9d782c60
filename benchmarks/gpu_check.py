#!/usr/bin/env python
"""Exercise the trainer's GPU-only paths for real on one NVIDIA GPU, and write a Markdown report.

What it runs (in this process, world size 1, through the trainer's own entry point `run_rank`):

* a list of cells (model x method) on GPU type `h200`: SDPA vs eager attention, torch.compile, TF32,
  fused AdamW, bf16 autocast, fp16 autocast with GradScaler (Pythia-160M/410M and RoBERTa-large are fp16
  recipes), and a deliberate CUDA out-of-memory cell whose micro-batch search must back off;
* a timing-honesty check: the "$100K" benchmark's unsynchronised timer vs our synchronised whole steps;
* issue 14's multi-GPU paths, on two ranks (separate processes, started as the local launcher starts them,
  benchmarks/multirank.py; they need 2 GPUs and are skipped with the reason on fewer): FSDP2 + CPU offload with
  clipping and fp16 after an out-of-memory error at build time on one rank (items 1, 3, 6, 7, 8, 9), and ZeRO-3
  with one GPU visible per task after an out-of-memory error (items 4, 5, 7, 9, 11); plus checks on the
  one-rank cells (`cg` under accumulation against `fl`: item 2; cuDNN autotuning under `fl`: item 13).

Each cell's recipe global batch is overridden to `--accum-factor` x its micro-batch cap so a step has a
few accumulation micro-batches instead of 64 (the override is recorded). Tokens/s and MFU are compared
with /work/shared/reference/measurements.md (one H200).

`--smoke` runs the same code on the CPU with tiny models (GPU type `cpu`) in well under 3 minutes, so the
script itself can be checked without a GPU. See benchmarks/README.md for the commands.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "workflow") not in sys.path:  # works without `pip install -e .` too
    sys.path.insert(0, str(REPO / "workflow"))

try:
    from pretrain_planner.planning.catalog import Catalog, load_catalog
    from pretrain_planner.planning.grid import Cell, invalid_reason
    from pretrain_planner.planning.spec import cell_spec
except ImportError as _exc:  # a bare GPU image: torch + transformers + pyyaml, but no jsonschema / submitit
    sys.exit(
        f"gpu_check: cannot import the planner ({_exc}). It needs pyyaml, jsonschema and submitit besides torch and "
        "transformers; on a machine without a registry, carry them (see benchmarks/README.md, 'GPU run') and put "
        "them on PYTHONPATH."
    )

T_START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[gpu_check {time.perf_counter() - T_START:7.1f}s] {msg}", flush=True)


# ------------------------------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class Plan:
    """One cell to run. `global_batch` None = accum_factor x cap (the recipe's batch is overridden)."""

    label: str
    model: str
    method: str
    cap: int  # benchmark.max_micro_batch
    global_batch: int | None = None
    warmup_steps: int | None = None  # None = the CLI value
    timed_steps: int | None = None
    expect_failed_trial: bool = False  # the micro-batch search must hit OOM and back off
    reference: str | None = None  # key into REFERENCE
    skip: str | None = None  # reason to skip without running
    kind: str = "cell"  # "cell" (run_rank) or "honesty" (the timing-honesty check; cap = its micro-batch)
    compile: bool | None = None  # override the model's supports_compile (None: the catalog's)
    run_invalid: bool = False  # run even if the grid rules the cell out (world size 1 sharding, CPU kernels)
    may_be_unsupported: bool = False  # `unsupported` with a reason is a pass (back-end absent here)
    expect_unsupported: bool = False  # `unsupported` is the only pass (a GPU-only back-end on the CPU)
    fake_oom_above: int | None = None  # CPU: force an OOM above this micro-batch (trainer.oom.FakeOom)
    ranks: int = 1  # >1: one process per rank (benchmarks/multirank.py), one GPU each
    one_gpu_per_task: bool = False  # GPU: each rank sees only its own GPU (CUDA_VISIBLE_DEVICES), as --gpus-per-task
    fake_oom: str | None = None  # PRETRAIN_PLANNER_FAKE_OOM_ABOVE for the ranks, e.g. "4:1@build"
    issue_items: str | None = None  # which items of issue 14 this cell checks (for the report)


# reference/measurements.md, one H200 SXM, torch 2.11, sequence 2048, SDPA, bf16 autocast, fused AdamW.
# "eager" there means not compiled (attention is still SDPA).
REFERENCE: dict[str, dict[str, Any]] = {
    "160m-eager": {
        "what": "Pythia-160M mb32, eager (SDPA, no compile)",
        "mb": 32,
        "compile": False,
        "tokens_per_s": 290476,
        "mfu": 0.284,
        "peak_gib": 59.9,
    },
    "410m-eager": {
        "what": "Pythia-410M mb16, eager (SDPA, no compile)",
        "mb": 16,
        "compile": False,
        "tokens_per_s": 120592,
        "mfu": 0.332,
        "peak_gib": 52.5,
    },
    "410m-compile": {
        "what": "Pythia-410M mb16, torch.compile",
        "mb": 16,
        "compile": True,
        "tokens_per_s": 133846,
        "mfu": 0.369,
        "peak_gib": 46.3,
    },
    "1b-eager": {
        "what": "Pythia-1B mb16, eager (SDPA, no compile)",
        "mb": 16,
        "compile": False,
        "tokens_per_s": 69418,
        "mfu": 0.439,
        "peak_gib": 72.6,
    },
    "1b-compile": {
        "what": "Pythia-1B mb16, torch.compile",
        "mb": 16,
        "compile": True,
        "tokens_per_s": 69630,
        "mfu": 0.440,
        "peak_gib": 64.7,
    },
}
# measurements.md, "The reference benchmark's unsynchronised timer" (micro-batch 16, 8 accumulation steps)
REFERENCE_HONESTY = {"pythia-410m": {"reference": 1.955, "synchronised": 2.137, "actual": 2.153, "error": -0.092}}

# Every method, in the order a budget cut should drop them last-first. Sharded methods run at world size
# 1 here: the grid keeps them out of sweeps on one GPU without offload (nothing to shard across), but the
# back-end paths (DeepSpeed engine, FSDP2 mesh, offload) are the same and must work.
METHODS = [
    # (method, compile the model?, may be unsupported here) -- compile only where the method is about it
    ("naive", None, False),
    ("fl", None, False),
    ("fl+ac", False, False),
    ("fl+flce", False, False),
    ("fl+cstep", None, False),
    ("fl+cg", None, True),
    ("fl+fa2", False, True),
    ("fl+liger", False, True),
    ("fl+zero1", False, True),
    ("fl+zero2", None, True),  # DeepSpeedEngine.compile once
    ("fl+zero3", False, True),
    ("fl+zero1+off", False, True),
    ("fl+zero2+off", False, True),
    ("fl+zero3+off", False, True),
    ("fl+fsdp-grad", None, False),  # FSDP2 with per-block compile once
    ("fl+fsdp-full", False, False),
    ("fl+fsdp-grad+off", False, False),
    ("fl+fsdp-full+off", False, False),
]
GPU_ONLY = ("fl+cg", "fl+fa2", "fl+liger")
_GPU_CAPS = {"pythia-160m": 16, "pythia-410m": 8}
_GPU_REFS = {("pythia-160m", "fl"): "160m-eager", ("pythia-410m", "fl"): "410m-compile"}


def _method_plans(model: str, cap: int, smoke: bool) -> list[Plan]:
    out = []
    for method, compile_, maybe in METHODS:
        if smoke:  # CPU compile costs ~40 s a model: only cstep compiles (its optimizer step), nothing else
            compile_ = False
        out.append(
            Plan(
                f"{model}/{method}",
                model,
                method,
                cap,
                compile=compile_,
                run_invalid=True,
                may_be_unsupported=maybe,
                expect_unsupported=smoke and method in GPU_ONLY,
                reference=None if smoke else _GPU_REFS.get((model, method)),
            )
        )
    return out


def _multi_plans(model: str, cap: int, smoke: bool) -> list[Plan]:
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


MULTI_SMOKE = _multi_plans("tiny-gptneox", 4, smoke=True)

GPU_PLANS = [
    *_method_plans("pythia-160m", _GPU_CAPS["pythia-160m"], smoke=False),
    *_multi_plans("pythia-160m", 8, smoke=False),
    # micro-batch 256 of Pythia-1B (eager attention, 50k-wide logits) cannot fit in 141 GB: the search must
    # hit CUDA OOM at least once and back off. Few steps: after backing off, a step has many micro-batches.
    Plan(
        "pythia-1b/naive OOM probe",
        "pythia-1b",
        "naive",
        256,
        global_batch=256,
        warmup_steps=1,
        timed_steps=2,
        expect_failed_trial=True,
    ),
    *_method_plans("pythia-410m", _GPU_CAPS["pythia-410m"], smoke=False),
    Plan("timing honesty", "pythia-410m", "fl", 16, kind="honesty"),
]
SMOKE_PLANS = [
    *_method_plans("tiny-gptneox", 2, smoke=True),
    # no CUDA OOM on a CPU: trainer.oom.FakeOom raises one above micro-batch 2, the same back-off path
    Plan(
        "tiny-gptneox/naive OOM probe",
        "tiny-gptneox",
        "naive",
        8,
        global_batch=8,
        expect_failed_trial=True,
        fake_oom_above=2,
    ),
    *MULTI_SMOKE,
    Plan("tiny-bert/naive", "tiny-bert", "naive", 2),  # the masked-LM path
    Plan("tiny-bert/fl+flce", "tiny-bert", "fl+flce", 2, compile=False),
    Plan("timing honesty", "tiny-gptneox", "fl", 2, kind="honesty"),
]


# ------------------------------------------------------------------------------------------ environment


def _run(cmd: list[str]) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    env: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "mode": "smoke (CPU, tiny models)" if args.smoke else "GPU",
        "command": shlex.join([sys.executable, *sys.argv]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "cpu_threads": torch.get_num_threads(),
        "env": {
            k: os.environ.get(k)
            for k in ("HF_HUB_OFFLINE", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "TORCHINDUCTOR_CACHE_DIR")
        },
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu_name=torch.cuda.get_device_name(0),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            gpu_capability=f"{props.major}.{props.minor}",
            gpu_count=torch.cuda.device_count(),
        )
    else:
        env["gpu_name"] = None
    smi = _run(
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm",
            "--format=csv,noheader",
        ]
    )
    env["nvidia_smi"] = smi
    env["driver"] = smi.splitlines()[0].split(",")[1].strip() if smi else None
    return env


def _cleanup() -> int | None:
    """Free what a cell left behind; return bytes still allocated on the GPU (a leak shows here)."""
    import torch

    try:
        import torch._dynamo

        # Cells share GPTNeoX's forward code object: without a reset, dynamo's per-code cache would carry
        # guards (and graphs) of earlier models into later cells and could hit its recompile limit.
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001 - best effort
        pass
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    return None


# ------------------------------------------------------------------------------------------ cells

FAKE_OOM_ENV = "PRETRAIN_PLANNER_FAKE_OOM_ABOVE"  # trainer.oom.FAKE_OOM_ENV (a test hook)


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    """Set environment variables for the duration of one cell."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def make_spec(plan: Plan, catalog: Catalog, gpu: str, args: argparse.Namespace, folder: Path) -> tuple[dict, dict]:
    cap = plan.cap if args.max_micro_batch is None or plan.expect_failed_trial else args.max_micro_batch
    config = {
        "benchmark": {
            "warmup_steps": plan.warmup_steps if plan.warmup_steps is not None else args.warmup_steps,
            "timed_steps": plan.timed_steps if plan.timed_steps is not None else args.timed_steps,
            "max_micro_batch": cap,
            "seed": 0,
            **({"max_spread": 50.0} if args.smoke else {}),  # smoke: CPU wiring on a shared machine, not timing
        },
        "launcher": {"kind": "debug" if plan.ranks == 1 else "local", "timeout_min": 20},
    }
    cell = Cell(plan.model, gpu, 1, plan.ranks, plan.method)
    spec = cell_spec(cell, catalog, config, str(folder / "result.json"), str(folder / "steps.jsonl"))
    recipe_gb = spec["model"]["recipe"]["global_batch"]
    gb = plan.global_batch or args.accum_factor * cap * plan.ranks
    spec["model"]["recipe"]["global_batch"] = gb
    spec["threads_per_rank"] = args.threads
    override = {
        "recipe_global_batch": recipe_gb,
        "global_batch": gb,
        "max_micro_batch": cap,
        "warmup_steps": config["benchmark"]["warmup_steps"],
        "timed_steps": config["benchmark"]["timed_steps"],
    }
    if args.smoke and spec["model"]["recipe"]["precision"] != "fp32" and "zero" not in plan.method:
        # bf16 autocast on a CPU is ~5x slower than fp32 (no bf16 matmul units): keep the smoke short.
        # ZeRO cells keep bf16 (DeepSpeed's own bf16 path, fast here); the GPU run checks every precision.
        override["precision"] = f"fp32 (recipe: {spec['model']['recipe']['precision']})"
        spec["model"]["recipe"]["precision"] = "fp32"
    if plan.compile is not None and plan.compile != spec["model"]["supports_compile"]:
        spec["model"]["supports_compile"] = plan.compile
        override["supports_compile"] = plan.compile
    return spec, override


AUTOCAST = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}  # recipe precision -> method_settings.autocast


def expected_attention(plan: Plan, on_gpu: bool) -> tuple[str | None, str]:
    """(attn_implementation, prefix of the kernel that must have run) for a plan's method."""
    parts = plan.method.split("+")
    if "fa2" in parts:
        return "flash_attention_2", "flash-attn"
    if parts[0] == "fl":
        return "sdpa", "sdpa:"
    return "eager", "eager"


def checks_for(plan: Plan, rec: dict[str, Any], on_gpu: bool, gpu_spec: dict[str, Any]) -> list[tuple[str, bool]]:
    """What must hold for this cell if the trainer's path works; (description, passed)."""
    r = rec.get("result") or {}
    status = r.get("status")
    if plan.expect_unsupported:
        return [("status unsupported, with a reason", status == "unsupported" and bool(r.get("reason")))]
    if plan.may_be_unsupported and status == "unsupported":
        return [("unsupported here, with a reason (back-end absent)", bool(r.get("reason")))]
    out: list[tuple[str, bool]] = [("status ok", status == "ok")]
    if status != "ok":
        return out
    s = r.get("method_settings") or {}
    precision = r.get("precision")
    parts = plan.method.split("+")
    fl = parts[0] == "fl"
    sharded = any(p.startswith(("zero", "fsdp")) for p in parts)
    deepspeed = any(p.startswith("zero") for p in parts)
    offload = "off" in parts
    compiled = fl and (plan.compile if plan.compile is not None else True)
    attn, kernel = expected_attention(plan, on_gpu)
    tf32 = fl and on_gpu and bool(gpu_spec.get("tf32"))
    fused = fl and on_gpu and not offload
    out += [
        ("device " + ("cuda" if on_gpu else "cpu"), s.get("device") == ("cuda" if on_gpu else "cpu")),
        (f"attention {attn}", s.get("attn_implementation") == attn),
        (f"attention kernel {kernel}*", str(s.get("attention_kernel") or "").startswith(kernel)),
        (f"compile {compiled}", bool(s.get("compile")) is compiled),
        (f"tf32 {tf32}", s.get("tf32") is tf32),
        (f"fused AdamW {fused}", s.get("fused_optimizer") is fused),
        (
            "micro-batch x accum x ranks = global batch",
            (r.get("micro_batch_size") or 0) * (r.get("grad_accum_steps") or 0) * plan.ranks == r.get("global_batch"),
        ),
        ("steps.jsonl has one line per timed step", len(rec.get("steps") or []) == r.get("timed_steps")),
        (
            "p10 <= median <= p90",
            (r.get("step_time_p10_s") or 0) <= (r.get("step_time_s") or 0) <= (r.get("step_time_p90_s") or 0),
        ),
        ("not suspect", r.get("suspect") is False),
        (
            "finite final loss",
            isinstance(r.get("final_loss"), float)
            and r["final_loss"] == r["final_loss"]
            and abs(r["final_loss"]) != float("inf"),
        ),
    ]
    if not sharded:  # ZeRO's engine and FSDP2's MixedPrecisionPolicy cast instead of autocast
        out += [
            (f"autocast {AUTOCAST.get(precision)}", s.get("autocast") == AUTOCAST.get(precision)),
            (f"grad scaler {precision == 'fp16'}", bool(s.get("grad_scaler")) is (precision == "fp16")),
        ]
    if deepspeed:
        out.append(("DeepSpeed engine", s.get("parallel") == "deepspeed"))
    elif sharded:
        out.append(("FSDP2", s.get("parallel") == "fsdp2"))
    if "ac" in parts:
        out.append(("activation checkpointing on", s.get("activation_checkpointing") is True))
    if "flce" in parts:
        out.append(("fused CE head recorded", bool((s.get("method_parts") or {}).get("fused_ce"))))
    if "cstep" in parts:
        out.append(("optimizer step compiled", bool(s.get("compile_optimizer_step"))))
    if "cg" in parts:
        out.append(("CUDA graphs", s.get("compile_mode") == "reduce-overhead"))
    if "liger" in parts:
        out.append(("Liger applied", bool(((s.get("method_parts") or {}).get("liger") or {}).get("applied"))))
    if on_gpu:
        out.append(("MFU reported", r.get("mfu") is not None))
    out += issue14_checks(plan, r, s, on_gpu)
    if plan.expect_failed_trial:
        trials = r.get("micro_batch_trials") or []
        out.append(
            (
                "a trial hit OOM and the search backed off",
                any(not t["fits"] for t in trials) and bool(trials) and trials[-1]["fits"],
            )
        )
    return out


def issue14_checks(plan: Plan, r: dict[str, Any], s: dict[str, Any], on_gpu: bool) -> list[tuple[str, bool]]:
    """What issue 14's fixes must show in a cell that ran (status ok)."""
    parts = plan.method.split("+")
    fl = parts[0] == "fl"
    tuned = fl and on_gpu
    out: list[tuple[str, bool]] = [(f"cudnn.benchmark {tuned} (13)", s.get("cudnn_benchmark") is tuned)]
    if r.get("precision") == "fp16":  # 9: skipped steps counted, never timed; the scale of every timed step
        out.append(("fp16: skipped steps counted (9)", isinstance(r.get("skipped_steps"), int)))
        out.append(("fp16: loss scale recorded (9)", r.get("loss_scale") is not None))
    if s.get("compile"):
        out.append(("compile_observed recorded (11)", bool((s.get("compile_observed") or {}).get("how"))))
    if plan.ranks > 1:
        trials = r.get("micro_batch_trials") or []
        out.append(("the forced OOM on rank 1, agreed by both (6)", bool(trials) and trials[0].get("oom_ranks") == [1]))
        out.append(("process group rebuilt once (3, 5, 6)", s.get("process_group_rebuilds") == 1))
        fsdp = s.get("fsdp") or {}
        if fsdp:
            units = sum((fsdp.get("sharded_modules") or {}).values()) + 1
            rs = (s.get("collectives_per_step") or {}).get("reduce_scatter")
            accum = r.get("grad_accum_steps") or 1
            want = units if fsdp.get("grad_sync") == "last" else units * accum
            out.append((f"reduce-scatters per step {want} (8)", rs == want))
            out.append(("rank 1 built on the meta device (7)", "meta device" in str(fsdp.get("build"))))
        ds = s.get("deepspeed") or {}
        if ds.get("zero_stage") == 3:
            out.append(("ZeRO-3 partitioned by zero.Init (7)", "zero.Init" in str(ds.get("build"))))
    return out


def cross_checks(records: list[dict[str, Any]]) -> None:
    """Item 2: `cg` (CUDA graphs) under gradient accumulation trains like `fl`: final losses within 5%."""
    by_label = {rec["label"]: rec for rec in records}
    for rec in records:
        if not rec["label"].endswith("/fl+cg") or (rec.get("result") or {}).get("status") != "ok":
            continue
        ref = (by_label.get(rec["label"][: -len("+cg")]) or {}).get("result") or {}
        mine = rec["result"]
        ok = (
            ref.get("status") == "ok"
            and mine.get("grad_accum_steps", 1) > 1
            and abs(mine["final_loss"] - ref["final_loss"]) <= 0.05 * abs(ref["final_loss"])
        )
        rec.setdefault("checks", []).append(("cg with accumulation: final loss within 5% of fl's (2)", ok))


def _visible_gpus() -> list[str]:
    import torch

    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        return [d.strip() for d in env.split(",") if d.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def rank_worker(payload: dict[str, Any]) -> dict[str, Any]:
    """One rank of a multi-rank plan (run by benchmarks/multirank.py): the trainer's entry point."""
    from pretrain_planner.trainer.run import run_rank

    out = run_rank(payload["spec"])
    return {"rank": out["rank"]}


def _run_multi(plan: Plan, spec: dict[str, Any], on_gpu: bool, cells_dir: Path) -> None:
    """Run a plan's ranks as separate processes; raise if a rank failed."""
    from multirank import run_ranks

    gpus = _visible_gpus() if on_gpu else []
    if on_gpu and len(gpus) < plan.ranks:
        raise _Skip(f"needs {plan.ranks} GPUs, {len(gpus)} visible")

    def extra_env(rank: int) -> dict[str, str]:
        env = {FAKE_OOM_ENV: plan.fake_oom} if plan.fake_oom else {}
        if on_gpu and plan.one_gpu_per_task:
            env["CUDA_VISIBLE_DEVICES"] = gpus[rank]
        return env

    recs = run_ranks("gpu_check:rank_worker", plan.ranks, {"spec": spec}, 300 if on_gpu else 150, extra_env, cells_dir)
    bad = [r for r in recs if r["returncode"] != 0 or r["timed_out"]]
    if bad:
        r = bad[0]
        why = "timed out (a hang?)" if r["timed_out"] else f"exit {r['returncode']}"
        raise RuntimeError(f"rank {r['rank']} {why}: {r.get('error')}\n{r.get('traceback', '')}\n{r['stderr'][-3000:]}")


class _Skip(Exception):
    """The plan cannot run here (too few GPUs): skipped, with the reason."""


def run_plan(plan: Plan, catalog: Catalog, gpu: str, args: argparse.Namespace, cells_dir: Path) -> dict[str, Any]:
    from pretrain_planner.trainer.run import run_rank

    rec: dict[str, Any] = {"label": plan.label, "plan": asdict(plan), "status": None}
    if plan.skip:
        rec.update(status="skipped", reason=plan.skip)
        return rec
    cell = Cell(plan.model, gpu, 1, plan.ranks, plan.method)
    reason = invalid_reason(cell, catalog.model(plan.model), catalog.gpu(gpu), "debug", catalog)
    folder = cells_dir / plan.label.replace("/", "__").replace(" ", "_")
    shutil.rmtree(folder, ignore_errors=True)
    spec, override = make_spec(plan, catalog, gpu, args, folder)
    rec.update(override=override, spec_cell=spec["cell"], folder=str(folder))
    if reason and not plan.run_invalid:
        rec.update(status="skipped", reason=f"invalid cell: {reason}")
        return rec
    if reason:
        rec["grid_reason"] = f"run anyway (the grid rules it out of sweeps: {reason})"
    t0 = time.perf_counter()
    fake = {FAKE_OOM_ENV: str(plan.fake_oom_above)} if plan.fake_oom_above is not None else {}
    try:
        if plan.ranks > 1:
            spec = {**spec, "threads_per_rank": max(1, args.threads // plan.ranks)}
            _run_multi(plan, spec, gpu != "cpu", cells_dir)
        else:
            with _environ(fake):
                run_rank(spec)
        result_path, steps_path = Path(spec["outputs"]["result"]), Path(spec["outputs"]["steps"])
        if not result_path.is_file():
            raise RuntimeError(f"run_rank returned but wrote no {result_path}")
        result = json.loads(result_path.read_text())
        lines = steps_path.read_text().splitlines() if steps_path.is_file() else []
        steps = [json.loads(ln) for ln in lines if ln.strip()]
        rec.update(status=result["status"], result=result, steps=steps)
    except _Skip as exc:
        rec.update(status="skipped", reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - one failing cell must not stop the others
        rec.update(
            status="error", error=f"{type(exc).__name__}: {exc}"[:2000], traceback=traceback.format_exc()[-6000:]
        )
    finally:
        rec["cell_wall_s"] = round(time.perf_counter() - t0, 1)
        try:
            rec["gpu_bytes_left_after_cleanup"] = _cleanup()
        except Exception as exc:  # noqa: BLE001 - a poisoned CUDA context shows here
            rec["cleanup_error"] = f"{type(exc).__name__}: {exc}"[:500]
    return rec


# ------------------------------------------------------------------------------------------ honesty


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


def _honesty_measure(cfg, env, mb: int, accum: int, reps: int) -> dict[str, Any]:
    import torch
    from pretrain_planner.trainer.measure import batches_for, time_steps
    from pretrain_planner.trainer.models import build_model
    from pretrain_planner.trainer.parallel import apply_method, build_optimizer
    from pretrain_planner.trainer.step import TrainStep

    torch.manual_seed(0)
    net, attn = build_model(cfg.model, "sdpa")
    applied = apply_method(cfg, env, net, attn)
    optimizer, _ = build_optimizer(cfg, env, net.parameters())
    step = TrainStep(applied, optimizer, cfg.recipe["grad_clip"], env.device.type)
    batch = batches_for(cfg, env, mb, 1)[0]
    out: dict[str, Any] = {"method_settings": applied.settings}
    # the reference runs first, on the fresh model, as it would in the reference benchmark
    out["reference_unsynchronised"] = _reference_loop(step, batch, env, accum, reps, sync=False)
    out["reference_synchronised"] = _reference_loop(step, batch, env, accum, reps, sync=True)
    timing = time_steps(cfg, env, step, mb)
    out["actual"] = {
        "step_s": timing.median,
        "step_times_s": timing.step_times,
        "warmup_steps": cfg.bench.warmup_steps,
        "peak_mem_gib": timing.peak_mem_gib,
    }
    out["error_unsynchronised"] = out["reference_unsynchronised"]["step_s"] / timing.median - 1
    out["error_synchronised"] = out["reference_synchronised"]["step_s"] / timing.median - 1
    out["status"] = "ok"
    return out


def honesty_check(plan: Plan, catalog: Catalog, gpu: str, args: argparse.Namespace) -> dict[str, Any]:
    """The "$100K" benchmark's timer vs ours, on the same model, optimizer and batches.

    Reference: 1 warm-up + 3 steps of ONE micro-batch each, perf_counter around forward/backward and
    around the optimizer step, no device synchronisation; step = mean(micro) x accum + mean(optimizer).
    The same loop with synchronisation, then our measurement: whole synchronised `accum`-micro-batch steps
    (trainer.measure.time_steps), warm-up dropped, median. Settings mirror measurements.md's harness:
    SDPA, bf16 autocast, fused AdamW (on CUDA), TF32, no compile.
    """
    from pretrain_planner.trainer.config import RunConfig
    from pretrain_planner.trainer.rank import close_rank, init_rank

    model = plan.model
    mb = args.honesty_micro_batch or plan.cap
    accum, reps = 8, 3
    plan = Plan(plan.label, model, "fl", mb, global_batch=mb * accum)
    folder = Path(args.cells_dir) / "honesty"
    spec, override = make_spec(plan, catalog, gpu, args, folder)
    spec["model"]["supports_compile"] = False  # the reference harness's "eager"
    spec["model"]["recipe"]["precision"] = "bf16"  # as measurements.md (the 410M recipe is fp16 + GradScaler)
    out: dict[str, Any] = {
        "model": model,
        "micro_batch": mb,
        "accum": accum,
        "reference_steps": f"1 warm-up + {reps}",
        "settings": "fl without compile (SDPA, TF32 on GPU, fused AdamW on GPU), bf16 autocast, grad clip 1.0",
        "override": {
            **override,
            "precision": f"bf16 (recipe: {catalog.model(model).recipe.precision})",
            "compile": False,
        },
    }
    cfg = RunConfig.from_spec(spec)
    env = init_rank(cfg)
    try:
        out.update(_honesty_measure(cfg, env, mb, accum, reps))
    finally:
        close_rank(env)
        out["gpu_bytes_left_after_cleanup"] = _cleanup()
    return out


# ------------------------------------------------------------------------------------------ report


def _f(x: Any, fmt: str = "{:.3f}", none: str = "–") -> str:
    if x is None:
        return none
    try:
        return fmt.format(x)
    except (TypeError, ValueError):
        return str(x)


def _trials(r: dict[str, Any]) -> str:
    trials = r.get("micro_batch_trials") or []
    return ", ".join(f"{t['micro_batch']} {'fits' if t['fits'] else 'OOM'} ({t['seconds']:.1f}s)" for t in trials) or (
        "–"
    )


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _check_text(rec: dict[str, Any]) -> str:
    checks = rec.get("checks") or []
    failed = [c for c, ok in checks if not ok]
    if failed:
        return "FAIL: " + "; ".join(failed)
    return f"all {len(checks)} pass" if checks else "–"


def _status_text(rec: dict[str, Any]) -> str:
    r = rec.get("result") or {}
    status = rec["status"] or "not run"
    if r.get("suspect"):
        status += " (SUSPECT)"
    if status in ("unsupported", "skipped", "oom", "error"):
        status += f": {r.get('reason') or rec.get('reason') or rec.get('error') or ''}"[:160]
    return status


def _setting(key: str):
    return lambda rec, r, s: _f(s.get(key), "{}")


# (header, value of a record) -- one list for the Markdown table and the table printed at the end
COLUMNS: list[tuple[str, Any]] = [
    ("cell", lambda rec, r, s: rec["label"]),
    ("status", lambda rec, r, s: _status_text(rec)),
    ("checks", lambda rec, r, s: _check_text(rec)),
    ("micro-batch", lambda rec, r, s: _f(r.get("micro_batch_size"), "{}")),
    ("accum", lambda rec, r, s: _f(r.get("grad_accum_steps"), "{}")),
    (
        "global batch (recipe)",
        lambda rec, r, s: (
            f"{(rec.get('override') or {}).get('global_batch', '–')} "
            f"({(rec.get('override') or {}).get('recipe_global_batch', '–')})"
        ),
    ),
    ("step median s", lambda rec, r, s: _f(r.get("step_time_s"), "{:.4f}")),
    ("p10", lambda rec, r, s: _f(r.get("step_time_p10_s"), "{:.4f}")),
    ("p90", lambda rec, r, s: _f(r.get("step_time_p90_s"), "{:.4f}")),
    ("tokens/s", lambda rec, r, s: _f(r.get("tokens_per_s"), "{:,.0f}")),
    ("MFU", lambda rec, r, s: _f(r.get("mfu"), "{:.1%}")),
    ("peak GiB", lambda rec, r, s: _f(r.get("peak_mem_gib"), "{:.1f}")),
    ("attention", _setting("attn_implementation")),
    ("attention kernel", _setting("attention_kernel")),
    ("compile", _setting("compile")),
    ("parallel", _setting("parallel")),
    ("tf32", _setting("tf32")),
    ("autocast", _setting("autocast")),
    ("grad scaler", _setting("grad_scaler")),
    ("fused AdamW", _setting("fused_optimizer")),
    ("micro-batch trials", lambda rec, r, s: _trials(r)),
    ("wall s", lambda rec, r, s: _f(rec.get("cell_wall_s"), "{:.0f}")),
]
SHORT_COLUMNS = ("cell", "status", "micro-batch", "step median s", "tokens/s", "MFU", "peak GiB", "attention kernel")


def table(records: list[dict[str, Any]], columns: tuple[str, ...] | None = None) -> str:
    """The cells as a Markdown table (all COLUMNS, or the named ones)."""
    cols = [(h, fn) for h, fn in COLUMNS if columns is None or h in columns]
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for rec in records:
        r = rec.get("result") or {}
        s = r.get("method_settings") or {}
        lines.append("| " + " | ".join(_md_escape(str(fn(rec, r, s))) for _, fn in cols) + " |")
    return "\n".join(lines)


def render(meta: dict[str, Any], records: list[dict[str, Any]], honesty: dict[str, Any] | None) -> str:
    L: list[str] = []
    a = L.append
    a(f"# GPU check of the trainer ({meta['mode']})\n")
    a("| | |\n|---|---|")
    rows = [
        ("date (UTC)", meta["date_utc"]),
        ("host", meta["host"]),
        ("GPU", meta.get("gpu_name") or "none (CPU)"),
        ("GPU memory", _f(meta.get("gpu_memory_gib"), "{} GiB")),
        ("driver", meta.get("driver") or "– (no nvidia-smi)"),
        ("nvidia-smi", meta.get("nvidia_smi") or "–"),
        ("torch / transformers", f"{meta['torch']} / {meta['transformers']}"),
        ("CUDA runtime / cuDNN", f"{meta['cuda_runtime']} / {meta['cudnn']}"),
        ("python", meta["python"]),
        ("command", f"`{meta['command']}`"),
        ("settings", meta["settings"]),
        (
            "wall time",
            _f(meta.get("wall_s"), "{:.0f} s")
            + (" (budget exceeded: cells skipped)" if meta.get("budget_exceeded") else ""),
        ),
        ("finished", "yes" if meta.get("finished") else "no (partial report, written after every cell)"),
    ]
    for k, v in rows:
        a(f"| {k} | {_md_escape(str(v))} |")
    a("")
    a(
        "Global batch: each cell's recipe batch (Pythia 1024, RoBERTa 8192) is overridden to "
        f"{meta['accum_factor']} x its micro-batch cap, so a step is a few accumulation micro-batches, not 64; "
        "step times, tokens/s and MFU are per optimizer step of that batch (tokens/s and MFU do not depend on it "
        "beyond the optimizer's share). Training days in result.json use the overridden step, so ignore them here.\n"
    )

    a("## Cells\n")
    a(
        "In run order (a budget cut skips the last cells). Checks: what must hold if the trainer's path works "
        "(status, or `unsupported` with a reason where the back-end is absent; device, attention and the kernel that "
        "ran, compile, TF32, fused AdamW, autocast, grad scaler, the parts' evidence, batch arithmetic, steps.jsonl, "
        "not suspect, finite loss; the OOM probe: a failed trial then a fit). Sharded cells run at world size 1.\n"
    )
    a(table(records))
    a("")
    a("Peak GiB: CUDA max allocated during the timed steps (on CPU: the process's max RSS, cumulative over the run).\n")

    a("## Against reference/measurements.md (one H200)\n")
    if meta["mode"].startswith("smoke"):
        a("Smoke mode: tiny models on the CPU; the reference figures are H200 numbers, so nothing is compared.\n")
    else:
        a("| cell | ours: micro-batch, tokens/s, MFU, peak GiB | reference | ratio tokens/s | ours vs reference |")
        a("|---|---|---|---|---|")
        for rec in records:
            key = rec["plan"].get("reference")
            r = rec.get("result") or {}
            if not key or r.get("status") != "ok":
                continue
            ref = REFERENCE[key]
            ratio = r["tokens_per_s"] / ref["tokens_per_s"] if r.get("tokens_per_s") else None
            s = r.get("method_settings") or {}
            diffs = []
            if s.get("attn_implementation") != "sdpa":
                diffs.append("eager attention (reference: SDPA)")
            if s.get("autocast") != "bfloat16":
                diffs.append(
                    f"{s.get('autocast')} autocast{' + GradScaler' if s.get('grad_scaler') else ''} (reference: bf16)"
                )
            if not s.get("fused_optimizer"):
                diffs.append("unfused Adam (reference: fused)")
            if bool(s.get("compile")) != ref["compile"]:
                diffs.append("compiled (reference: not)" if s.get("compile") else "not compiled (reference: compiled)")
            if s.get("tf32"):
                diffs.append("TF32 on")
            if r.get("micro_batch_size") != ref["mb"]:
                diffs.append(f"micro-batch {r.get('micro_batch_size')} (reference: {ref['mb']})")
            a(
                f"| {rec['label']} | mb {r.get('micro_batch_size')}, {_f(r.get('tokens_per_s'), '{:,.0f}')}, "
                f"{_f(r.get('mfu'), '{:.1%}')}, {_f(r.get('peak_mem_gib'), '{:.1f}')} | {ref['what']}: "
                f"{ref['tokens_per_s']:,}, {ref['mfu']:.1%}, {ref['peak_gib']} | {_f(ratio, '{:.2f}')} | "
                f"{'; '.join(diffs) or 'same settings'} |"
            )
        a("")
        a(
            "MFU here is against the recipe precision's dense peak (989 TFLOP/s for bf16 and fp16 on the H200), as "
            "in measurements.md. `naive` uses eager attention, no TF32 and unfused Adam, so it should be slower than "
            'the reference\'s SDPA "eager"; `fl` compares with the compiled figure where there is one.\n'
        )

    a("## Timing honesty: the reference benchmark's timer vs ours\n")
    if honesty is None:
        a("Not run.\n")
    elif honesty.get("status") != "ok":
        a(f"**{honesty.get('status')}**: {_md_escape(str(honesty.get('error') or honesty.get('reason')))}\n")
    else:
        h = honesty
        a(
            f"{h['model']}, micro-batch {h['micro_batch']}, {h['accum']} accumulation micro-batches per step; "
            f"{h['settings']}. Reference method: {h['reference_steps']} steps of one micro-batch, perf_counter, "
            f"step = mean(micro) x {h['accum']} + mean(optimizer).\n"
        )
        a("| timer | step s | mean micro s | mean optimizer s | vs actual |")
        a("|---|---|---|---|---|")
        for name, key, err in (
            ("reference (no synchronisation)", "reference_unsynchronised", "error_unsynchronised"),
            ("same, synchronised", "reference_synchronised", "error_synchronised"),
        ):
            d = h[key]
            a(
                f"| {name} | {d['step_s']:.4f} | {statistics.mean(d['micro_s']):.4f} | "
                f"{statistics.mean(d['optimizer_s']):.4f} | {h[err]:+.1%} |"
            )
        act = h["actual"]
        a(
            f"| actual: median of {len(act['step_times_s'])} whole synchronised steps (trainer.measure.time_steps, "
            f"{act['warmup_steps']} warm-up dropped) | {act['step_s']:.4f} | | | |"
        )
        a("")
        ref = REFERENCE_HONESTY.get(h["model"])
        if ref:
            a(
                f"measurements.md (H200, {h['model']}): reference {ref['reference']} s, synchronised "
                f"{ref['synchronised']} s, actual {ref['actual']} s, reference error {ref['error']:+.1%}.\n"
            )
        a("All step times (s): " + ", ".join(f"{t:.4f}" for t in act["step_times_s"]) + "\n")
        if h.get("method_settings", {}).get("device") == "cpu":
            a(
                "On the CPU there is no asynchronous device queue: both reference timers see the real work, so any gap "
                "to the actual step here is noise (machine load, caches), not the timer's error. The comparison means "
                "something on a GPU only.\n"
            )

    a("## Per cell\n")
    for rec in records:
        r = rec.get("result") or {}
        a(f"### {rec['label']}\n")
        a(
            f"status **{rec['status']}**"
            + (f": {_md_escape(str(rec.get('reason')))}" if rec.get("reason") else "")
            + (f" — result reason: {_md_escape(str(r.get('reason')))}" if r.get("reason") else "")
        )
        a("")
        if rec.get("override"):
            a(f"spec overrides: `{json.dumps(rec['override'])}`; files: `{rec.get('folder')}`\n")
        if rec.get("checks"):
            a("checks: " + ", ".join(f"{'PASS' if ok else '**FAIL**'} {c}" for c, ok in rec["checks"]) + "\n")
        if r.get("status") == "ok":
            a(
                f"device {r.get('device_name')}; step times (s): "
                + ", ".join(f"{st['time_s']:.4f}" for st in rec.get("steps") or [])
                + f"; final loss {_f(r.get('final_loss'), '{:.4f}')}"
                f"; flops/step {_f(r.get('flops_per_step'), '{:.3e}')}"
                f"; peak TFLOP/s {r.get('peak_tflops')}; trials: {_trials(r)}\n"
            )
            a(f"method settings: `{json.dumps(r.get('method_settings'))}`\n")
        if rec.get("gpu_bytes_left_after_cleanup") is not None:
            a(
                f"GPU memory still allocated after the cell and cleanup: "
                f"{rec['gpu_bytes_left_after_cleanup'] / 2**20:.1f} MiB\n"
            )
        if rec.get("error"):
            a(f"error: `{_md_escape(rec['error'][:500])}`\n\n```\n{rec.get('traceback', '')}\n```\n")
        if rec.get("cleanup_error"):
            a(f"cleanup error: `{_md_escape(rec['cleanup_error'])}`\n")
    if honesty and honesty.get("traceback"):
        a(f"### honesty check error\n\n```\n{honesty['traceback']}\n```\n")
    return "\n".join(L) + "\n"


def write_outputs(out: Path, meta: dict[str, Any], records: list[dict[str, Any]], honesty: dict[str, Any] | None):
    meta["wall_s"] = time.perf_counter() - T_START
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render(meta, records, honesty))
    tmp.replace(out)
    js = out.with_suffix(".json")
    tmp = js.with_name(js.name + ".tmp")
    tmp.write_text(json.dumps({"meta": meta, "cells": records, "honesty": honesty}, indent=1, default=str) + "\n")
    tmp.replace(js)


# ------------------------------------------------------------------------------------------ main


def safe_write(out: Path, meta: dict[str, Any], records: list[dict[str, Any]], honesty: dict[str, Any] | None):
    """Write the report after every cell (a run cut short still leaves one); never let it stop the run."""
    try:
        write_outputs(out, meta, records, honesty)
    except Exception:  # noqa: BLE001
        log("could not write the report:\n" + traceback.format_exc())
        with contextlib.suppress(Exception):
            out.with_suffix(".json").write_text(
                json.dumps({"meta": meta, "cells": records, "honesty": honesty}, default=str)
            )


def run_cell_plan(
    plan: Plan,
    catalog: Catalog,
    gpu: str,
    args: argparse.Namespace,
    cells_dir: Path,
    on_gpu: bool,
    records: list[dict[str, Any]],
) -> None:
    log(f"cell {plan.label} (micro-batch cap {plan.cap}) ...")
    rec = run_plan(plan, catalog, gpu, args, cells_dir)
    if rec.get("result") is not None or rec["status"] == "error":
        rec["checks"] = checks_for(plan, rec, on_gpu, catalog.gpu(gpu).to_dict())
    records.append(rec)
    r = rec.get("result") or {}
    failed = [c for c, ok in rec.get("checks") or [] if not ok]
    log(
        f"  -> {rec['status']}"
        + (f" ({rec.get('reason') or rec.get('error') or r.get('reason')})" if rec["status"] != "ok" else "")
        + (
            f": mb {r.get('micro_batch_size')} x {r.get('grad_accum_steps')}, step {_f(r.get('step_time_s'))} s, "
            f"{_f(r.get('tokens_per_s'), '{:,.0f}')} tok/s, MFU {_f(r.get('mfu'), '{:.1%}')}, "
            f"peak {_f(r.get('peak_mem_gib'), '{:.1f}')} GiB, trials [{_trials(r)}]"
            if r.get("status") == "ok"
            else ""
        )
        + (f"; FAILED CHECKS: {failed}" if failed else "")
        + f"; {rec.get('cell_wall_s')} s"
    )


def run_honesty(plan: Plan, catalog: Catalog, gpu: str, args: argparse.Namespace) -> dict[str, Any]:
    log(f"{plan.label}: {plan.model}, micro-batch {args.honesty_micro_batch or plan.cap} ...")
    t0 = time.perf_counter()
    try:
        honesty = honesty_check(plan, catalog, gpu, args)
        log(
            f"  -> reference (unsynchronised) {honesty['reference_unsynchronised']['step_s']:.4f} s, "
            f"synchronised {honesty['reference_synchronised']['step_s']:.4f} s, actual "
            f"{honesty['actual']['step_s']:.4f} s; reference error {honesty['error_unsynchronised']:+.1%}"
        )
    except Exception as exc:  # noqa: BLE001 - the cells after it still run
        honesty = {
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}"[:2000],
            "traceback": traceback.format_exc()[-6000:],
        }
        log(f"  -> error: {honesty['error']}")
        with contextlib.suppress(Exception):
            _cleanup()
    honesty["wall_s"] = round(time.perf_counter() - t0, 1)
    return honesty


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny models (GPU type `cpu`): checks the script itself")
    p.add_argument(
        "--out",
        default=str(REPO / "benchmarks/results/gpu_check.md"),
        help="Markdown report; the JSON dump (with every result.json and steps.jsonl) goes next to it (.json)",
    )
    p.add_argument(
        "--cells-dir",
        default=os.path.join(tempfile.gettempdir(), "gpu_check_cells"),
        help="where each cell's result.json / steps.jsonl are written (default: $TMPDIR/gpu_check_cells)",
    )
    p.add_argument("--warmup-steps", type=int, default=None, help="dropped steps per cell (default 2; smoke 1)")
    p.add_argument("--timed-steps", type=int, default=None, help="timed steps per cell (default 4; smoke 3)")
    p.add_argument(
        "--max-micro-batch", type=int, default=None, help="override every cell's micro-batch cap (not the OOM probe's)"
    )
    p.add_argument(
        "--accum-factor", type=int, default=None, help="global batch = this x micro-batch cap (default 4; smoke 2)"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="skip the remaining cells once this much wall time has passed (default 420)",
    )
    p.add_argument(
        "--cells",
        default=None,
        help="comma-separated substrings: run only cells whose label contains one (e.g. 'pythia-1b,OOM')",
    )
    p.add_argument("--no-honesty", action="store_true", help="skip the timing-honesty check")
    p.add_argument("--honesty-micro-batch", type=int, default=None, help="default 16 on GPU, 2 in smoke mode")
    p.add_argument("--gpu-type", default="h200", help="GPU type from config/gpus.yaml for GPU runs (default h200)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch CPU threads")
    p.add_argument("--models", default=str(REPO / "config/models.yaml"))
    p.add_argument("--gpus", default=str(REPO / "config/gpus.yaml"))
    args = p.parse_args(argv)
    if args.warmup_steps is None:
        args.warmup_steps = 1 if args.smoke else 2
    if args.timed_steps is None:
        args.timed_steps = 3 if args.smoke else 4
    if args.accum_factor is None:
        args.accum_factor = 2 if args.smoke else 4
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    on_gpu = not args.smoke
    if on_gpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible; use --smoke to check the script on the CPU", file=sys.stderr)
        return 2
    gpu = args.gpu_type if on_gpu else "cpu"
    catalog = load_catalog(args.models, args.gpus)
    out = Path(args.out)
    cells_dir = Path(args.cells_dir)
    plans = SMOKE_PLANS if args.smoke else GPU_PLANS
    if args.cells:
        wanted = [w.strip() for w in args.cells.split(",") if w.strip()]
        plans = [pl for pl in plans if any(w in pl.label for w in wanted)]

    meta = environment(args)
    meta.update(
        settings=f"gpu type {gpu}; warmup {args.warmup_steps}, timed {args.timed_steps} steps per cell; global batch = "
        f"{args.accum_factor} x micro-batch cap; budget {args.budget_s:.0f} s; launcher debug (in-process, 1 rank)",
        accum_factor=args.accum_factor,
        budget_s=args.budget_s,
        gpu_type=gpu,
        finished=False,
        budget_exceeded=False,
    )
    log(
        f"{meta['mode']}: {meta.get('gpu_name') or 'CPU'}, torch {meta['torch']}, transformers {meta['transformers']}"
        f", CUDA {meta['cuda_runtime']}, driver {meta.get('driver')}; {len(plans)} cells; report -> {out}"
    )

    records: list[dict[str, Any]] = []
    honesty: dict[str, Any] | None = None
    if args.no_honesty:
        honesty = {"status": "skipped", "reason": "--no-honesty"}
    elif not any(pl.kind == "honesty" for pl in plans):
        honesty = {"status": "skipped", "reason": f"not selected by --cells {args.cells!r}"}
    for plan in plans:
        if plan.kind == "honesty" and args.no_honesty:
            continue
        if time.perf_counter() - T_START > args.budget_s and not plan.skip:
            meta["budget_exceeded"] = True
            reason = f"time budget of {args.budget_s:.0f} s used up"
            if plan.kind == "honesty":
                honesty = {"status": "skipped", "reason": reason}
            else:
                records.append({"label": plan.label, "plan": asdict(plan), "status": "skipped", "reason": reason})
            log(f"SKIP {plan.label}: {reason}")
            safe_write(out, meta, records, honesty)
            continue
        if plan.kind == "honesty":
            honesty = run_honesty(plan, catalog, gpu, args)
        else:
            run_cell_plan(plan, catalog, gpu, args, cells_dir, on_gpu, records)
        safe_write(out, meta, records, honesty)

    cross_checks(records)
    meta["finished"] = True
    safe_write(out, meta, records, honesty)
    print(table(records, SHORT_COLUMNS), flush=True)
    bad = [r["label"] for r in records if r["status"] == "error" or any(not ok for _, ok in r.get("checks") or [])]
    log(
        f"done in {time.perf_counter() - T_START:.0f} s; report {out}, data {out.with_suffix('.json')}"
        + (f"; PROBLEMS in {bad}" if bad else "; every run cell passed its checks")
    )
    return 1 if bad or (honesty or {}).get("status") == "error" else 0


if __name__ == "__main__":
    sys.exit(main())
