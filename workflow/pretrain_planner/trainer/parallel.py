"""Where a rank runs (device, process group) and how the method is applied to the model.

`apply_method` covers the torch-native methods: a single rank, DDP, activation checkpointing, free-lunch,
and FSDP2 (`fsdp.shard`). DeepSpeed ZeRO owns its optimizer and step, so `zero.build_step` applies it.

Process groups are made from one TCPStore that outlives them: after an out-of-memory error on any rank
the group may be broken (a rank left a collective half-way), so every rank aborts it and joins a fresh
one (`RankEnv.rebuild_group`), see `oom.py`. Any other failure of one rank ends every rank at once
(`watch.PeerWatch`).

One device rule for every engine (the trainer, DeepSpeed, the budget stage): a rank runs on
`cuda:device_index(local_rank)`, the local rank modulo the GPUs it can see, so that a site giving each task
one GPU (`--gpus-per-task`, `--gpu-bind`) and one giving every task all of them both work.

On GPUs the process group has both back-ends (`cuda:nccl,cpu:gloo`): FSDP2's CPU offload keeps gradient
shards on the CPU, and the gradient norm of `clip_grad_norm_` is all-reduced where they live; an NCCL-only
group has "no backend type associated with device type cpu". Its NCCL communicators are created eagerly
(`device_id`), so an abort after an early out-of-memory error never meets a communicator still being made.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as torch_dist

from pretrain_planner.trainer.config import RunConfig

GROUP_TIMEOUT = dt.timedelta(minutes=10)


class Unsupported(Exception):
    """The method or precision cannot run where this cell runs: a result, not a failure."""


@dataclass
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None = None  # of the process group (None: no group)
    store: Any = None  # the TCPStore every process group of this run is made from
    generation: int = 0  # how many times the group was rebuilt
    trials: int = 0  # guarded regions run so far (keys in the store)
    store_port: int | None = None  # the TCPStore's port: its connections survive an abort
    watch: Any = None  # watch.PeerWatch of a multi-rank run: one rank's failure ends every rank

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def sync(self) -> None:
        """Bound a timed region: wait for all queued device work (CPU ops are already synchronous)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _init_group(self) -> None:
        prefix = f"pp/pg{self.generation}"
        store = torch_dist.PrefixStore(prefix, self.store)
        torch_dist.init_process_group(
            self.backend,
            store=store,
            rank=self.rank,
            world_size=self.world_size,
            timeout=GROUP_TIMEOUT,
            **eager_init_kwargs(self.device, self.world_size),
        )

    def abort_group(self) -> None:
        """Abort every process group of this process, so that collectives in flight here and on the peers
        fail at once instead of waiting for the timeout. NCCL: ncclCommAbort. gloo has no abort (its
        Backend.abort is a no-op and the group lives on while FSDP or DeepSpeed hold it), so its connections
        are shut down: a blocked receive here or on a peer ends with "Connection closed by peer". The
        TCPStore's connections are kept. Safe to call from a watcher thread while a collective is blocked."""
        gloo = "gloo" in (self.backend or "") and self.store_port is not None
        nccl = "nccl" in (self.backend or "")
        if gloo and not nccl:  # a blocked gloo receive (here or on a peer) ends now
            _shutdown_sockets(keep_port=self.store_port)
        if torch_dist.is_initialized():
            from torch.distributed.distributed_c10d import _abort_process_group

            with contextlib.suppress(Exception):  # already aborted: nothing left to close
                _abort_process_group()
        if gloo and nccl:  # NCCL aborted first (its own sockets close with it), then gloo's CPU side
            _shutdown_sockets(keep_port=self.store_port)
        forget_deepspeed_groups()

    def rebuild_group(self) -> None:
        """All ranks together: drop the (maybe broken) process group and join a fresh one. The default group's
        name comes from a counter that a rank may have moved alone (an abort by the watcher while this rank was
        not in a collective, then torch's own attempt at a default group, e.g. DeviceMesh's): it is reset, or
        the ranks would rendezvous under different names and wait for each other forever."""
        self.abort_group()
        from torch.distributed import distributed_c10d

        distributed_c10d._world.group_count = 0
        self.generation += 1
        self._init_group()


def _shutdown_sockets(keep_port: int | None) -> int:
    """Shut down this process's connected TCP sockets (gloo's pairs) except those on `keep_port`
    (the TCPStore). Linux: sockets are found through /proc. Returns how many were shut down."""
    import socket

    inodes: dict[str, tuple[int, int]] = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    f = line.split()
                    local, remote, state, inode = f[1], f[2], f[3], f[9]
                    if state == "01":  # ESTABLISHED (never a listener: gloo's accept() would abort)
                        inodes[inode] = (int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16))
        except OSError:
            continue
    done = 0
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if not target.startswith("socket:["):
            continue
        ports = inodes.get(target[len("socket:[") : -1])
        if ports is None or keep_port in ports:
            continue
        try:
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:
            pass
        finally:
            sock.close()  # closes the duplicate only; the shutdown holds for gloo's descriptor
    return done


def forget_deepspeed_groups() -> str | None:
    """DeepSpeed caches process groups (a clone of WORLD, the data-parallel group, a device mesh): drop them with
    the group, or the next engine runs its collectives on the aborted one. DeepSpeed >= 0.19.8 has
    `_release_process_group_references`; older versions do not, so every module-level ProcessGroup or DeviceMesh
    of `deepspeed.utils.groups` (and every dict of them) is dropped instead. Returns how (None: not imported)."""
    import sys

    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is None:
        return None
    if hasattr(groups, "_release_process_group_references"):
        groups._release_process_group_references(group=None)
        return "deepspeed.utils.groups._release_process_group_references"
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    cached = (ProcessGroup, DeviceMesh)
    for name, value in list(vars(groups).items()):
        if isinstance(value, cached):
            setattr(groups, name, None)
        elif isinstance(value, dict) and any(isinstance(v, cached) for v in value.values()):
            value.clear()
    return "module-level process groups of deepspeed.utils.groups set to None (no _release_process_group_references)"


def device_index(local_rank: int, visible: int) -> int:
    """The one device rule: local rank modulo the GPUs this task sees (`visible`). All GPUs visible to every task:
    GPU `local_rank`; one GPU per task (`--gpus-per-task=1`, `--gpu-bind`): GPU 0 of its own."""
    if visible < 1:
        raise ValueError("no CUDA device is visible")
    return local_rank % visible


def process_group_backend(device: torch.device) -> str:
    """NCCL for CUDA tensors with gloo for CPU tensors on GPUs (FSDP2 offload: gradient norms of CPU shards),
    gloo on CPUs."""
    return "cuda:nccl,cpu:gloo" if device.type == "cuda" else "gloo"


def eager_init_kwargs(device: torch.device, world_size: int) -> dict[str, Any]:
    """`device_id` for init_process_group on CUDA with peers: NCCL communicators are created at once, on every
    rank together, not lazily by the first collective (which an out-of-memory rank may never reach). One rank
    has no peer to wait for (and DeepSpeed notes that binding then makes its new_group() hang)."""
    return {"device_id": device} if device.type == "cuda" and world_size > 1 else {}


def _select_device(cfg: RunConfig, local_rank: int) -> torch.device:
    wants_gpu = cfg.cell.gpu != "cpu" and cfg.bench.device == "auto"
    if not wants_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise Unsupported(
            f"the cell asks for GPU type {cfg.cell.gpu!r} but no CUDA device is visible on "
            f"{os.uname().nodename} (set benchmark.device: cpu to test the plumbing on CPUs)"
        )
    return torch.device("cuda", device_index(local_rank, torch.cuda.device_count()))


def init_rank(cfg: RunConfig) -> RankEnv:
    """Read the rank from submitit's environment (if launched by it) and start the process group.

    Sharding back-ends need a process group even on one rank (FSDP's mesh, DeepSpeed's engine): that one
    lives in an in-memory store.
    """
    rank, world, local_rank = 0, 1, 0
    if cfg.cell.world_size > 1:
        from submitit.helpers import TorchDistributedEnvironment

        env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        rank, world, local_rank = env.rank, env.world_size, env.local_rank
        if world != cfg.cell.world_size:
            raise RuntimeError(f"launched with {world} tasks, the cell needs {cfg.cell.world_size}")
    torch.set_num_threads(max(1, cfg.threads_per_rank))
    env = RankEnv(rank, world, local_rank, torch.device("cpu"))
    try:
        env.device = _select_device(cfg, local_rank)
    finally:  # every rank must join the group, even one that will report `unsupported`
        if world > 1 or cfg.method.sharding:
            on_gpus = torch.cuda.is_available() and cfg.bench.device == "auto" and cfg.cell.gpu != "cpu"
            if on_gpus:
                env.device = torch.device("cuda", device_index(local_rank, torch.cuda.device_count()))
                torch.cuda.set_device(env.device)
            env.backend = process_group_backend(env.device)
            if world > 1:
                env.store_port = int(os.environ["MASTER_PORT"])
                env.store = torch_dist.TCPStore(
                    os.environ["MASTER_ADDR"],
                    env.store_port,
                    world,
                    is_master=rank == 0,
                    timeout=GROUP_TIMEOUT,
                )
                from pretrain_planner.trainer.watch import PeerWatch

                env.watch = PeerWatch(env).start()
            else:
                if torch_dist.is_initialized():
                    raise Unsupported(
                        "this process already has a process group (the debug launcher runs cells in the driver's "
                        "threads): run sharded cells with the local or slurm launcher"
                    )
                env.store = torch_dist.HashStore()
                for var in ("RANK", "LOCAL_RANK"):  # DeepSpeed reads them (a launcher would set them)
                    os.environ.setdefault(var, "0")
                os.environ.setdefault("WORLD_SIZE", "1")
            env._init_group()
    return env


def close_rank(env: RankEnv) -> None:
    if env.watch is not None:
        env.watch.stop()
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    forget_deepspeed_groups()


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


def blocks(net: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model's repeated blocks, children before parents: modules whose class is in transformers'
    `_no_split_modules` (the units it never splits across devices), and its checkpointing layers."""
    names = set(getattr(net, "_no_split_modules", None) or ())
    gc_layer = None
    with contextlib.suppress(ImportError):
        from transformers.modeling_layers import GradientCheckpointingLayer as gc_layer
    found = [
        (name, mod)
        for name, mod in net.named_modules()
        if mod is not net and (type(mod).__name__ in names or (gc_layer is not None and isinstance(mod, gc_layer)))
    ]
    # named_modules() is pre-order; reverse depth so inner blocks are wrapped before the blocks holding them
    return sorted(found, key=lambda nm: -nm[0].count("."))


def common_setup(cfg: RunConfig, env: RankEnv, net: torch.nn.Module) -> tuple[bool, torch.dtype | None]:
    """TF32 (free-lunch on GPUs that have it), cuDNN autotuning (free-lunch on GPUs: convolutions of ConvNeXt;
    the shapes are fixed, the warm-up steps absorb the search), the recipe's precision, activation checkpointing."""
    on_cuda = env.device.type == "cuda"
    tf32 = cfg.method.free_lunch and on_cuda and bool(cfg.gpu.get("tf32"))
    if on_cuda:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = cudnn_benchmark(cfg, env)
    autocast_dtype = precision_setup(cfg, env)
    net.train()
    if cfg.method.checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(net, "activation_checkpointing_enable"):  # transformers >= 5.x; the old name warns
            net.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            net.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return tf32, autocast_dtype


def cudnn_benchmark(cfg: Any, env: RankEnv) -> bool:
    """Whether cuDNN autotunes its convolution algorithms: under free-lunch on CUDA."""
    return bool(cfg.method.free_lunch) and env.device.type == "cuda"


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
    tf32, autocast_dtype = common_setup(cfg, env, net)
    loss_scaling = autocast_dtype == torch.float16
    compiled = method.free_lunch and cfg.model["supports_compile"]
    # static shapes (the benchmark's fixed batches); a model dict may ask otherwise (None: automatic dynamic)
    compile_kwargs: dict[str, Any] = {"dynamic": cfg.model.get("compile_dynamic", False)}
    if method.compile_mode == "cg":
        if method.sharding:
            raise Unsupported(f"cg: CUDA graphs cannot capture {method.sharding}'s collectives and hooks")
        compile_kwargs["mode"] = "reduce-overhead"  # inductor + CUDA graph trees
    if compiled:
        _allow_recompiles()
    ddp = probe = fsdp_root = None
    parallel: dict[str, Any] = {}
    if method.sharding:
        from pretrain_planner.trainer.fsdp import shard

        module, autocast_dtype, parallel = shard(cfg, env, net, compiled, autocast_dtype)
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
    settings = {
        "base": method.base,
        "attn_implementation": None,  # filled by the caller
        "compile": compiled,
        "compile_note": None if compiled or not method.free_lunch else "model does not support torch.compile",
        "compile_mode": compile_kwargs.get("mode", "default") if compiled else None,
        "cuda_graphs": compiled and method.compile_mode == "cg",
        "tf32": tf32,
        "cudnn_benchmark": cudnn_benchmark(cfg, env),
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


def build_optimizer(
    cfg: RunConfig, env: RankEnv, params, offload: bool = False
) -> tuple[torch.optim.Optimizer, dict[str, Any]]:
    opt = cfg.recipe["optimizer"]
    cls = torch.optim.AdamW if opt["name"] == "adamw" else torch.optim.Adam
    # fused AdamW on CUDA (free-lunch); with FSDP's CPU offload the optimizer steps CPU tensors
    fused = cfg.method.free_lunch and env.device.type == "cuda" and not offload
    kwargs = {"lr": opt["lr"], "betas": tuple(opt["betas"]), "eps": opt["eps"], "weight_decay": opt["weight_decay"]}
    if fused:
        kwargs["fused"] = True
    extra: dict[str, Any] = {}
    if opt.get("no_decay_1d"):  # biases and norm weights (1-d parameters) without weight decay (BERT recipes)
        params = list(params)
        decay, no_decay = [p for p in params if p.ndim >= 2], [p for p in params if p.ndim < 2]
        params = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        extra["weight_decay_groups"] = "1-d parameters (biases, norms) without weight decay"
    return cls(params, **kwargs), {"optimizer": cls.__name__, "fused_optimizer": fused, **kwargs, **extra}


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
