"""The one training loop: optimizer steps with gradient accumulation over the method's step, the learning rate
from a schedule, checkpoint/resume, stop signals and the step log, for every caller that trains for real (the
budget stage's time-budgeted MLM, the train stage that runs an exported plan), in the style of torchtitan's
Trainer: what differs between callers is a `Hooks` object (data, schedule, when to stop, what else happens after
a step), the loop itself is one.

- Ranks (`Ranks`): this process's place in a data-parallel run, started from submitit's environment (the local
  and SLURM launchers), from torchrun's (RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT), or alone; a
  sharded method on one rank gets an in-process group. After each step the ranks agree on its time (the slowest
  rank's) and on any stop signal, so schedules keyed on time and the stop are the same everywhere.
- A step (`Loop.step`): the schedule's learning rate on every parameter group, the RNG reseeded per (seed, rank,
  step) (dropout: a resumed run draws what the uninterrupted one drew), `accum` micro-batches from the hooks
  (gradients synchronised on the last one only: trainer.step), the optimizer step, the mean loss over ranks;
  one line of steps.jsonl (flushed: a killed run keeps what it logged).
- Checkpoints (`Loop.checkpoint`): rank 0 writes checkpoint.pt (the method's state dicts: weights, optimizer,
  loss scaler; FSDP2 as full state dicts, ZeRO naming the engine's sharded checkpoint), the data position and the
  schedule's state (`Hooks.data_state`), the loop's state and the RNG; every rank reads it back (`resume`), and a
  checkpoint of another configuration (`fingerprint`) is refused.
- Signals: SIGTERM / SIGUSR1 (SLURM pre-emption, a time-limit warning) and submitit's USR2 are recorded while a
  step runs; after it the loop checkpoints, hands over to submitit's handler (which requeues) and ends with
  SystemExit. `kill_at_step` (testing) sends a signal to this process after that step (SIGKILL: a crash).

The benchmark's short timed run (trainer/measure.time_steps) is this loop too (`Loop.timed`): no step log, no
checkpoint, a constant learning rate, synthetic batches made before timing; its caller adds what only a benchmark
needs around each step (the loss scaler's skipped steps left untimed, the collectives of one step counted, the
micro-batch search and its out-of-memory agreement before the timing).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pretrain_planner.launch import progress as job_progress
from pretrain_planner.results import atomic_write_text


# ------------------------------------------------------------------------------------------------ ranks
def env_world() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) from torchrun's environment, or None when it is not there."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    return None


def _submitit_tasks() -> int:
    """The tasks of the submitit job this process is one of (a run whose world size is the job's: the train stage)."""
    import submitit

    return int(submitit.JobEnvironment().num_tasks)


class Ranks:
    """This process's place in the data-parallel run: rank, world size, device, and the few collectives the loop
    needs (agreeing on elapsed time, on a stop signal, and the mean loss). One rank: no process group, unless a
    sharded method needs one (`group_for_one`).

    `world_size`: the ranks the run needs (None: as many as the environment says: the submitit job's tasks,
    torchrun's, or one).
    `device_of(local_rank)`: this rank's device."""

    def __init__(self, world_size: int | None, device_of, group_for_one: bool = False) -> None:
        import datetime as dt

        import torch.distributed as torch_dist

        self.rank, self.world, self.local_rank = 0, 1, 0
        self.backend: str | None = None
        self.launched_by = "single process"
        self._env_set: list[str] = []  # variables this process's one-rank group set (an in-process run)
        if "SUBMITIT_EXECUTOR" in os.environ and (world_size or _submitit_tasks()) > 1:
            from submitit.helpers import TorchDistributedEnvironment

            env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
            self.rank, self.world, self.local_rank = env.rank, env.world_size, env.local_rank
            self.launched_by = "submitit"
        elif (found := env_world()) is not None and found[1] > 1:
            self.rank, self.world, self.local_rank = found
            self.launched_by = "torchrun"
        elif world_size is not None and world_size > 1:
            raise RuntimeError(f"{world_size} ranks: run through the local or slurm launcher, or torchrun")
        if world_size is not None and self.world != world_size:
            raise RuntimeError(f"launched with {self.world} tasks, the setting needs {world_size}")
        self.device = device_of(self.local_rank)
        if self.world > 1 or group_for_one:
            from pretrain_planner.trainer.rank import eager_init_kwargs, process_group_backend

            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            # the trainer's: NCCL + gloo on GPUs (FSDP2 offload's CPU gradient norms), communicators made eagerly
            backend = process_group_backend(self.device)
            if self.world > 1:
                torch_dist.init_process_group(
                    backend, timeout=dt.timedelta(minutes=30), **eager_init_kwargs(self.device, self.world)
                )
            else:  # FSDP's mesh and DeepSpeed's engine need a process group even on one rank
                if torch_dist.is_initialized():
                    raise RuntimeError("a sharded method on one rank needs this process's process group: run it "
                                       "through the local or slurm launcher")  # fmt: skip
                for var, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
                    if var not in os.environ:  # DeepSpeed reads them; close() takes them back
                        os.environ[var] = value
                        self._env_set.append(var)
                torch_dist.init_process_group(backend, store=torch_dist.HashStore(), rank=0, world_size=1)
            self.backend = backend

    @classmethod
    def of(cls, env: Any) -> Ranks:
        """The ranks of a benchmark cell, whose process group trainer.rank set up (and tears down)."""
        ranks = cls.__new__(cls)
        ranks.rank, ranks.world, ranks.local_rank, ranks.device = env.rank, env.world_size, env.local_rank, env.device
        ranks.backend, ranks.launched_by, ranks._env_set = None, "trainer.rank", []
        return ranks

    def env(self):
        """The trainer's view of this rank (trainer.rank.RankEnv)."""
        from pretrain_planner.trainer.rank import RankEnv

        return RankEnv(self.rank, self.world, self.local_rank, self.device, self.backend)

    def _all_reduce(self, values, op: str) -> torch.Tensor:
        """The values (float64, on this rank's device) reduced over the ranks with ReduceOp `op`."""
        import torch.distributed as torch_dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch_dist.all_reduce(t, op=getattr(torch_dist.ReduceOp, op))
        return t

    def max(self, *values: float) -> list[float]:
        """The largest of each value over the ranks (elapsed time: the slowest rank's; a signal: anyone's)."""
        if self.world == 1:
            return list(values)
        return self._all_reduce(values, "MAX").tolist()

    def mean(self, value: float) -> float:
        """The mean over the ranks (the step's loss)."""
        if self.world == 1:
            return value
        return float(self._all_reduce([value], "SUM").item()) / self.world

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as torch_dist

            torch_dist.barrier()

    def close(self) -> None:
        if self.backend is not None:
            import torch.distributed as torch_dist

            if torch_dist.is_initialized():
                torch_dist.destroy_process_group()
            from pretrain_planner.trainer.rank import forget_deepspeed_groups

            forget_deepspeed_groups()
            self.backend = None
        for var in self._env_set:  # an in-process run must not leave a distributed environment behind
            os.environ.pop(var, None)
        self._env_set.clear()


def step_seed(seed: int, rank: int, step: int) -> int:
    """The RNG seed of one rank's step (dropout): a resumed run draws what the uninterrupted one drew."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1, dtype=np.uint64)[0] >> 1)


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep the lines of a step log up to `step` (what a resumed run has not redone)."""
    if not path.exists():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
    atomic_write_text(path, "".join(ln + "\n" for ln in keep))


def append_jsonl(fh, rec: dict[str, Any]) -> None:
    """One record of a step log, flushed: a killed run keeps what it logged."""
    fh.write(json.dumps(rec) + "\n")
    fh.flush()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def loss_ends(losses: list[float]) -> tuple[float | None, float | None]:
    """The mean loss over the first and over the last tenth of the steps (a result's loss_first, loss_last)."""
    if not losses:
        return None, None
    k = max(1, len(losses) // 10)
    return float(np.mean(losses[:k])), float(np.mean(losses[-k:]))


@contextmanager
def stop_signals() -> Iterator[tuple[list[int], dict[int, Any]]]:
    """SIGTERM/SIGUSR1 (SLURM pre-emption, a time-limit warning), and submitit's own pre-emption signal (USR2)
    when it installed a handler, recorded (not acted on) while the loop runs: the loop finishes the step,
    checkpoints, then hands over to submitit's handler (`previous`: requeue). The handlers are put back after."""
    signalled: list[int] = []
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        sigs = [signal.SIGTERM, signal.SIGUSR1]
        preempt = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
        if preempt is not None and callable(signal.getsignal(preempt)) and preempt not in sigs:
            sigs.append(preempt)
        for sig in sigs:
            previous[sig] = signal.signal(sig, lambda s, _f: signalled.append(s))
    try:
        yield signalled, previous
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _StepOnly:
    """A benchmark's TrainStep as the loop's `built`: the learning rate stays the recipe's (a constant schedule
    costs nothing; setting it would recompile a compiled optimizer step), nothing is checkpointed."""

    def __init__(self, step: Any) -> None:
        self.step = step

    def set_lr(self, lr: float) -> None:
        pass

    def observed(self) -> dict[str, Any] | None:
        return self.step.observed()


# ------------------------------------------------------------------------------------------------ hooks
class Hooks:
    """What differs between the loop's callers. Every method has a default but `micro_batch` and `lr`."""

    def micro_batch(self, index: int) -> dict[str, torch.Tensor]:
        """This rank's micro-batch `index` (0 .. accum-1) of the next step, on the rank's device."""
        raise NotImplementedError

    def lr(self, state: dict[str, Any]) -> float:
        """The learning rate of the next step (state: step, elapsed_s, ... before it)."""
        raise NotImplementedError

    def stop(self, state: dict[str, Any]) -> str | None:
        """Why the run ends before another step (None: go on)."""
        return None

    def step_fields(self, state: dict[str, Any]) -> dict[str, Any]:
        """More fields of the step's line in steps.jsonl (after the step)."""
        return {}

    def in_step(self, state: dict[str, Any]) -> None:
        """Inside the step's timed region, after the optimizer step (a test's disturbance)."""

    def after_step(self, loop: Loop) -> None:
        """After every step's record (validation, model folders, ...); may set loop.state["stop"]."""

    def data_state(self) -> dict[str, Any]:
        """Where the data stands (and anything else the hooks must resume), for the checkpoint."""
        return {}

    def load_data_state(self, s: dict[str, Any]) -> None:
        pass

    def on_start(self, loop: Loop) -> None:
        """A fresh run (no checkpoint): its first log line."""

    def on_resume(self, loop: Loop) -> None:
        """After a checkpoint was loaded."""


def host_sync(device: torch.device) -> None:
    """Wait for the device's queued work, so that a time is the work's, not its launch's."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Loop:
    """The loop of one training process (see the module's docstring). `built` is a trainer.methodbuild.Built
    (the method applied: step, set_lr, state_dicts, load_state_dicts); `state` holds step, elapsed_s (training
    time: the steps' and what the hooks add with `add_time`) and stop, plus the caller's keys (`extra_state`)."""

    def __init__(
        self,
        *,
        built: Any,
        ranks: Ranks,
        hooks: Hooks,
        run_dir: Path | None,
        fingerprint: str,
        accum: int,
        seed: int,
        logger: Any,
        fake_step_s: float | None = None,
        checkpoint_every_s: float | None = None,
        checkpoint_every_steps: int | None = None,
        log_every: int = 10,
        warmup_steps: int = 0,
        extra_state: dict[str, Any] | None = None,
    ) -> None:
        self.built, self.ranks, self.hooks = built, ranks, hooks
        self.step_fn = built.step
        self.device = ranks.device
        self.rank0 = ranks.rank == 0
        self.run_dir = Path(run_dir) if run_dir is not None else Path(os.devnull)  # devnull: no files (`timed`)
        if run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.fp, self.accum, self.seed, self.logger = fingerprint, accum, seed, logger
        self.fake_step_s = fake_step_s
        self.checkpoint_every_s, self.checkpoint_every_steps = checkpoint_every_s, checkpoint_every_steps
        self.log_every = max(1, int(log_every))
        self.warmup_steps = warmup_steps  # steps after each (re)start marked "warmup" in steps.jsonl
        self.ckpt_path = self.run_dir / "checkpoint.pt"
        self.steps_path = self.run_dir / "steps.jsonl"
        self.ds_dir = self.run_dir / "deepspeed"
        self.state: dict[str, Any] = {"step": 0, "elapsed_s": 0.0, "stop": None, **(extra_state or {})}
        self.resumed_from: int | None = None
        self.since_start = 0
        self.observed: dict[str, Any] | None = None
        self.last: dict[str, Any] | None = None  # the last step's record
        self._steps_fh: Any = None

    @classmethod
    def timed(cls, step: Any, ranks: Ranks, hooks: Hooks, accum: int, seed: int) -> Loop:
        """The benchmark's short timed run: the same step as every other run, no step log, no checkpoint."""
        import logging

        return cls(
            built=_StepOnly(step), ranks=ranks, hooks=hooks, run_dir=None, fingerprint="", accum=accum, seed=seed,
            logger=logging.getLogger("pretrain_planner.benchmark"), log_every=2**31,
        )  # fmt: skip

    # -- start -------------------------------------------------------------------------------------------
    def resume_or_start(self, extra_logs: tuple[Path, ...] = ()) -> None:
        """From checkpoint.pt when it is there (and belongs to this configuration), else fresh; the step logs
        (steps.jsonl and `extra_logs`) cut back to the checkpoint's step. Every rank."""
        if self.ckpt_path.exists():
            self._load_checkpoint()
        elif self.rank0:
            for p in (self.steps_path, *extra_logs):
                p.unlink(missing_ok=True)
            self.hooks.on_start(self)
        if self.rank0:
            for p in (self.steps_path, *extra_logs):
                truncate_jsonl(p, self.state["step"])
        self.ranks.barrier()  # rank 0 has read the checkpoint before anyone can overwrite it

    def _load_checkpoint(self) -> None:
        ck = torch.load(self.ckpt_path, map_location="cpu", weights_only=False)
        if ck["fingerprint"] != self.fp:
            raise RuntimeError(f"{self.ckpt_path} belongs to another configuration or data; delete {self.run_dir} "
                               "to start over")  # fmt: skip
        self.built.load_state_dicts(ck, self.ds_dir)
        if self.step_fn.scaler is not None and ck["scaler"]:
            self.step_fn.scaler.load_state_dict(ck["scaler"])
        self.hooks.load_data_state(ck["data"])
        self.state = ck["state"]
        rng = ck.get("rng") or {}
        if rng.get("torch") is not None:  # reseeded every step anyway (step_seed); kept for what runs between
            torch.set_rng_state(rng["torch"])
        self.resumed_from = self.state["step"]
        self.logger.info("resumed at step %d, %.1f s of training time so far", self.state["step"],
                         self.state["elapsed_s"])  # fmt: skip
        self.hooks.on_resume(self)

    # -- the clock -------------------------------------------------------------------------------------------
    def clock(self, t0: float, fake: float) -> float:
        """Seconds since t0 (the device's work finished), or `fake` under a fake clock (tests)."""
        if self.fake_step_s is not None:
            return fake
        host_sync(self.device)
        return time.perf_counter() - t0

    def add_time(self, t0: float) -> float:
        """Count the time since t0 (the slowest rank's) as training time (e.g. a validation); returns it."""
        (dt,) = self.ranks.max(self.clock(t0, 0.0))
        self.state["elapsed_s"] += dt
        return dt

    # -- the loop --------------------------------------------------------------------------------------------
    def run(self, kill_at_step: int | None = None, kill_signal: int = signal.SIGKILL) -> None:
        """Steps until the hooks' stop (or a signal); after each: the step log, the hooks' after_step, a
        checkpoint when due. A signal: checkpoint, then submitit's handler or SystemExit."""
        state = self.state
        last_ckpt_s, last_ckpt_step = state["elapsed_s"], state["step"]
        log_path = self.steps_path if self.rank0 else Path(os.devnull)
        with stop_signals() as (signalled, previous), log_path.open("a") as fh:
            self._steps_fh = fh
            while state["stop"] is None:
                why = self.hooks.stop(state)
                if why is not None:
                    state["stop"] = why
                    break
                stop_sig = self.step(signalled)
                self.hooks.after_step(self)
                due_s = self.checkpoint_every_s is not None and (
                    state["elapsed_s"] - last_ckpt_s >= self.checkpoint_every_s
                )
                due_steps = self.checkpoint_every_steps is not None and (
                    state["step"] - last_ckpt_step >= self.checkpoint_every_steps
                )
                if due_s or due_steps or stop_sig:
                    self.checkpoint()
                    last_ckpt_s, last_ckpt_step = state["elapsed_s"], state["step"]
                if stop_sig:
                    self._stop_on_signal(int(stop_sig), previous)
                if kill_at_step is not None and state["step"] >= kill_at_step and self.rank0:
                    os.kill(os.getpid(), kill_signal)
            self._steps_fh = None

    def step(self, signalled: list[int], wrap: Any = None) -> float:
        """One optimizer step over the global batch; the ranks agree on its time and on any stop signal (the
        signal's number, 0 for none, is returned). Logged in steps.jsonl and every `log_every` steps; the record
        is `self.last`. `wrap(work)`: runs the step's work (e.g. under the profiler) and returns what it returns."""
        state, ranks, accum, step_fn = self.state, self.ranks, self.accum, self.step_fn
        lr = self.hooks.lr(state)
        self.built.set_lr(lr)
        torch.manual_seed(step_seed(self.seed, ranks.rank, state["step"]))

        def work() -> list[torch.Tensor]:
            # trainer.step: DDP all-reduces on the last micro-batch only (no_sync before), FSDP2 reduce-scatters
            # each (or the last), ZeRO marks the accumulation boundary; autocast / loss scaling; then clipping, the
            # optimizer, zeroed gradients. The losses stay on the device: read once after the step.
            micro_losses = step_fn.accumulate(self.hooks.micro_batch, accum)
            self.hooks.in_step(state)
            return micro_losses

        host_sync(self.device)
        t0 = time.perf_counter()
        micro_losses = work() if wrap is None else wrap(work)
        if self.observed is None:  # what the evidence probe saw in the first micro-batch
            self.observed = self.built.observed() or {}
        dt, stop_sig = ranks.max(self.clock(t0, self.fake_step_s or 0.0), float(signalled[0] if signalled else 0))
        loss_sum = ranks.mean(float(torch.stack(micro_losses).sum()))
        state["elapsed_s"] += dt
        state["step"] += 1
        self.since_start += 1
        fields = self.hooks.step_fields(state)
        rec = {"step": state["step"], "elapsed_s": round(state["elapsed_s"], 6), **fields, "lr": lr, "loss": loss_sum,
               "step_time_s": round(dt, 6)}  # fmt: skip
        if self.since_start <= self.warmup_steps:
            rec["warmup"] = True
        self.last = rec
        if self.rank0 and self._steps_fh is not None:
            append_jsonl(self._steps_fh, rec)
        if state["step"] % self.log_every == 0 or state["step"] == 1:
            self.logger.info("step %d lr %.3g loss %.4f (%.3f s)%s", state["step"], lr, loss_sum, dt,
                             "".join(f" {k} {v}" for k, v in fields.items()))  # fmt: skip
        return stop_sig

    def _stop_on_signal(self, sig: int, previous: dict[int, Any]) -> None:
        """After the checkpoint of a signalled step: hand over to submitit's handler (rank 0 requeues the job and
        exits) or end the run with SystemExit."""
        self.logger.info("signal %d at step %d: checkpoint saved, stopping", sig, self.state["step"])
        handler = previous.get(sig)
        if callable(handler):
            handler(sig, None)
        raise SystemExit(f"training: signal {sig} at step {self.state['step']}; checkpoint saved")

    # -- checkpoints -----------------------------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Rank 0 writes (DDP: every rank holds the same weights and optimizer state; FSDP2: gathered into full
        state dicts; ZeRO: every rank writes its shards into run_dir/deepspeed first, checkpoint.pt names them);
        the others wait, so that the write is not counted in the next step's time."""
        t0 = time.perf_counter()
        tag = f"step{self.state['step']}"
        parts = self.built.state_dicts(self.ds_dir, tag)  # a collective under FSDP2 / ZeRO
        if not self.rank0:
            self.ranks.barrier()
            return
        scaler = self.step_fn.scaler
        ck = {
            "fingerprint": self.fp, **parts, "scaler": scaler.state_dict() if scaler else {},
            "data": self.hooks.data_state(), "state": dict(self.state),
            "rng": {"torch": torch.get_rng_state(), "scheme": "torch reseeded every step from (seed, rank, step)"},
        }  # fmt: skip
        tmp = self.ckpt_path.with_name(".checkpoint.pt.tmp")
        torch.save(ck, tmp)
        os.replace(tmp, self.ckpt_path)
        job_progress.mark(self.state["step"], "checkpointed step")  # a time-out requeue must get further than this
        self.built.prune_deepspeed(self.ds_dir, keep=tag)
        dt = time.perf_counter() - t0
        # what checkpointing cost so far (rank 0's writes; every other rank waits at the barrier meanwhile); the
        # write that a restart resumes from is counted in the checkpoint before it only
        self.state["checkpoints"] = self.state.get("checkpoints", 0) + 1
        self.state["checkpoint_s"] = self.state.get("checkpoint_s", 0.0) + dt
        self.logger.info("checkpoint at step %d (%.2f s to write)", self.state["step"], dt)
        self.ranks.barrier()
