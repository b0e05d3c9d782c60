"""One translation from a method to the concrete settings that run it.

`resolve` turns a run (planning/runspec.py: model with its recipe, GPU type, method, world size, device) at a
micro-batch and accumulation into every setting a consumer needs (`Settings`, typed): the attention
implementation, compilation, TF32, precision and loss scaling, the optimizer, activation checkpointing, the
parallelism with its FSDP2 policy or its exact DeepSpeed config, and the kernel switches. The benchmark trainer
applies these values, the export writes them, the budget and train stages run them: what is measured is what is
exported is what is run. A cell's `result.json` records them (with what was observed) in `method_settings`, and
the export refuses a plan whose measured settings differ.

Plain data, no torch: the planner and the export call it on a login node.

DeepSpeed ZeRO values (docs/methods.md): ZeRO-2 and ZeRO-3 take the study's communication settings
(apoorvkh/academic-pretraining src/train.py: overlap_comm, contiguous gradients, 2e8-element buckets for ZeRO-2),
so a ZeRO cell measures the configuration the study measured; the values DeepSpeed or Hugging Face would
leave to "auto" are written out (ZeRO-3's reduce bucket hidden², prefetch 0.9·hidden², persistence 10·hidden:
Hugging Face's rule, hidden being the config's `hidden_size` or else the largest of its `hidden_sizes`, as
ConvNeXt's), so the exported config is the one that ran. The optimizer stays the recipe's torch
optimizer (fused AdamW on CUDA under free-lunch), as in every other method, so a ZeRO cell differs from its
DDP twin by the sharding only; ZeRO-Offload needs DeepSpeed's CPU Adam, named in the config.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from typing import Any

from pretrain_planner.planning.families import FAMILIES
from pretrain_planner.planning.methods import HYBRID, SHARDING_ENGINE, ZERO_STAGE, Method
from pretrain_planner.planning.runspec import RunSpec
from pretrain_planner.schema import ConfigError


@dataclass(frozen=True)
class Settings:
    """Every concrete setting of a run's method (`resolve`), in the order a cell's result.json records them in
    method_settings (KEYS)."""

    method: str
    base: str
    attn_implementation: str | None
    compile: bool
    compile_mode: str | None
    compile_dynamic: bool | None
    compile_optimizer: bool
    cuda_graphs: bool
    tf32: bool
    cudnn_benchmark: bool
    precision: str
    autocast: str | None
    grad_scaler: str | None
    activation_checkpointing: bool
    parallel: str
    fsdp_policy: dict[str, Any] | None
    deepspeed_config: dict[str, Any] | None
    optimizer: str
    fused_optimizer: bool
    lr: float
    betas: list[float]
    eps: float
    weight_decay: float
    no_decay_1d: bool
    liger: bool
    fused_ce: bool
    flash_attn: bool

    def as_dict(self) -> dict[str, Any]:
        """JSON-able, in KEYS order (a copy: the trainer and the export add what was applied)."""
        return {k: copy.deepcopy(getattr(self, k)) for k in KEYS}


KEYS = tuple(f.name for f in fields(Settings))
STEPS_PER_PRINT = 2**31 - 1  # DeepSpeed's progress log: never (the trainer logs its own)
ZERO2_BUCKET = 200_000_000  # the study's ZeRO-2 allgather / reduce bucket (elements)
AUTOCAST = {"bf16": "bfloat16", "fp16": "float16", "fp32": None}


def has_attention(model: dict[str, Any]) -> bool:
    """Whether the family has attention layers that take `attn_implementation`."""
    return FAMILIES[model["family"]].attention


def attention_for(method: Method) -> str:
    """The attention implementation of a method: eager (naive), SDPA (fl), flash-attn 2 (fl+fa2)."""
    if method.flash_attn:
        return "flash_attention_2"
    return "sdpa" if method.free_lunch else "eager"


def attn_implementation(method: Method, model: dict[str, Any]) -> str | None:
    """`attention_for(method)`; None for a family without attention layers."""
    return attention_for(method) if has_attention(model) else None


def compiles(method: Method, model: dict[str, Any]) -> bool:
    """torch.compile of the model: under free-lunch, where the model allows it."""
    return bool(method.free_lunch and model.get("supports_compile", True))


def auto_hidden_size(model: dict[str, Any]) -> int:
    """The `hidden_size` Hugging Face's Trainer fills ZeRO's "auto" buckets from (transformers
    integrations/deepspeed.py `trainer_config_finalize`): the model config's `hidden_size`, else the largest of its
    `hidden_sizes` (ConvNeXt's per-stage widths), else its text config's; it refuses a config with neither, and so
    do we (the arch keys a family requires, families.py, always give one)."""
    arch = model.get("arch", {})
    for cfg in (arch, arch.get("text_config") or {}):
        if cfg.get("hidden_size"):
            return int(cfg["hidden_size"])
        if cfg.get("hidden_sizes"):
            return int(max(cfg["hidden_sizes"]))
    raise ConfigError(
        f"model {model.get('name', '?')!r}: ZeRO-3's buckets need arch.hidden_size or arch.hidden_sizes "
        "(Hugging Face's rule for its 'auto' values), and the model has neither"
    )


def deepspeed_config(
    method: Method, model: dict[str, Any], micro_batch: int, accum: int, world_size: int, cuda: bool
) -> dict[str, Any] | None:
    """The exact DeepSpeed config of a zero1/2/3 method (None otherwise), at one micro-batch size."""
    stage = ZERO_STAGE.get(method.sharding or "")
    if stage is None:
        return None
    recipe = model["recipe"]
    zero: dict[str, Any] = {"stage": stage}
    if stage == 2:
        zero.update(
            allgather_partitions=True, allgather_bucket_size=ZERO2_BUCKET, overlap_comm=True, reduce_scatter=True,
            reduce_bucket_size=ZERO2_BUCKET, contiguous_gradients=True,
        )  # fmt: skip
    elif stage == 3:
        hidden = auto_hidden_size(model)
        zero.update(
            overlap_comm=True, contiguous_gradients=True, sub_group_size=1_000_000_000,
            reduce_bucket_size=hidden * hidden, stage3_prefetch_bucket_size=int(0.9 * hidden * hidden),
            stage3_param_persistence_threshold=10 * hidden, stage3_max_live_parameters=1_000_000_000,
            stage3_max_reuse_distance=1_000_000_000, stage3_gather_16bit_weights_on_model_save=True,
        )  # fmt: skip
    if method.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": cuda}
    precision = recipe["precision"]
    config: dict[str, Any] = {
        "train_batch_size": micro_batch * accum * world_size,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": float(recipe.get("grad_clip") or 0.0),
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16", **({"loss_scale": 0} if precision == "fp16" else {})},
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
    }
    if method.offload:  # ZeRO-Offload refuses a client optimizer: DeepSpeed's CPU Adam from the config
        opt = recipe["optimizer"]
        config["optimizer"] = {
            "type": "Adam",
            "params": {
                "lr": opt["lr"], "betas": list(opt["betas"]), "eps": opt["eps"], "weight_decay": opt["weight_decay"],
                "adam_w_mode": opt["name"] == "adamw",
            },
        }  # fmt: skip
    return config


def fsdp_policy(
    method: Method, model: dict[str, Any], cuda: bool, grad_sync: str | None, mesh: list[int] | None = None
) -> dict[str, Any] | None:
    """FSDP2's policy for fsdp-grad / fsdp-full / hsdp (None otherwise). Mixed precision casts the parameters to the
    recipe's dtype with fp32 gradient reduction, except compiled on a CPU (inductor's C++ backend fails on bf16
    parameters): autocast over fp32 parameters there. `mesh`: hsdp's [nodes, ranks per node] (replicate, shard)."""
    if SHARDING_ENGINE.get(method.sharding or "") != "fsdp":
        return None
    dtype = AUTOCAST[model["recipe"]["precision"]]
    policy = dtype is not None and not (compiles(method, model) and not cuda)
    return {
        "reshard_after_forward": method.sharding in ("fsdp-full", "hsdp"),
        "mesh": {"replicate": mesh[0], "shard": mesh[1]} if method.sharding in HYBRID and mesh else None,
        "mixed_precision": {"param_dtype": dtype, "reduce_dtype": "float32"} if policy else None,
        "cpu_offload": method.offload,
        "pin_memory": bool(method.offload and cuda),
        "grad_sync": grad_sync or "last",
    }


def resolve(spec: RunSpec, micro_batch: int, accum: int, grad_sync: str | None = None) -> Settings:
    """Every concrete setting of `spec`'s method for its model (and recipe) on its GPU type and device.

    `grad_sync`: FSDP2's gradient synchronisation that the measurement found to fit ("last": once per step;
    "every": on each micro-batch)."""
    m, cuda, world_size = spec.method, spec.on_cuda, spec.world_size
    model = {**spec.model.to_dict(), "compile_dynamic": spec.compile_dynamic}
    gpu_tf32 = spec.gpu.tf32
    recipe, opt = model["recipe"], model["recipe"]["optimizer"]
    compiled = compiles(m, model) and spec.compile_model
    engine = SHARDING_ENGINE.get(m.sharding or "")
    precision = recipe["precision"]
    if engine == "zero":
        parallel = "deepspeed"
    elif engine == "fsdp":
        parallel = "fsdp2"
    else:
        parallel = "ddp" if world_size > 1 else "single"
    fsdp = fsdp_policy(m, model, cuda, grad_sync, [spec.nodes, spec.shard_ranks])
    autocast = None if engine == "zero" or (fsdp and fsdp["mixed_precision"]) else AUTOCAST[precision]
    if precision != "fp16":
        scaler = None
    elif engine == "zero":
        scaler = "DeepSpeed dynamic loss scaling"
    else:
        scaler = "ShardedGradScaler" if engine == "fsdp" else "GradScaler"
    ds_offload = engine == "zero" and m.offload
    return Settings(
        method=m.slug,
        base=m.base,
        attn_implementation=attn_implementation(m, model),
        compile=compiled,
        compile_mode=("reduce-overhead" if m.compile_mode == "cg" else "default") if compiled else None,
        compile_dynamic=model["compile_dynamic"] if compiled else None,
        # cstep compiles the optimizer step, also where a stage leaves the model eager
        compile_optimizer=bool(compiles(m, model) and m.compile_mode == "cstep"),
        cuda_graphs=bool(compiled and m.compile_mode == "cg"),
        tf32=bool(m.free_lunch and cuda and gpu_tf32),
        cudnn_benchmark=bool(m.free_lunch and cuda),
        precision=precision,
        autocast=autocast,
        grad_scaler=scaler,
        activation_checkpointing=m.checkpointing,
        parallel=parallel,
        fsdp_policy=fsdp,
        deepspeed_config=deepspeed_config(m, model, micro_batch, accum, world_size, cuda),
        optimizer="DeepSpeedCPUAdam" if ds_offload else ("AdamW" if opt["name"] == "adamw" else "Adam"),
        # fused AdamW on CUDA under free-lunch; FSDP's CPU offload steps CPU tensors, ZeRO-Offload its CPU Adam
        fused_optimizer=bool(m.free_lunch and cuda and not m.offload),
        lr=opt["lr"],
        betas=list(opt["betas"]),
        eps=opt["eps"],
        weight_decay=opt["weight_decay"],
        no_decay_1d=bool(opt.get("no_decay_1d")),
        liger=m.liger,
        fused_ce=m.fused_ce,
        flash_attn=m.flash_attn,
    )


def differences(planned: dict[str, Any], recorded: dict[str, Any]) -> list[str]:
    """The keys of `resolve` whose recorded value differs from the planned one (keys a result lacks are skipped:
    measured before they were recorded)."""
    out = []
    for key in KEYS:
        if key in planned and key in recorded and _norm(planned[key]) != _norm(recorded[key]):
            out.append(f"{key}: measured {recorded[key]!r}, planned {planned[key]!r}")
    return out


def _norm(value: Any) -> Any:
    """JSON's view of a value: tuples are lists (1 and 1.0 compare equal as they do in Python)."""
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    return value
