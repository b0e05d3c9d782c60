"""Where a rank runs (device, process group) and how the method is applied to the model."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as torch_dist

from .config import RunConfig


class Unsupported(Exception):
    """The method or precision cannot run where this cell runs: a result, not a failure."""


@dataclass
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def sync(self) -> None:
        """Bound a timed region: wait for all queued device work (CPU ops are already synchronous)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _select_device(cfg: RunConfig, local_rank: int) -> torch.device:
    wants_gpu = cfg.cell.gpu != "cpu" and cfg.bench.device == "auto"
    if not wants_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise Unsupported(
            f"the cell asks for GPU type {cfg.cell.gpu!r} but no CUDA device is visible on "
            f"{os.uname().nodename} (set benchmark.device: cpu to test the plumbing on CPUs)"
        )
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def init_rank(cfg: RunConfig) -> RankEnv:
    """Read the rank from submitit's environment (if launched by it) and start the process group."""
    rank, world, local_rank = 0, 1, 0
    if cfg.cell.world_size > 1:
        from submitit.helpers import TorchDistributedEnvironment

        env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        rank, world, local_rank = env.rank, env.world_size, env.local_rank
        if world != cfg.cell.world_size:
            raise RuntimeError(f"launched with {world} tasks, the cell needs {cfg.cell.world_size}")
    torch.set_num_threads(max(1, cfg.threads_per_rank))
    try:
        device = _select_device(cfg, local_rank)
    finally:  # every rank must join the group, even one that will report `unsupported`
        if world > 1:
            backend = (
                "nccl" if torch.cuda.is_available() and cfg.bench.device == "auto" and cfg.cell.gpu != "cpu" else "gloo"
            )
            if backend == "nccl":
                torch.cuda.set_device(local_rank % torch.cuda.device_count())
            torch_dist.init_process_group(backend, timeout=dt.timedelta(minutes=10))
    return RankEnv(rank, world, local_rank, device)


def close_rank(env: RankEnv) -> None:
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


@dataclass
class Applied:
    """The model as trained, plus every concrete setting that was in effect."""

    module: torch.nn.Module  # what the step calls (maybe compiled / DDP-wrapped)
    raw: torch.nn.Module  # the transformers model underneath
    ddp: Any = None
    autocast_dtype: torch.dtype | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def no_sync(self):
        return self.ddp.no_sync() if self.ddp is not None else contextlib.nullcontext()


def precision_setup(cfg: RunConfig, env: RankEnv) -> torch.dtype | None:
    precision = cfg.recipe["precision"]
    if precision == "fp32":
        return None
    if precision == "fp16" and env.device.type != "cuda":
        raise Unsupported("fp16 autocast with loss scaling needs a CUDA GPU")
    if precision == "bf16" and env.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise Unsupported(f"bf16 is not supported by {torch.cuda.get_device_name(env.device)}")
    return torch.bfloat16 if precision == "bf16" else torch.float16


def apply_method(cfg: RunConfig, env: RankEnv, net: torch.nn.Module, attn_used: str | None) -> Applied:
    """naive / free-lunch, activation checkpointing, DDP. Sharding and offload come with their back-ends."""
    method = cfg.method
    if method.sharding or method.offload:
        raise Unsupported(f"method part {method.sharding or 'off'!r} is not implemented by this trainer yet")
    on_cuda = env.device.type == "cuda"
    tf32 = method.free_lunch and on_cuda and bool(cfg.gpu.get("tf32"))
    if on_cuda:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    autocast_dtype = precision_setup(cfg, env)
    net.to(env.device)
    net.train()
    if method.checkpointing:
        enable = getattr(net, "activation_checkpointing_enable", None) or net.gradient_checkpointing_enable
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    compiled = method.free_lunch and cfg.model["supports_compile"]
    # Compile the model, then wrap it in DDP: DDP's gradient hooks and no_sync() stay in eager code.
    if compiled:  # the micro-batch search compiles one graph per size it tries: allow them all
        from torch import _dynamo

        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(_dynamo.config, knob):
                setattr(_dynamo.config, knob, max(getattr(_dynamo.config, knob), 64))
    module = torch.compile(net, dynamic=False) if compiled else net
    ddp = None
    if env.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp_kwargs = {"device_ids": [env.device.index]} if on_cuda else {}
        ddp = module = DDP(module, gradient_as_bucket_view=True, **ddp_kwargs)
    settings = {
        "base": method.base,
        "attn_implementation": attn_used,
        "compile": compiled,
        "compile_note": None if compiled or not method.free_lunch else "model does not support torch.compile",
        "tf32": tf32,
        "autocast": str(autocast_dtype).replace("torch.", "") if autocast_dtype else None,
        "grad_scaler": autocast_dtype == torch.float16,
        "activation_checkpointing": method.checkpointing,
        "parallel": "ddp" if env.distributed else "single",
        "ddp": {"gradient_as_bucket_view": True, "accumulate_with_no_sync": True} if env.distributed else None,
        "device": str(env.device.type),
        "torch_threads": torch.get_num_threads(),
    }
    return Applied(module, net, ddp, autocast_dtype, settings)


def build_optimizer(cfg: RunConfig, env: RankEnv, params) -> tuple[torch.optim.Optimizer, dict[str, Any]]:
    opt = cfg.recipe["optimizer"]
    cls = torch.optim.AdamW if opt["name"] == "adamw" else torch.optim.Adam
    fused = cfg.method.free_lunch and env.device.type == "cuda"
    kwargs = {"lr": opt["lr"], "betas": tuple(opt["betas"]), "eps": opt["eps"], "weight_decay": opt["weight_decay"]}
    if fused:
        kwargs["fused"] = True
    return cls(params, **kwargs), {"optimizer": cls.__name__, "fused_optimizer": fused, **kwargs}
