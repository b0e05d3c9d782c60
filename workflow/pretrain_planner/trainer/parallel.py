"""How the method is applied to the model on a rank (rank.py: where the rank runs).

`apply_method` covers the torch-native methods: a single rank, DDP, activation checkpointing, free-lunch,
and FSDP2 (`fsdp.shard`). DeepSpeed ZeRO owns its optimizer and step, so `zero.build_step` applies it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from pretrain_planner.trainer.config import RunConfig
from pretrain_planner.trainer.rank import RankEnv, Unsupported


@dataclass
class Applied:
    """The model as trained, plus every concrete setting that was in effect."""

    module: torch.nn.Module  # what the step calls (maybe compiled / DDP-wrapped / FSDP-sharded)
    raw: torch.nn.Module  # the transformers model underneath
    ddp: Any = None
    autocast_dtype: torch.dtype | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    probe: Any = None  # evidence.Probe on one block, when the model is not compiled
    loss_scaling: bool = False  # fp16: a gradient scaler (sharded across ranks under FSDP)
    sharded: bool = False
    cuda_graphs: bool = False  # `cg`: a step's outputs live in the graph pool until the next replay
    fsdp: Any = None  # the FSDP2 root module
    grad_sync: str = "last"  # FSDP2: reduce-scatter on the "last" micro-batch of a step only, or on "every" one

    def no_sync(self):
        """Accumulate this micro-batch's gradients without synchronising them: DDP's no_sync; FSDP2's
        set_requires_gradient_sync(False) unless grad_sync is "every" (sharded gradients, more traffic)."""
        if self.ddp is not None:
            return self.ddp.no_sync()
        if self.fsdp is not None and self.grad_sync == "last":
            return _fsdp_no_sync(self.fsdp)
        return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(root: torch.nn.Module):
    root.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        root.set_requires_gradient_sync(True)


def precision_setup(cfg: RunConfig, env: RankEnv) -> torch.dtype | None:
    precision = cfg.recipe["precision"]
    if precision == "fp32":
        return None
    if precision == "fp16" and env.device.type != "cuda":
        raise Unsupported("fp16 autocast with loss scaling needs a CUDA GPU")
    if precision == "bf16" and env.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise Unsupported(f"bf16 is not supported by {torch.cuda.get_device_name(env.device)}")
    return torch.bfloat16 if precision == "bf16" else torch.float16


def planned(cfg: RunConfig, env: RankEnv, micro_batch: int = 1, accum: int = 1):
    """The method's concrete settings on this rank's device (planning.settings.resolve: the export's too)."""
    from pretrain_planner.planning.settings import resolve

    return resolve(
        cfg.method, cfg.model, cfg.gpu, env.world_size, micro_batch, accum,
        cuda=env.device.type == "cuda", recipe=cfg.recipe,
    )  # fmt: skip


def common_setup(cfg: RunConfig, env: RankEnv, net: torch.nn.Module) -> tuple[bool, torch.dtype | None]:
    """TF32 (free-lunch on GPUs that have it), cuDNN autotuning (free-lunch on GPUs: convolutions of ConvNeXt;
    the shapes are fixed, the warm-up steps absorb the search), the recipe's precision, activation checkpointing:
    as planning.settings resolves them."""
    plan = planned(cfg, env)
    tf32 = plan["tf32"]
    if env.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = plan["cudnn_benchmark"]
    autocast_dtype = precision_setup(cfg, env)
    net.train()
    if plan["activation_checkpointing"]:
        kwargs = {"use_reentrant": False}
        if hasattr(net, "activation_checkpointing_enable"):  # transformers >= 5.x; the old name warns
            net.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            net.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return tf32, autocast_dtype


def cudnn_benchmark(cfg: Any, env: RankEnv) -> bool:
    """Whether cuDNN autotunes its convolution algorithms: under free-lunch on CUDA (planning.settings)."""
    return bool(planned(cfg, env)["cudnn_benchmark"])


def _allow_recompiles() -> None:
    """The micro-batch search compiles one graph per size it tries: allow them all."""
    from torch import _dynamo

    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(_dynamo.config, knob):
            setattr(_dynamo.config, knob, max(getattr(_dynamo.config, knob), 64))


def apply_method(cfg: RunConfig, env: RankEnv, net: torch.nn.Module, attn_used: str | None) -> Applied:
    """naive / free-lunch, activation checkpointing, DDP or FSDP2 (DeepSpeed: see zero.build_step)."""
    from pretrain_planner.trainer.evidence import Probe

    method = cfg.method
    if method.sharding and not method.sharding.startswith("fsdp"):
        raise ValueError(f"{method.sharding} is applied by trainer.zero, not apply_method")
    plan = planned(cfg, env)
    tf32, autocast_dtype = common_setup(cfg, env, net)
    loss_scaling = autocast_dtype == torch.float16
    compiled = plan["compile"]
    # static shapes (the benchmark's fixed batches); a model dict may ask otherwise (None: automatic dynamic)
    compile_kwargs: dict[str, Any] = {"dynamic": plan["compile_dynamic"]}
    if method.compile_mode == "cg" and method.sharding:
        raise Unsupported(f"cg: CUDA graphs cannot capture {method.sharding}'s collectives and hooks")
    if plan["compile_mode"] not in (None, "default"):
        compile_kwargs["mode"] = plan["compile_mode"]  # reduce-overhead: inductor + CUDA graph trees
    if compiled:
        _allow_recompiles()
    ddp = probe = fsdp_root = None
    parallel: dict[str, Any] = {}
    if method.sharding:
        from pretrain_planner.trainer.fsdp import shard

        module, autocast_dtype, parallel = shard(cfg, env, net, plan, autocast_dtype)
        fsdp_root = module
        if not compiled:
            probe = Probe.on(net)
    else:
        net.to(env.device)
        if not compiled:  # hooks in a compiled graph would cost a recompile when removed
            probe = Probe.on(net)
        # Compile the model, then wrap it in DDP: DDP's gradient hooks and no_sync() stay in eager code.
        module = torch.compile(net, **compile_kwargs) if compiled else net
        if env.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ddp_kwargs = {"device_ids": [env.device.index]} if env.device.type == "cuda" else {}
            ddp = module = DDP(module, gradient_as_bucket_view=True, **ddp_kwargs)
            parallel = {
                "parallel": "ddp",
                "ddp": {"gradient_as_bucket_view": True, "accumulate_with_no_sync": True},
            }
        else:
            parallel = {"parallel": "single", "ddp": None}
    # the planned settings, each overwritten by what was applied (a difference shows in the result)
    settings = {
        **plan,
        "compile": compiled,
        "compile_note": None if compiled or not method.free_lunch else "model does not support torch.compile",
        "compile_mode": compile_kwargs.get("mode", "default") if compiled else None,
        "compile_dynamic": compile_kwargs["dynamic"] if compiled else None,
        "cuda_graphs": bool(compiled and compile_kwargs.get("mode") == "reduce-overhead"),
        "tf32": tf32,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if env.device.type == "cuda" else False,
        "autocast": str(autocast_dtype).replace("torch.", "") if autocast_dtype else None,
        "grad_scaler": (("ShardedGradScaler" if method.sharding else "GradScaler") if loss_scaling else None),
        "activation_checkpointing": method.checkpointing,
        **parallel,
        "device": str(env.device.type),
        "torch_threads": torch.get_num_threads(),
    }
    settings["attn_implementation"] = attn_used
    cuda_graphs = bool(settings["cuda_graphs"])
    if cuda_graphs:
        settings["cuda_graph_gradients"] = "preallocated, zeroed in place (never None): stable across replays"
    return Applied(
        module, net, ddp, autocast_dtype, settings, probe, loss_scaling, bool(method.sharding), cuda_graphs, fsdp_root
    )


def build_optimizer(cfg: RunConfig, env: RankEnv, params) -> tuple[torch.optim.Optimizer, dict[str, Any]]:
    opt = cfg.recipe["optimizer"]
    cls = torch.optim.AdamW if opt["name"] == "adamw" else torch.optim.Adam
    # fused AdamW on CUDA (free-lunch); with FSDP's CPU offload the optimizer steps CPU tensors
    fused = planned(cfg, env)["fused_optimizer"]
    kwargs = {"lr": opt["lr"], "betas": tuple(opt["betas"]), "eps": opt["eps"], "weight_decay": opt["weight_decay"]}
    if fused:
        kwargs["fused"] = True
    extra: dict[str, Any] = {}
    if opt.get("no_decay_1d"):  # biases and norm weights (1-d parameters) without weight decay (BERT recipes)
        params = list(params)
        decay, no_decay = [p for p in params if p.ndim >= 2], [p for p in params if p.ndim < 2]
        params = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        extra["weight_decay_groups"] = "1-d parameters (biases, norms) without weight decay"
    recorded = {**kwargs, "betas": list(kwargs["betas"]), "no_decay_1d": bool(opt.get("no_decay_1d"))}
    return cls(params, **kwargs), {"optimizer": cls.__name__, "fused_optimizer": fused, **recorded, **extra}


@dataclass(frozen=True)
class MethodConfig:
    """What `apply_method`, `build_optimizer`, `fsdp.shard` and `zero.build_step` read of a RunConfig, for a
    caller without a benchmark cell (the budget stage's pre-training): `method_config` builds one."""

    method: Any  # methods.Method
    model: dict[str, Any]  # needs supports_compile
    gpu: dict[str, Any]  # needs tf32 (whether free-lunch may turn it on)
    recipe: dict[str, Any]  # precision, grad_clip, optimizer {name, lr, betas, eps, weight_decay[, no_decay_1d]}


def method_config(
    method_slug: str,
    model: dict[str, Any],
    *,
    precision: str,
    lr: float,
    betas: tuple[float, float] | list[float],
    eps: float,
    weight_decay: float,
    grad_clip: float | None = None,
    optimizer: str = "adamw",
    no_decay_1d: bool = False,
    tf32: bool = True,
    supports_compile: bool = True,
    compile_dynamic: bool | None = False,
    where: str = "method",
) -> MethodConfig:
    """A MethodConfig from a plain method slug and recipe values (`where` names the slug in errors).
    `compile_dynamic`: torch.compile's `dynamic` for the whole model (None: automatic, for data-dependent
    shapes such as sparse prediction's masked rows)."""
    from pretrain_planner.planning.methods import parse

    opt = {"name": optimizer, "lr": lr, "betas": list(betas), "eps": eps, "weight_decay": weight_decay}
    if no_decay_1d:
        opt["no_decay_1d"] = True
    supports = bool(model.get("supports_compile", True) and supports_compile)
    return MethodConfig(
        method=parse(method_slug, where),
        model={**model, "supports_compile": supports, "compile_dynamic": compile_dynamic},
        gpu={"tf32": tf32},
        recipe={"precision": precision, "grad_clip": grad_clip, "optimizer": opt},
    )
