"""Out of memory on any rank: every rank learns it, frees its memory, and all go on together.

`guarded(env, fn)` runs a region that may run out of memory (a micro-batch trial, building a model,
the timed steps) on every rank and returns the same verdict on all of them, without hanging:

- A rank that runs out of memory writes it to the run's TCPStore (which lives beside the process
  groups, not in them), then aborts its process groups. Peers waiting for it inside a collective
  (FSDP's all-gather, ZeRO's reduce-scatter, DDP's all-reduce) then fail at once: gloo closes the
  connections; under NCCL a watcher thread on every rank sees the mark and aborts its own communicator.
  A peer whose collective fails while the mark is set counts the failure as that rank's OOM.
- Every rank then checks in at the store and waits for all the others (a bounded wait: a rank that
  never arrives is a crash, not a hang), and reads the verdict: which ranks ran out of memory.
- After an OOM the caller drops the model and rebuilds the process group on every rank
  (`RankEnv.rebuild_group`) before trying again with a smaller micro-batch.

Without a second rank, an OOM is simply caught.

Test hook: `PRETRAIN_PLANNER_FAKE_OOM_ABOVE=<micro-batch>[:<rank>][@build|@nosync]` makes the last repeated
block of the model raise torch.cuda.OutOfMemoryError in its forward whenever the micro-batch is larger than
`<micro-batch>`, on rank `<rank>` only (every rank if omitted); with `@build` the error comes while the
model is built instead, before that rank has run any collective (its peers are then inside their first
ones); with `@nosync` only in a forward whose FSDP2 gradients accumulate unsharded (gradient sync off: the
memory a step with one reduce-scatter holds). It exists for the tests of this protocol; a malformed value is
an error, and a cell run with it records `test_hooks` in its settings and names the hook in every forced
error.
"""

from __future__ import annotations

import datetime as dt
import gc
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from pretrain_planner.trainer.rank import RankEnv

FAKE_OOM_ENV = "PRETRAIN_PLANNER_FAKE_OOM_ABOVE"
ARRIVAL_TIMEOUT = dt.timedelta(minutes=10)  # as long as a collective may take (the process group's timeout)
ARRIVAL_POLL_S = 1.0  # between looks for a failed rank while waiting for the others
WATCH_INTERVAL_S = 0.05


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


@dataclass
class Verdict:
    oom: bool
    ranks: list[int] = field(default_factory=list)  # the ranks that ran out of memory
    message: str | None = None  # the first such rank's error, shortened
    group_broken: bool = False  # the process group was aborted: rebuild it before any collective


def free_memory(env: RankEnv) -> None:
    gc.collect()
    if env.device.type == "cuda":
        torch.cuda.empty_cache()


def _watch(env: RankEnv, key: str, stop: threading.Event) -> None:
    """A collective waiting for a rank that left may not fail by itself: abort this rank's groups."""
    while not stop.wait(WATCH_INTERVAL_S):
        if env.store.check([key]):
            env.abort_group()
            return


def guarded(env: RankEnv, fn: Callable[[], Any]) -> Verdict:
    """Run `fn` on every rank; an OOM on any rank is the verdict of all (see the module docstring)."""
    if not env.distributed:
        try:
            fn()
            env.sync()
            return Verdict(False)
        except Exception as exc:
            if not is_oom(exc):
                raise
            return Verdict(True, [env.rank], str(exc)[:300])
    env.trials += 1
    prefix = f"pp/guard/{env.generation}/{env.trials}/"
    oom_key = prefix + "oom"
    store = env.store
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(env, oom_key, stop), daemon=True)
    watcher.start()
    try:
        fn()
        env.sync()
    except Exception as exc:
        if is_oom(exc):
            store.set(f"{prefix}oom/{env.rank}", str(exc)[:300])
            store.set(oom_key, str(env.rank))  # before aborting: a peer whose collective fails reads it
            env.abort_group()
        elif store.check([oom_key]):  # a collective failed: a peer ran out of memory and left it
            env.abort_group()  # pass it on to ranks waiting for this one
        else:
            raise
    finally:
        stop.set()
        watcher.join()
    store.set(f"{prefix}arrived/{env.rank}", "1")
    _wait_arrivals(env, [f"{prefix}arrived/{r}" for r in range(env.world_size)])
    if not store.check([oom_key]):
        return Verdict(False)
    ranks = [r for r in range(env.world_size) if store.check([f"{prefix}oom/{r}"])]
    message = store.get(f"{prefix}oom/{ranks[0]}").decode(errors="replace") if ranks else None
    return Verdict(True, ranks, message, group_broken=True)


def _wait_arrivals(env: RankEnv, keys: list[str]) -> None:
    """Wait for every rank to check in, in short waits: a rank that failed instead (watch.PeerWatch) ends the
    wait at once with its reason; ARRIVAL_TIMEOUT bounds the rest."""
    deadline = time.monotonic() + ARRIVAL_TIMEOUT.total_seconds()
    while True:
        failure = env.watch.check() if env.watch is not None else None
        if failure:
            raise RuntimeError(f"rank {env.rank}: left the out-of-memory agreement because {failure}")
        try:
            env.store.wait(keys, dt.timedelta(seconds=ARRIVAL_POLL_S))
            return
        except Exception as exc:  # noqa: BLE001 - a timeout of the short wait (or the store is gone)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"rank {env.rank}: not every rank finished the region within {ARRIVAL_TIMEOUT} (a rank crashed?)"
                ) from exc


# ----------------------------------------------------------------------------------------- test hook


@dataclass(frozen=True)
class FakeOom:
    above: int
    rank: int | None
    at: str = "forward"  # or "build", "nosync"

    @classmethod
    def from_env(cls) -> FakeOom | None:
        raw = os.environ.get(FAKE_OOM_ENV)
        if raw is None:
            return None
        m = re.fullmatch(r"(\d+)(?::(\d+))?(?:@(build|nosync))?", raw.strip())
        if not m:
            raise ValueError(
                f"{FAKE_OOM_ENV}={raw!r}: expected <micro-batch>[:<rank>][@build|@nosync], e.g. 2:1 (a test hook)"
            )
        rank = None if m.group(2) is None else int(m.group(2))
        return cls(int(m.group(1)), rank, m.group(3) or "forward")

    def describe(self) -> str:
        where = "every rank" if self.rank is None else f"rank {self.rank}"
        when = {"build": " while building the model", "nosync": " without gradient sync"}.get(self.at, "")
        return f"{FAKE_OOM_ENV}: forced OOM for micro-batches above {self.above} on {where}{when}"

    def at_build(self, micro_batch: int, rank: int) -> None:
        """`@build`: raise before the model exists (before this rank's first collective of the instance)."""
        if self.at == "build" and (self.rank is None or self.rank == rank) and micro_batch > self.above:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (fake: {self.describe()}, rank {rank})")

    def install(self, net: torch.nn.Module, rank: int):
        """Hook the last repeated block of `net` (after earlier blocks' collectives have run); None if
        the hook does not apply to this rank."""
        if self.at == "build" or (self.rank is not None and self.rank != rank):
            return None
        from pretrain_planner.trainer.models import blocks

        found = blocks(net)
        depth = min((n.count(".") for n, _ in found), default=None)
        target = [m for n, m in found if n.count(".") == depth][-1] if found else net
        above, text = self.above, self.describe()

        nosync = self.at == "nosync"

        @torch._dynamo.disable
        def hook(module, args, kwargs):
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            if tensors and tensors[0].dim() > 0 and tensors[0].shape[0] > above:
                if nosync and not _fsdp_sync_off(module):
                    return
                raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (fake: {text}, rank {rank})")

        return target.register_forward_pre_hook(hook, with_kwargs=True)


def _fsdp_sync_off(module: torch.nn.Module) -> bool:
    """Whether this FSDP2 module's gradients are not reduced this micro-batch (set_requires_gradient_sync(False))."""
    state = getattr(module, "_get_fsdp_state", None)
    if state is None:
        return False
    return any(not group.reduce_grads for group in state()._fsdp_param_groups)
