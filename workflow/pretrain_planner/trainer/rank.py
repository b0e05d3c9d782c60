"""Where a rank runs: its device and its process group.

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

from pretrain_planner.planning.devices import wants_cuda
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
    env_set: list[str] = field(default_factory=list)  # variables an in-process one-rank group set

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
        if self.world_size > 1:
            # every rank waits here until all have joined: a rank whose group is up can fail at once (a bad model
            # config) and close its sockets while a slower peer is still inside gloo's connectFullMesh, which then
            # fails with "Connection reset" instead of learning rank r's error from the watch (seen once, the
            # suite on three workers with bf16 emulated: test_one_rank_failure_stops_every_rank)
            store.set(f"joined/{self.rank}", "1")
            store.wait([f"joined/{r}" for r in range(self.world_size)], GROUP_TIMEOUT)

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
    if not wants_cuda(cfg.cell.gpu, cfg.bench.device):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise Unsupported(
            f"the cell asks for GPU type {cfg.cell.gpu!r} but no CUDA device is visible on "
            f"{os.uname().nodename} (set benchmark.device: cpu to test the plumbing on CPUs)"
        )
    return torch.device("cuda", device_index(local_rank, torch.cuda.device_count()))


def one_rank_environment() -> list[str]:
    """RANK, LOCAL_RANK and WORLD_SIZE of a one-rank process group started in this process, which DeepSpeed reads
    (a launcher would set them): those not already set are set, and their names returned for `take_back`."""
    names = []
    for var, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        if var not in os.environ:
            os.environ[var] = value
            names.append(var)
    return names


def take_back(names: list[str]) -> None:
    """Unset what `one_rank_environment` set: an in-process run must not leave a distributed environment behind
    (an HF Trainer or accelerate started later would wait for a rendezvous)."""
    for var in names:
        os.environ.pop(var, None)
    names.clear()


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
                env.env_set = one_rank_environment()
            env._init_group()
    return env


def close_rank(env: RankEnv) -> None:
    if env.watch is not None:
        env.watch.stop()
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    forget_deepspeed_groups()
    take_back(env.env_set)  # a cell run in the driver's process (the debug launcher) leaves no rank behind
