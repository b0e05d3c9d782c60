"""How the method is applied to the model on a rank (rank.py: where the rank runs), from its concrete settings
(planning.settings.Settings, resolved once per build by trainer/methodbuild.py): nothing here re-derives a
setting; what is recorded is what was applied (read back from the objects built), so a difference shows.

`apply_method` covers the torch-native methods: a single rank, DDP, activation checkpointing, free-lunch,
and FSDP2 (`fsdp.shard`). DeepSpeed ZeRO owns its optimizer and step, so `zero.build_step` applies it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from pretrain_planner.planning.methods import SHARDING_ENGINE, Method
from pretrain_planner.planning.settings import Settings
from pretrain_planner.trainer.rank import RankEnv, Unsupported

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
OPTIMIZERS = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam}  # Settings.optimizer -> the torch class


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


def precision_setup(precision: str, env: RankEnv) -> torch.dtype | None:
    """The recipe's compute dtype (None: fp32), or Unsupported where this device cannot run it."""
    if precision == "fp16" and env.device.type != "cuda":
        raise Unsupported("fp16 autocast with loss scaling needs a CUDA GPU")
    if precision == "bf16" and env.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise Unsupported(f"bf16 is not supported by {torch.cuda.get_device_name(env.device)}")
    return DTYPES[precision]


def common_setup(s: Settings, env: RankEnv, net: torch.nn.Module) -> torch.dtype | None:
    """TF32 and cuDNN autotuning (free-lunch on GPUs: convolutions of ConvNeXt; the shapes are fixed, the warm-up
    steps absorb the search), the recipe's precision, activation checkpointing, as the settings say; returns the
    compute dtype."""
    if env.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = s.tf32
        torch.backends.cudnn.allow_tf32 = s.tf32
        torch.backends.cudnn.benchmark = s.cudnn_benchmark
    autocast_dtype = precision_setup(s.precision, env)
    net.train()
    if s.activation_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(net, "activation_checkpointing_enable"):  # transformers >= 5.x; the old name warns
            net.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            net.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return autocast_dtype


def applied_backends(env: RankEnv) -> dict[str, Any]:
    """TF32 and cuDNN autotuning as torch has them now (CPU: neither applies)."""
    cuda = env.device.type == "cuda"
    return {"tf32": bool(cuda and torch.backends.cuda.matmul.allow_tf32),
            "cudnn_benchmark": bool(cuda and torch.backends.cudnn.benchmark)}  # fmt: skip


def _allow_recompiles() -> None:
    """The micro-batch search compiles one graph per size it tries: allow them all."""
    from torch import _dynamo

    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(_dynamo.config, knob):
            setattr(_dynamo.config, knob, max(getattr(_dynamo.config, knob), 64))


def apply_method(method: Method, s: Settings, env: RankEnv, net: torch.nn.Module, attn_used: str | None) -> Applied:
    """naive / free-lunch, activation checkpointing, DDP or FSDP2 (DeepSpeed: see zero.build_step)."""
    from pretrain_planner.trainer.evidence import Probe

    if method.sharding and SHARDING_ENGINE[method.sharding] != "fsdp":
        raise ValueError(f"{method.sharding} is applied by trainer.zero, not apply_method")
    autocast_dtype = common_setup(s, env, net)
    compiled = s.compile
    # static shapes (the benchmark's fixed batches); a run may ask otherwise (None: automatic dynamic)
    compile_kwargs: dict[str, Any] = {"dynamic": s.compile_dynamic}
    if s.compile_mode not in (None, "default"):
        compile_kwargs["mode"] = s.compile_mode  # reduce-overhead: inductor + CUDA graph trees
    if compiled:
        _allow_recompiles()
    ddp = probe = fsdp_root = None
    parallel: dict[str, Any] = {}
    if method.sharding:
        from pretrain_planner.trainer.fsdp import shard

        module, autocast_dtype, parallel = shard(method, s, env, net, autocast_dtype)
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
    cuda_graphs = bool(compiled and compile_kwargs.get("mode") == "reduce-overhead")
    # the planned settings, each overwritten by what was applied (a difference shows in the result)
    settings = {
        **s.as_dict(),
        "compile": compiled,
        "compile_note": None if compiled or not method.free_lunch else "model does not support torch.compile",
        "compile_mode": compile_kwargs.get("mode", "default") if compiled else None,
        "compile_dynamic": compile_kwargs["dynamic"] if compiled else None,
        "cuda_graphs": cuda_graphs,
        **applied_backends(env),
        "autocast": str(autocast_dtype).replace("torch.", "") if autocast_dtype else None,
        **parallel,
        "device": str(env.device.type),
        "torch_threads": torch.get_num_threads(),
        "attn_implementation": attn_used,
    }
    if cuda_graphs:
        settings["cuda_graph_gradients"] = "preallocated, zeroed in place (never None): stable across replays"
    return Applied(module, net, ddp, autocast_dtype, settings, probe, s.grad_scaler is not None,
                   bool(method.sharding), cuda_graphs, fsdp_root)  # fmt: skip


def build_optimizer(s: Settings, params) -> tuple[torch.optim.Optimizer, dict[str, Any]]:
    """The settings' torch optimizer (fused AdamW on CUDA under free-lunch; with FSDP's CPU offload the optimizer
    steps CPU tensors), and what was built."""
    return make_optimizer(s.optimizer, params, s.lr, s.betas, s.eps, s.weight_decay, s.no_decay_1d, s.fused_optimizer)


def make_optimizer(
    name: str, params, lr: float, betas, eps: float, weight_decay: float, no_decay_1d: bool, fused: bool = False
) -> tuple[torch.optim.Optimizer, dict[str, Any]]:
    """`build_optimizer` from its values, for a run without Settings too (the budget stage's GLUE fine-tuning)."""
    cls = OPTIMIZERS[name]
    kwargs = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
    if fused:
        kwargs["fused"] = True
    extra: dict[str, Any] = {}
    if no_decay_1d:  # biases and norm weights (1-d parameters) without weight decay (BERT recipes)
        params = list(params)
        decay, no_decay = [p for p in params if p.ndim >= 2], [p for p in params if p.ndim < 2]
        params = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        extra["weight_decay_groups"] = "1-d parameters (biases, norms) without weight decay"
    opt = cls(params, **kwargs)
    recorded = {**kwargs, "betas": list(kwargs["betas"]), "no_decay_1d": no_decay_1d}
    built = {"optimizer": type(opt).__name__, "fused_optimizer": bool(opt.defaults.get("fused"))}
    return opt, {**built, **recorded, **extra}
