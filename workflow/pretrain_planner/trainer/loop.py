"""The one training loop: optimizer steps with gradient accumulation over the method's step, the learning rate
from a schedule, checkpoint/resume, stop signals and the step log, for every caller that trains for real (the
budget stage's time-budgeted MLM, the train stage that runs an exported plan), in the style of torchtitan's
Trainer: what differs between callers is a `Hooks` object (data, schedule, when to stop, what else happens after
a step), the loop itself is one.

- Ranks (trainer/ranks.py): this process's place in a data-parallel run; after each step the ranks agree on its
  time (the slowest rank's) and on any stop signal, so schedules keyed on time and the stop are the same
  everywhere.
- A step (`Loop.step`): the schedule's learning rate on every parameter group, the RNG reseeded per (seed, rank,
  step) (dropout: a resumed run draws what the uninterrupted one drew), `accum` micro-batches from the hooks
  (gradients synchronised on the last one only: trainer.step), the optimizer step, the mean loss over ranks;
  one line of steps.jsonl (trainer/steplog.py: flushed, a killed run keeps what it logged).
- Checkpoints (`Loop.checkpoint`): rank 0 writes checkpoint.pt (the method's state dicts: weights, optimizer,
  loss scaler; FSDP2 as full state dicts, ZeRO naming the engine's sharded checkpoint), the data position and the
  schedule's state (`Hooks.data_state`), the loop's state and the RNG; every rank reads it back (`resume`), and a
  checkpoint of another configuration (`fingerprint`) is refused: with the run's `identity` (trainer/runidentity.py)
  in one line naming what differs (CheckpointMismatch).
- Signals (trainer/signals.py): SIGTERM / SIGUSR1 (SLURM pre-emption, a time-limit warning) and submitit's USR2
  are recorded while a step runs; after it the loop checkpoints, hands over to submitit's handler (which requeues)
  and ends with SystemExit. `kill_at_step` (testing) sends a signal to this process after that step (SIGKILL: a crash).

The benchmark's short timed run (trainer/measure.time_steps) is this loop too (`Loop.timed`): no step log, no
checkpoint, a constant learning rate, synthetic batches made before timing; its caller adds what only a benchmark
needs around each step (the loss scaler's skipped steps left untimed, the collectives of one step counted, the
micro-batch search and its out-of-memory agreement before the timing).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pretrain_planner import layout
from pretrain_planner.launch import progress as job_progress
from pretrain_planner.tables import units
from pretrain_planner.trainer import startup
from pretrain_planner.trainer.ranks import Ranks
from pretrain_planner.trainer.runidentity import CheckpointMismatch, mismatch_message, write_identity
from pretrain_planner.trainer.signals import stop_signals
from pretrain_planner.trainer.steplog import append_jsonl, truncate_jsonl

PACE_ENV = "PP_TEST_STEP_S"


def paced_step_s() -> float:
    """Test hook PP_TEST_STEP_S="<seconds>": every step of the loop (a benchmark's timed and warm-up steps, the train
    and budget stages' steps) lasts at least that long, the rest of it slept. A fault drill needs a job that runs
    for a while (to kill it, to outlast a time limit); paced, it runs that long without keeping a core busy, and
    for as long on a fast host as on a slow one. 0: unset (never set by the pipeline)."""
    raw = os.environ.get(PACE_ENV, "").strip()
    return float(raw) if raw else 0.0


def step_seed(seed: int, rank: int, step: int) -> int:
    """The RNG seed of one rank's step (dropout): a resumed run draws what the uninterrupted one drew."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1, dtype=np.uint64)[0] >> 1)


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
    """What differs between the loop's callers. Every method has a default but `batch_at` and `lr`."""

    def batch_at(self, index: int) -> dict[str, torch.Tensor]:
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
        identity: dict[str, Any] | None = None,
        identity_notes: dict[str, Any] | None = None,
    ) -> None:
        self.built, self.ranks, self.hooks = built, ranks, hooks
        self.step_fn = built.step
        self.device = ranks.device
        self.rank0 = ranks.rank == 0
        self.run_dir = Path(run_dir) if run_dir is not None else Path(os.devnull)  # devnull: no files (`timed`)
        if run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.fp, self.accum, self.seed, self.logger = fingerprint, accum, seed, logger
        # what the checkpoint belongs to, by name (trainer/runidentity.py; None: the fingerprint alone), and how to
        # describe a part of it in a refusal (the data's label beside its fingerprint)
        self.identity, self.identity_notes = identity, identity_notes or {}
        self.fake_step_s = fake_step_s
        self.checkpoint_every_s, self.checkpoint_every_steps = checkpoint_every_s, checkpoint_every_steps
        self.log_every = max(1, int(log_every))
        self.warmup_steps = warmup_steps  # steps after each (re)start marked "warmup" in steps.jsonl
        self.ckpt_path = self.run_dir / layout.CHECKPOINT
        self.steps_path = self.run_dir / layout.STEPS
        self.ds_dir = self.run_dir / layout.DEEPSPEED_CHECKPOINTS
        # starts: one entry per process start (note_start), kept in the checkpoint across requeues
        self.state: dict[str, Any] = {"step": 0, "elapsed_s": 0.0, "stop": None, "starts": [], **(extra_state or {})}
        self.resumed_from: int | None = None
        self.read_s: float | None = None  # this process's checkpoint read (None: a fresh start)
        self._start: dict[str, Any] | None = None  # this process's entry of state["starts"]
        self.since_start = 0
        self.observed: dict[str, Any] | None = None
        self.last: dict[str, Any] | None = None  # the last step's record
        self.pace_s = paced_step_s()  # a test's pace (0: none), read once: the step is the hot path
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
        host_sync(self.device)
        t0 = time.perf_counter()
        ck = torch.load(self.ckpt_path, map_location="cpu", weights_only=False)
        if ck["fingerprint"] != self.fp:
            made, notes = ck.get("identity"), ck.get("identity_notes")
            msg = mismatch_message(self.ckpt_path, self.run_dir, made, notes, self.identity, self.identity_notes)
            raise CheckpointMismatch(msg)
        self.built.load_state_dicts(ck, self.ds_dir)
        if self.step_fn.scaler is not None and ck["scaler"]:
            self.step_fn.scaler.load_state_dict(ck["scaler"])
        self.hooks.load_data_state(ck["data"])
        self.state = ck["state"]
        self.state["starts"] = startup.normal_starts(self.state.get("starts") or [])  # an older checkpoint's too
        rng = ck.get("rng") or {}
        if rng.get("torch") is not None:  # reseeded every step anyway (step_seed); kept for what runs between
            torch.set_rng_state(rng["torch"])
        self.resumed_from = self.state["step"]
        host_sync(self.device)
        self.read_s = time.perf_counter() - t0  # the checkpoint read: the file and every state dict loaded
        self.logger.info("resumed at step %d, %.1f s of training time so far (%.2f s to read the checkpoint)",
                         self.state["step"], self.state["elapsed_s"], self.read_s)  # fmt: skip
        self.hooks.on_resume(self)

    def note_start(self, phases: dict[str, float | None], process_start: str) -> dict[str, Any]:
        """This process's start in state["starts"] (every rank, after resume_or_start; each value the slowest
        rank's): its start-up phases but compile (trainer/startup.py: process_to_rank_s, model_build_s,
        method_wrap_s, data_ready_s), the step it starts at and the checkpoint read when it resumed; its first step's
        time is added after that step (`first_step_s`: compile_s against the run's steady step at the end)."""
        keys = startup.PHASES[:-1]
        values = [float(phases.get(k) or 0.0) for k in keys] + [self.read_s or 0.0]
        *agreed, read_s = self.ranks.max(*values)
        entry = {"step": self.state["step"], **dict(zip(keys, agreed, strict=True)),
                 "read_s": read_s if self.read_s is not None else None, "first_step_s": None,
                 "process_start": process_start}  # fmt: skip
        self.state.setdefault("starts", []).append(entry)
        self._start = entry
        return entry

    def restart_costs(self, steps: list[dict[str, Any]]) -> dict[str, Any]:
        """Rank 0, after the last checkpoint: result.json's `starts` (every start with its compile_s and total_s),
        `startup` (the last start's) and `checkpoint` (the writes and reads; trainer/startup.py)."""
        starts, steady = startup.run_starts(self.state.get("starts") or [], steps)
        fake: str | None = "a fake clock (testing): every step counted fake_step_s, so compile_s is 0"
        fake = fake if self.fake_step_s is not None else None
        record = startup.startup_record(starts, steady, fake)
        nbytes = startup.checkpoint_bytes(self.run_dir, layout.CHECKPOINT, layout.DEEPSPEED_CHECKPOINTS)
        return {"starts": starts, "startup": record,
                "checkpoint": startup.checkpoint_record(self.state, starts, nbytes)}  # fmt: skip

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
            micro_losses = step_fn.accumulate(self.hooks.batch_at, accum)
            self.hooks.in_step(state)
            if self.pace_s:
                time.sleep(max(0.0, self.pace_s - (time.perf_counter() - t0)))
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
        if self.since_start == 1 and self._start is not None:
            self._start["first_step_s"] = dt  # this start's first step (the slowest rank's): compile, warm-up
        fields = self.hooks.step_fields(state)
        rec = {"step": state["step"], "elapsed_s": round(state["elapsed_s"], 6), **fields, "lr": lr, "loss": loss_sum,
               "step_time_s": round(dt, 6)}  # fmt: skip
        if self.since_start <= self.warmup_steps:
            rec["warmup"] = True
        self.last = rec
        if self.rank0 and self._steps_fh is not None:
            append_jsonl(self._steps_fh, rec)
        if state["step"] % self.log_every == 0 or state["step"] == 1:
            self.logger.info("step %d lr %.3g loss %.4g (%s)%s", state["step"], lr, loss_sum, units.step(dt),
                             "".join(f" {k} {v:.4g}" if isinstance(v, float) else f" {k} {v}"
                                     for k, v in fields.items()))  # fmt: skip
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
        # this write counted in the checkpoint it writes (a start that resumes from it knows it was written); its
        # seconds are known only after it, so it counts as not timed there (checkpoints_timed)
        writes, timed = self.state.get("checkpoints", 0), self.state.get("checkpoints_timed")
        timed = writes if timed is None else timed
        ck = {
            "fingerprint": self.fp, "identity": self.identity, "identity_notes": self.identity_notes, **parts,
            "scaler": scaler.state_dict() if scaler else {},
            "data": self.hooks.data_state(), "state": {**self.state, "checkpoints": writes + 1,
                                                       "checkpoints_timed": timed},
            "rng": {"torch": torch.get_rng_state(), "scheme": "torch reseeded every step from (seed, rank, step)"},
        }  # fmt: skip
        tmp = self.ckpt_path.with_name(".checkpoint.pt.tmp")
        torch.save(ck, tmp)
        if self.identity is not None:  # beside it, readable without the weights (runidentity.precheck)
            write_identity(self.run_dir, self.identity, self.identity_notes)
        os.replace(tmp, self.ckpt_path)
        job_progress.mark(self.state["step"], "checkpointed step")  # a time-out requeue must get further than this
        self.built.prune_deepspeed(self.ds_dir, keep=tag)
        dt = time.perf_counter() - t0
        # what checkpointing cost so far (rank 0's writes; every other rank waits at the barrier meanwhile); the
        # write that a restart resumes from is counted there but its seconds are not (checkpoints_timed)
        self.state["checkpoints"] = writes + 1
        self.state["checkpoints_timed"] = timed + 1
        self.state["checkpoint_s"] = self.state.get("checkpoint_s", 0.0) + dt
        self.logger.info("checkpoint at step %d (%.2f s to write)", self.state["step"], dt)
        self.ranks.barrier()
