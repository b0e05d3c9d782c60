"""Export the plan: for each model x GPU type x count, the settings that would pre-train it for real.

`results/optimal/{model}/{gpu}/{nodes}x{gpus_per_node}/` gets, for the fastest feasible method of
tables/time_to_train.csv:
- `training_arguments.json`: keyword arguments of `transformers.TrainingArguments` (micro-batch,
  accumulation, the recipe's optimizer, schedule, clipping and precision, the method's TF32 / compile /
  checkpointing / FSDP / DeepSpeed settings). Written as plain data: neither torch nor transformers is
  imported here. A ZeRO plan embeds its DeepSpeed config, so loading it needs deepspeed installed (as
  the run itself does).
- `deepspeed.json` when the method shards with ZeRO (slug parts zero1/zero2/zero3, with `off`).
- `launch.sh`: the torchrun line (inside `srun` on SLURM) that starts the run with those arguments.
- `plan.json`: what the plan rests on (the measurement, the model's architecture, the recipe) and the
  approximations a Hugging Face Trainer run makes of the recipe.
A setting where nothing fits gets a README.md saying so, and `index.csv` lists every setting.

`write_plan` writes one setting's folder from a time_to_train row and the measured cell's recorded settings; it
needs neither polars nor Snakemake (benchmarks/gpu_all.py exports a plan from a GPU cell with it).
"""

from __future__ import annotations

import csv
import io
import json
import math
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from pretrain_planner import layout, schema
from pretrain_planner.planning import methods
from pretrain_planner.planning.catalog import Catalog, GpuSpec, ModelSpec
from pretrain_planner.planning.configtypes import SiteFile
from pretrain_planner.planning.runspec import RunSpec, grad_sync_of
from pretrain_planner.planning.settings import differences, resolve
from pretrain_planner.results import atomic_write_text
from pretrain_planner.tables import units

WORKFLOW_DIR = str(Path(__file__).resolve().parents[2])  # where the package lives: launch.sh runs its train stage
# the measurement a plan rests on (plan.json `measured`): time_to_train's columns, a cell's result.json fields
MEASURED = ("micro_batch", "grad_accum_steps", "step_time_s", "step_time_p10_s", "step_time_p90_s",
            "tokens_per_s", "samples_per_s", "mfu", "peak_mem_gib", "training_days", "analytic_days")  # fmt: skip
INDEX_COLUMNS = ["model", "gpu", "nodes", "gpus_per_node", "world_size", "best_method", "training_days", "folder",
                 "files", "note"]  # fmt: skip


def _is_cpu(gpu: GpuSpec) -> bool:
    """The `cpu` stand-in GPU type (no CUDA: the run uses CPU processes and gloo)."""
    return gpu.name == "cpu"


def _schedule(model: ModelSpec, max_steps: int) -> tuple[dict[str, Any], list[str]]:
    """lr_scheduler_type / lr_scheduler_kwargs / warmup_steps for the recipe's schedule."""
    sched = model.recipe.schedule
    notes: list[str] = []
    name = sched.get("name", "constant")
    warmup: float | int = 0
    if sched.get("warmup_steps") is not None:
        warmup = int(sched["warmup_steps"])
    elif sched.get("warmup_fraction"):
        warmup = float(sched["warmup_fraction"])  # TrainingArguments reads a value < 1 as a ratio of max_steps
    out: dict[str, Any] = {"warmup_steps": warmup}
    if name == "cosine":
        if sched.get("min_lr_ratio") is not None:
            out.update(
                lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": sched["min_lr_ratio"]}
            )
        elif sched.get("min_lr") is not None:
            out.update(lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr": sched["min_lr"]})
        else:
            out["lr_scheduler_type"] = "cosine"
    elif name == "linear":
        out["lr_scheduler_type"] = "linear"
    elif name == "time-linear":
        out["lr_scheduler_type"] = "linear"
        notes.append(
            f"the recipe decays the learning rate linearly in wall-clock time over its "
            f"{model.recipe.time_budget_hours} h budget; this plan decays it over max_steps = {max_steps}, the steps "
            "that fit in the budget at the measured step time"
        )
    else:
        out["lr_scheduler_type"] = "constant_with_warmup" if warmup else "constant"
    return out, notes


def _max_steps(model: ModelSpec, step_time_s: float | None) -> int:
    if model.recipe.steps:
        return int(model.recipe.steps)
    if model.recipe.time_budget_hours and step_time_s:
        return max(1, math.floor(model.recipe.time_budget_hours * 3600 / step_time_s))
    raise ValueError(f"{model.name}: the recipe has neither steps nor a time budget with a measured step time")


def settings_for(
    model: ModelSpec, gpu: GpuSpec, row: dict[str, Any], recorded: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The method's concrete settings for one time_to_train row (planning.settings.resolve, as the trainer
    applied them); `recorded`: the cell's method_settings, for what only the measurement decides (FSDP2's
    gradient synchronisation)."""
    world = int(row["nodes"]) * int(row["gpus_per_node"])
    spec = RunSpec(model, gpu, methods.parse(row["best_method"]), world, nodes=int(row["nodes"]))
    return resolve(spec, int(row["micro_batch"]), int(row["grad_accum_steps"]), grad_sync_of(recorded)).as_dict()


def not_expressible(model: ModelSpec, settings: dict[str, Any]) -> list[dict[str, str]]:
    """The parts of the measured setting that `transformers.TrainingArguments` cannot express, each with why
    and what a user of their own Hugging Face script does instead."""
    out: list[dict[str, str]] = []

    def add(part: str, reason: str) -> None:
        out.append({"part": part, "reason": reason})

    if settings["attn_implementation"]:
        add("attn_implementation", f"a model argument, not a training one: build the model with "
            f"attn_implementation={settings['attn_implementation']!r} (plan.json model_init_kwargs)")  # fmt: skip
    if settings["optimizer"] == "Adam":
        add("optimizer", "the recipe's Adam adds weight decay to the gradient (L2); the Trainer's optimizers "
            "decouple it (AdamW): the plan uses AdamW with the same hyper-parameters")  # fmt: skip
    if not settings["no_decay_1d"] and settings["weight_decay"]:
        add("weight_decay_groups", "the measured run decays every parameter; the Trainer exempts biases and "
            "LayerNorm weights from weight decay")  # fmt: skip
    if settings["compile_optimizer"]:
        add("cstep", "the Trainer compiles the model only; the optimizer step (and clipping) runs eagerly")
    if settings["fused_ce"]:
        add("flce", "our fused linear + cross-entropy head has no Trainer switch; use_liger_kernel brings Liger's "
            "for the model types Liger patches")  # fmt: skip
    if settings["cudnn_benchmark"]:
        add("cudnn_benchmark", "set torch.backends.cudnn.benchmark = True in the training script")
    policy = settings["fsdp_policy"]
    if policy and policy.get("mesh"):
        add("hsdp", "the Trainer's FSDP2 config shards over every GPU; hybrid sharding (a replica per node) needs "
            f"accelerate's ParallelismConfig(dp_replicate_size={policy['mesh']['replicate']}, "
            f"dp_shard_size={policy['mesh']['shard']}) in the training script")  # fmt: skip
    if policy and policy["grad_sync"] == "every":
        add("fsdp grad_sync", "the measurement reduce-scattered gradients on every micro-batch (the unsharded "
            "accumulation did not fit); accelerate synchronises at the accumulation boundary only")  # fmt: skip
    if model.arch.get("sparse_prediction"):
        add("sparse_prediction", "the MLM head on the masked positions only is pretrain-planner's model class")
    if model.recipe.schedule.get("name") == "time-linear":
        add("time-linear schedule", "the Trainer schedules by steps: the plan decays over max_steps instead")
    return out


def training_arguments(
    model: ModelSpec,
    gpu: GpuSpec,
    row: dict[str, Any],
    seed: int = 0,
    output_dir: str | None = None,
    settings: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None, list[str]]:
    """(TrainingArguments kwargs, DeepSpeed config or None, notes) for one time_to_train row, from the method's
    concrete settings (`settings_for`): every part the Trainer can express, nothing it cannot."""
    s = settings or settings_for(model, gpu, row)
    r, opt = model.recipe, model.recipe.optimizer
    cpu = _is_cpu(gpu)
    micro_batch, accum = int(row["micro_batch"]), int(row["grad_accum_steps"])
    world = int(row["nodes"]) * int(row["gpus_per_node"])
    max_steps = _max_steps(model, row.get("step_time_s"))
    notes: list[str] = []
    if micro_batch * accum * world != r.global_batch:
        notes.append(
            f"micro-batch {micro_batch} x {accum} x {world} GPUs != the recipe's global batch {r.global_batch}"
        )
    slug = s["method"].replace("+", "-")
    args: dict[str, Any] = {
        "output_dir": output_dir or f"runs/{model.name}-{gpu.name}-{row['nodes']}x{row['gpus_per_node']}-{slug}",
        "per_device_train_batch_size": micro_batch,
        "gradient_accumulation_steps": accum,
        "max_steps": max_steps,
        "learning_rate": opt.lr,
        "adam_beta1": opt.betas[0],
        "adam_beta2": opt.betas[1],
        "adam_epsilon": opt.eps,
        "weight_decay": opt.weight_decay,
        "optim": "adamw_torch_fused" if s["fused_optimizer"] else "adamw_torch",
        "max_grad_norm": float(r.grad_clip or 0.0),
        "bf16": s["precision"] == "bf16",
        "fp16": s["precision"] == "fp16",
        "tf32": s["tf32"],
        "torch_compile": s["compile"],
        "gradient_checkpointing": s["activation_checkpointing"],
        "use_cpu": cpu,
        "seed": seed,
        "logging_steps": 10,
        "save_strategy": "steps",
        "save_steps": min(1000, max_steps),
        "save_total_limit": 3,
        "report_to": "none",
        "dataloader_drop_last": True,
    }
    if s["compile"] and s["compile_mode"] != "default":
        args["torch_compile_mode"] = s["compile_mode"]  # reduce-overhead: CUDA graphs (`cg`)
    if s["activation_checkpointing"]:
        args["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    if s["liger"]:
        args["use_liger_kernel"] = True
    schedule, sched_notes = _schedule(model, max_steps)
    args.update(schedule)
    notes += sched_notes
    if not r.grad_clip:
        notes.append("the recipe does not clip gradients: max_grad_norm 0 disables clipping")
    if world > 1:
        args["ddp_find_unused_parameters"] = False
    if s["base"] == "fl" and not s["compile"]:
        notes.append(f"{model.name} does not support torch.compile: free-lunch runs it eagerly")
    ds = s["deepspeed_config"]
    if ds is not None:
        args["deepspeed"] = ds
        if ds["zero_optimization"]["stage"] == 3:
            notes.append("ZeRO-3 partitions the model as it is built: parse the TrainingArguments and call "
                         "deepspeed.init_distributed() before building the model")  # fmt: skip
    elif s["fsdp_policy"]:
        policy = s["fsdp_policy"]
        args["fsdp"] = True
        args["fsdp_config"] = {
            "version": 2,
            "reshard_after_forward": policy["reshard_after_forward"],
            "cpu_offload": policy["cpu_offload"],
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        }
    return args, ds, notes


# launch.sh's rendezvous port, on the allocation's first node: the rule of the benchmark's SLURM jobs
PORT_CODE = "import sys; from pretrain_planner.launch.rankjob import rendezvous_port as p; print(p(sys.argv[1]))"


def _one_line(text: Any) -> str:
    """A config value as comment text: one line (a newline in a GPU type's free-text name would start shell)."""
    return " ".join(str(text).split())


def _sbatch_lines(site: dict[str, Any] | None, gpu: GpuSpec, nodes: int, gpn: int) -> str:
    """The #SBATCH lines the benchmark's jobs asked of the site for this GPU type (partition, account, QOS, GPU
    request, CPUs, memory, its extra options), as one torchrun task per node asks them; without a site, GPUs only.
    Both: the time-limit warning to the batch shell (`--signal=B:USR1@signal_delay_s`: the script has the ranks
    checkpoint and requeues the job) and `--requeue`."""
    # a plan exported without a site file warns as early as the site schema's default
    delay = int((site or {}).get("signal_delay_s") or schema.default("site", "defaults.signal_delay_s"))
    resume = f"#SBATCH --signal=B:USR1@{delay}\n#SBATCH --requeue\n"
    if site is None:
        return resume + ("" if _is_cpu(gpu) else f"#SBATCH --gpus-per-node={gpn}\n")
    from pretrain_planner.planning.site import sbatch_parameters

    params = sbatch_parameters(site, nodes, gpn, "")
    params["cpus_per_task"] = site["cpus_per_gpu"] * gpn  # one task per node: torchrun starts its gpn ranks
    keys = ("partition", "constraint", "account", "qos", "gres", "gpus_per_node", "cpus_per_task", "mem")
    lines = [f"--{k.replace('_', '-')}={params[k]}" for k in keys if params.get(k)]
    for k, v in (params.get("additional_parameters") or {}).items():
        if v is not False:  # extra_sbatch {exclusive: false}: not asked
            lines.append(f"--{k}" if v is True else f"--{k}={v}")
    return resume + "".join(f"#SBATCH {line}\n" for line in lines)


def launch_script(
    model: ModelSpec,
    gpu: GpuSpec,
    row: dict[str, Any],
    python: str | None = None,
    folder: Path | None = None,
    site: dict[str, Any] | None = None,
) -> str:
    """A bash script: torchrun on this host (one node), or srun + torchrun inside a SLURM allocation, both with the
    interpreter the site's jobs run (`site`: the GPU type's settings: its `python`, `container`, modules, env and
    setup lines, and what its jobs ask of sbatch), else the one that exported it (`python`, default this one); the
    script's PYTHON and CONTAINER override."""
    from pretrain_planner.planning.site import job_lines, shell_path

    nodes, gpn = int(row["nodes"]), int(row["gpus_per_node"])
    days = row.get("training_days")
    days_txt = units.days(days) if days is not None and not math.isnan(days) else "an unknown time"
    sbatch = _sbatch_lines(site, gpu, nodes, gpn)
    hours = max(1, math.ceil(days * 24 * 1.1)) if days and not math.isnan(days) else 24
    interpreter = (site or {}).get("python") or python or sys.executable
    container = (site or {}).get("container") or ""
    lines = job_lines(site or {})
    head = f"# the site's modules, environment and setup lines (its site file's gpus.{gpu.name})"
    prepare = "".join(f"{line}\n" for line in [head, *lines]) if lines else ""
    title = f"{model.name} on {nodes} x {gpn} {_one_line(gpu.label)} ({_one_line(gpu.name)})"
    return f"""#!/usr/bin/env bash
# Pre-train {title} with method {row["best_method"]}:
# micro-batch {row["micro_batch"]} x {row["grad_accum_steps"]} accumulation steps per GPU, measured step
# {units.step(row["step_time_s"])} -> about {days_txt} for the recipe's steps. Generated by pretrain-planner.
#
# By default it runs pretrain-planner's train stage on plan.json (python -m pretrain_planner.train: the method
# exactly as measured, the recipe's optimizer and schedule, checkpoints and exact resume, and its throughput
# against this measurement in result.json / throughput.md); arguments of this script are passed on (--steps N,
# --time-budget-h H, --data PATH, --tokenizer PATH, --out DIR). TRAIN_SCRIPT=your_script.py runs your own
# Hugging Face Trainer script instead, with the path of training_arguments.json as its first argument
# (HfArgumentParser(TrainingArguments).parse_json_file(sys.argv[1])); plan.json lists what those arguments
# cannot express (not_expressible). Run it on one node as `bash launch.sh`, or submit it with `sbatch launch.sh`
# (add your account/partition; the time limit below is the estimate + 10%, capped by your site: a run that long
# needs checkpoint/resume across jobs, which the train stage has).
#SBATCH --job-name=pp-train-{model.name}-{gpu.name}-{nodes}x{gpn}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
{sbatch}#SBATCH --time={hours // 24}-{hours % 24:02d}:00:00
{prepare}set -euo pipefail
# The interpreter the site's jobs run (else the one this plan was exported with): its torch and the package;
# PYTHON=... overrides it, CONTAINER=... (a command prefix, e.g. "apptainer exec --nv image.sif") runs it inside a
# container. torchrun is started as `$PYTHON -m torch.distributed.run`, so neither it nor the venv needs to be on
# PATH (inside an sbatch job included).
PYTHON=${{PYTHON:-{shell_path(interpreter)}}}
CONTAINER=${{CONTAINER-{shlex.quote(container) if container else ""}}}
read -r -a RUN <<< "$CONTAINER"
RUN+=("$PYTHON")
# The plan's folder: this script's, or under sbatch (which runs a copy from SLURM's spool) the submitted script's;
# else where it was exported to. PLAN_DIR=... overrides.
if [[ -z "${{PLAN_DIR:-}}" ]]; then
  PLAN_DIR="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
  if [[ ! -f "$PLAN_DIR/plan.json" && -n "${{SLURM_JOB_ID:-}}" ]]; then
    submitted="$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | tr ' ' '\n' | sed -n 's/^Command=//p' | head -n 1)"
    [[ -n "$submitted" && -f "$(dirname "$submitted")/plan.json" ]] && PLAN_DIR="$(cd "$(dirname "$submitted")" && pwd)"
  fi
  [[ -f "$PLAN_DIR/plan.json" ]] || PLAN_DIR={shlex.quote(str(folder)) if folder else '"$PLAN_DIR"'}
fi
[[ -f "$PLAN_DIR/plan.json" ]] || {{ echo "launch.sh: no plan.json in $PLAN_DIR (set PLAN_DIR=...)" >&2; exit 2; }}
export PYTHONPATH="{WORKFLOW_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"
if [[ -n "${{TRAIN_SCRIPT:-}}" ]]; then
  ENTRY=("$TRAIN_SCRIPT" "$PLAN_DIR/training_arguments.json")
else
  ENTRY=(-m pretrain_planner.train "$PLAN_DIR/plan.json")
fi
NNODES={nodes}
NPROC_PER_NODE={gpn}
export HF_HUB_OFFLINE="${{HF_HUB_OFFLINE:-1}}"
# A run that refuses to start (a checkpoint of another run in its folder) writes its one line here and its ranks
# exit 0, so that torchrun adds no traceback; this script then exits 2 (under SLURM a file the first node can see)
REFUSAL_DIR="${{TMPDIR:-/tmp}}"
[[ -n "${{SLURM_JOB_ID:-}}" ]] && REFUSAL_DIR="${{SLURM_SUBMIT_DIR:-$PLAN_DIR}}"
export PP_REFUSAL_FILE="$(mktemp "$REFUSAL_DIR/.pp-train-refusal.XXXXXX")"
trap 'rm -f "$PP_REFUSAL_FILE"' EXIT
if [[ -n "${{SLURM_JOB_ID:-}}" ]]; then
  MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
  # the rendezvous port from the job id, below the kernel's ephemeral range (the benchmark's jobs' rule): a fixed
  # port (torchrun's 29500) collides with other users' runs on a shared node
  PORT="$("${{RUN[@]}}" -c {shlex.quote(PORT_CODE)} "$SLURM_JOB_ID")"
  # The time-limit warning (--signal=B:USR1 above) comes to this shell: the ranks' step is sent SIGTERM (the train
  # stage finishes its step and checkpoints), then the job is requeued and its next start resumes there.
  WARNED=0
  # (scancel --signal reaches every step's processes, torchrun's agent and its ranks, not this shell)
  trap 'WARNED=1; echo "launch.sh: time-limit warning: checkpointing, then requeue" >&2
        scancel --signal=TERM "$SLURM_JOB_ID" || true' USR1
  srun --nodes="$NNODES" --ntasks-per-node=1 \\
    "${{RUN[@]}}" -m torch.distributed.run --nnodes="$NNODES" --nproc-per-node="$NPROC_PER_NODE" \\
      --rdzv-id="$SLURM_JOB_ID" --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$PORT" \\
      "${{ENTRY[@]}}" "$@" &
  STEP=$!
  while :; do  # a trap ends `wait` early: wait again until the step has ended
    wait "$STEP" && STATUS=0 || STATUS=$?
    kill -0 "$STEP" 2>/dev/null || break
  done
  [[ -s "$PP_REFUSAL_FILE" ]] && exit 2
  if [[ "$WARNED" == 1 ]]; then
    scontrol requeue "$SLURM_JOB_ID" && exit 0
    echo "launch.sh: the site refused to requeue job $SLURM_JOB_ID: submit this script again with the same" \\
      "arguments, it resumes from the checkpoint" >&2
    exit 1
  fi
  exit "$STATUS"
elif [[ "$NNODES" -eq 1 ]]; then
  "${{RUN[@]}}" -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node="$NPROC_PER_NODE" \\
    "${{ENTRY[@]}}" "$@" && STATUS=0 || STATUS=$?
  [[ -s "$PP_REFUSAL_FILE" ]] && exit 2
  exit "$STATUS"
else
  echo "this plan spans $NNODES nodes: submit it with sbatch (or run it inside a SLURM allocation)" >&2
  exit 2
fi
"""


def _plan_record(
    model: ModelSpec, gpu: GpuSpec, row: dict[str, Any], notes: list[str], settings: dict[str, Any] | None = None
) -> dict[str, Any]:
    s = settings or settings_for(model, gpu, row)
    method = methods.parse(row["best_method"])
    return {
        "model": model.to_dict(),
        "gpu": gpu.to_dict(),
        "nodes": row["nodes"],
        "gpus_per_node": row["gpus_per_node"],
        "method": method.slug,
        "method_description": method.describe(),
        "attn_implementation": s["attn_implementation"],
        "model_init_kwargs": {"attn_implementation": s["attn_implementation"]} if s["attn_implementation"] else {},
        "method_settings": s,
        "not_expressible": not_expressible(model, s),
        "measured": {k: row.get(k) for k in MEASURED},
        # does this method train the same model as naive (tables/loss_check.md; the curves every verdict rests on)
        "loss_check": {
            "verdict": row.get("loss") or "not checked",
            "passed_over": row.get("passed_over"),
            "curves": row.get("loss_curves"),
        },  # fmt: skip
        "notes": notes,
    }


def _recorded_settings(results: Path, folder: str, method: str) -> dict[str, Any] | None:
    """The method_settings the measured cell recorded (None: no readable result.json)."""
    path = Path(layout.cell_file(results, folder, method))
    try:
        return json.loads(path.read_text()).get("method_settings") or None
    except (OSError, ValueError):
        return None


def _write(path: Path, text: str) -> None:
    """Plain write: the folder is one Snakemake output, marked incomplete as a whole if the rule fails (an
    fsync per file would make a 400-setting export take seconds)."""
    path.write_text(text)


def _clean(v: Any) -> Any:
    return None if isinstance(v, float) and math.isnan(v) else v


def _no_plan(target: Path, model: str, folder: str, why: str) -> dict[str, Any]:
    _write(target / "README.md", f"# No plan for {model} on {folder}\n\n{why}.\n")
    return {"files": "README.md", "note": why}


def _export_setting(
    target: Path,
    f: dict[str, Any],
    row: dict[str, Any] | None,
    catalog: Catalog,
    results: Path,
    seed: int,
    site: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One setting's folder: its plan, or a README saying why there is none (`site`: the GPU type's site settings,
    where the sweep ran on SLURM). Returns the index fields."""
    from pretrain_planner.tables.aggregate import GROUP

    folder = layout.setting_folder(*(f[k] for k in GROUP))
    model, gpu = catalog.models.get(f["model"]), catalog.gpus.get(f["gpu"])
    if row is None:
        return _no_plan(target, f["model"], folder, f"no feasible method: {f['verdict']} (naive: {f['naive']}, "
                        f"fl: {f['fl']})")  # fmt: skip
    if model is None or gpu is None:
        return _no_plan(target, f["model"], folder, f"{f['model']} or {f['gpu']} is no longer in the catalog")
    row = {k: _clean(v) for k, v in row.items()}
    curves = Path(layout.loss_check_dir(results, folder)) / layout.LOSS_CURVES
    row["loss_curves"] = str(curves.resolve()) if curves.is_file() else None
    recorded = _recorded_settings(results, folder, row["best_method"])
    return write_plan(target, model, gpu, row, recorded, seed, site=site)


def write_plan(
    target: Path,
    model: ModelSpec,
    gpu: GpuSpec,
    row: dict[str, Any],
    recorded: dict[str, Any] | None,
    seed: int = 0,
    site: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One setting's plan in `target` from its time_to_train `row` (model, gpu, nodes, gpus_per_node, best_method,
    the measurement's fields) and the measured cell's `recorded` method_settings (None: not found); a README
    instead where the cell ran other settings than the plan would. Returns the index fields."""
    group = (row["model"], row["gpu"], row["nodes"], row["gpus_per_node"])
    settings = settings_for(model, gpu, row, recorded)
    differ = differences(settings, recorded or {})
    if differ:
        cell = layout.cell_path(*group, row["best_method"])
        why = (
            f"the measured cell ran other settings than this plan would ({'; '.join(differ)}): re-measure it with "
            f"this version (delete {cell}) before exporting"
        )
        return _no_plan(target, model.name, layout.setting_folder(*group), why)
    args, ds, notes = training_arguments(model, gpu, row, seed, settings=settings)
    if recorded is None:
        notes.append("the measured cell's result.json was not found: settings as planned, not as recorded")
    files = ["training_arguments.json", "launch.sh", layout.PLAN_FILE]
    _write(target / "training_arguments.json", json.dumps(args, indent=1) + "\n")
    if ds is not None:
        _write(target / "deepspeed.json", json.dumps(ds, indent=1) + "\n")
        files.append("deepspeed.json")
    _write(target / "launch.sh", launch_script(model, gpu, row, folder=Path(target).resolve(), site=site))
    (target / "launch.sh").chmod(0o755)
    _write(target / layout.PLAN_FILE, json.dumps(_plan_record(model, gpu, row, notes, settings), indent=1) + "\n")
    return {"best_method": row["best_method"], "training_days": row["training_days"], "files": " ".join(files),
            "note": "; ".join(notes)}  # fmt: skip


def export_plans(
    time_to_train_csv: str,
    feasibility_csv: str,
    out_dir: str,
    log_path: str,
    catalog: Catalog,
    seed: int = 0,
    results_dir: str | None = None,
    site: SiteFile | None = None,
) -> list[dict[str, Any]]:
    """The `export` rule: one folder per model x GPU x count, and index.csv. A setting whose measured cell
    recorded settings other than the plan's gets no plan but a README saying which (results_dir: where the
    cells are; default the folder above `out_dir`). `site`: the sweep's site (launcher slurm): each launch.sh asks
    what its GPU type's cells asked and starts the interpreter they ran."""
    from pretrain_planner.tables.aggregate import GROUP, read_table

    out = Path(out_dir)
    results = Path(results_dir) if results_dir else out.parent
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    ttt = read_table(time_to_train_csv)
    feas = read_table(feasibility_csv)
    best = {tuple(r[k] for k in GROUP): r for r in ttt.iter_rows(named=True)}
    index, log = [], []
    for f in feas.sort(GROUP).iter_rows(named=True):
        key = tuple(f[k] for k in GROUP)
        folder = layout.setting_folder(*key)
        target = out / folder
        target.mkdir(parents=True, exist_ok=True)
        entry = {**{k: f[k] for k in GROUP}, "world_size": f["world_size"], "best_method": None,
                 "training_days": None, "folder": folder, "files": "", "note": ""}  # fmt: skip
        gpu_site = site.gpus.get(f["gpu"]) if site else None
        entry.update(_export_setting(target, f, best.get(key), catalog, results, seed, gpu_site))
        index.append(entry)
        log.append(f"{folder}: {entry['best_method'] or entry['note']}")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=INDEX_COLUMNS)
    writer.writeheader()
    writer.writerows(index)
    atomic_write_text(out / layout.OPTIMAL_INDEX, buf.getvalue())
    planned = sum(1 for e in index if e["best_method"])
    atomic_write_text(
        log_path, f"{planned} plans, {len(index) - planned} settings without one\n" + "\n".join(log) + "\n"
    )
    return index
