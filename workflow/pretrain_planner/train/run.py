"""Run an exported plan for real, on every rank: the plan's method through the trainer's pieces (as a benchmark
cell builds it: trainer/methodbuild.py, the one build path, on the plan's model, GPU and recipe values), the task's data
(trainer/tasks.py), the recipe's optimizer and schedule (trainer.schedule.recipe_lr), step-budgeted (--steps, or the
recipe's steps) or time-budgeted (--time-budget-h, or the recipe's time budget), on the shared loop
(trainer/loop.py: accumulation, checkpoint/resume exactly after a kill, signals, the step log).

Rank 0 writes `result.json` (the run, plan.json's method_settings beside what the trainer reports it applied,
the data and whether it is synthetic, the sustained throughput beside the benchmark's prediction and their
ratios, the validation loss) and `throughput.{md,csv}` (train/record.py) in the output folder; `run/` holds
checkpoint.pt, steps.jsonl, metrics.csv and TensorBoard's event files (trainer/metrics.py) and `data/` the prepared
data.

Resume: a rerun resumes the run of its output folder when it has the checkpoint's identity (trainer/runidentity.py:
model, method, micro-batch x accumulation x ranks, seed, the data's content), whatever launched either (the
Snakemake target, `pretrain-planner train`, launch.sh); the budget is not part of it: a larger one extends the run,
its learning-rate schedule recomputed over the new budget from the step it stands at (said in the log). A checkpoint
of another identity is refused in one line (every rank returns {"status": "refused", "reason": ...}).

Validation: every `eval_every` steps and at the end, the loss on the held-out slice of the data (trainer/validation.py),
in that step's line of steps.jsonl (`val_loss`), metrics.csv, TensorBoard and result.json (`val_loss`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pretrain_planner import layout
from pretrain_planner.launch.local import torch_job
from pretrain_planner.planning.configtypes import TrainSection, require
from pretrain_planner.planning.methods import Method
from pretrain_planner.planning.runspec import RunSpec, TrainSetting, accumulation
from pretrain_planner.planning.settings import differences
from pretrain_planner.planning.tasks import TASKS
from pretrain_planner.results import atomic_write_text
from pretrain_planner.runlog import FileLog, fingerprint
from pretrain_planner.tables import units
from pretrain_planner.train import record
from pretrain_planner.train.jobs import CONSOLE_MARK, canonical, canonical_tokenizer
from pretrain_planner.trainer import methodbuild, runidentity, schedule, startup, tasks
from pretrain_planner.trainer.loop import Hooks, Loop
from pretrain_planner.trainer.metrics import Metrics
from pretrain_planner.trainer.ranks import Ranks
from pretrain_planner.trainer.run import versions
from pretrain_planner.trainer.runidentity import RunRefused, identity_hash
from pretrain_planner.trainer.steplog import loss_ends, read_jsonl
from pretrain_planner.trainer.validation import validation_loss

TRAIN_PACKAGES = ("torch", "transformers", "tokenizers", "deepspeed", "pretrain-planner")  # in result.json
DEFAULTS = TrainSection.defaults()  # the schema's train section: a run's defaults where no config gives them


@dataclass(frozen=True)
class RunOptions:
    """One process's options of a plan's run, typed once where the job's JSON arguments come in (`train_plan`):
    the config's train section as the job got it (`train`: the budget, the data, checkpoints, validation, the
    device; its paths canonical) and the process's own (torch threads, seed, warm-up, logging, a testing clock)."""

    train: TrainSection
    threads: int | None
    seed: int
    warmup_steps: int
    log_every: int
    checkpoint_every_steps: int | None
    fake_step_s: float | None


def load_plan(plan: str | Path) -> tuple[dict[str, Any], Path]:
    """plan.json (or the folder holding it), read."""
    p = Path(plan)
    if p.is_dir():
        p = p / layout.PLAN_FILE
    rec = json.loads(p.read_text())
    for key in ("model", "gpu", "nodes", "gpus_per_node", "method", "measured"):
        if key not in rec:
            raise ValueError(f"{p}: not a plan of the export_plan rule (no {key!r})")
    return rec, p


def _device_of(plan: dict[str, Any], device: str):
    gpu = plan["gpu"]["name"]

    def of(local_rank: int) -> torch.device:
        if device == "cpu" or (device == "auto" and gpu == "cpu"):
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise RuntimeError(f"the plan is for GPU type {gpu!r} but no CUDA device is visible on "
                               f"{socket.gethostname()} (--device cpu runs it on CPU processes)")  # fmt: skip
        from pretrain_planner.trainer.rank import device_index

        return torch.device("cuda", device_index(local_rank, torch.cuda.device_count()))

    return of


class Training(Hooks):
    """One process of a run that trains for real, the general case: its ranks (`world_size` None: as many as the
    launcher started), rank 0's log, the task's data (`data`: trainer/tasks.py), the method through the trainer's
    one build path (`build_method`: checked, then built) and the shared loop with this object as its hooks
    (`start_loop`). The stages are recipes of it: a plan's run (`_Train` below) and the budget stage's
    time-budgeted masked LM (budget/pretrain.py). A subclass sets `micro_batch`, `accum` and `data` before building."""

    micro_batch: int
    accum: int
    data: tasks.TaskData

    def __init__(
        self,
        world_size: int | None,
        device_of: Any,
        method: Method,
        log: str | Path | None,
        clock: startup.Clock | None = None,
    ) -> None:
        self.method = method
        self.clock = clock  # the start-up clock of this process (trainer/startup.py), begun by the stage's entry
        self.ranks = Ranks(world_size, device_of, group_for_one=bool(method.sharding))
        self.rank_up_s = clock.rank_up() if clock is not None else None
        self.data_ready_s: float | None = None  # the subclass's data made ready (`time_data`)
        self.rank0, self.world, self.device = self.ranks.rank == 0, self.ranks.world, self.ranks.device
        self.logger = FileLog(log if self.rank0 else None)

    def build_method(self, spec: RunSpec, where: str, seed: int, **build: Any) -> methodbuild.Built:
        """The run's method (`where` names its source in errors): refused before anything is built if it cannot
        run here, else built with the same weights on every rank."""
        env = self.ranks.env()
        methodbuild.check_stage(spec, env, where)
        self.built = methodbuild.build(spec, env, self.micro_batch, self.accum, seed, **build)
        return self.built

    def time_data(self, make: Any) -> Any:
        """`make()` (the task's data made ready), its seconds kept as this start's data_ready_s."""
        t0 = time.perf_counter()
        out = make()
        self.data_ready_s = time.perf_counter() - t0
        return out

    def note_start(self) -> dict[str, Any]:
        """This process's start in the loop's `starts` (every rank, after resume_or_start): its start-up phases."""
        timings = self.built.timings
        phases = {"process_to_rank_s": self.rank_up_s, "model_build_s": timings.get("model_build_s"),
                  "method_wrap_s": timings.get("method_wrap_s"), "data_ready_s": self.data_ready_s}  # fmt: skip
        return self.loop.note_start(phases, self.clock.process_start if self.clock is not None else "unknown")

    def start_loop(self, run_dir: Path, fingerprint: str, seed: int, **loop: Any) -> Loop:
        self.loop = Loop(built=self.built, ranks=self.ranks, hooks=self, run_dir=run_dir, fingerprint=fingerprint,
                         accum=self.accum, seed=seed, logger=self.logger, **loop)  # fmt: skip
        return self.loop

    # -- the loop's hooks every run shares ----------------------------------------------------------------
    def batch_at(self, index: int) -> dict[str, torch.Tensor]:
        """This rank's slice of the next micro_batch * world samples of the global stream (the sampler's state is the
        same on every rank, so rank 0's checkpoint resumes them all)."""
        return self.data.batch(self.micro_batch, self.world, self.ranks.rank, self.device)

    def data_state(self) -> dict[str, Any]:
        return {"sampler": self.data.state()}

    def load_data_state(self, s: dict[str, Any]) -> None:
        self.data.load_state(s["sampler"])


class _Train(Training):
    """One process of a plan's run: the plan's model, method and recipe, a step or time budget, the loop's hooks
    (schedule, stop)."""

    def __init__(
        self, plan: dict[str, Any], plan_path: Path, out: Path, o: RunOptions, clock: startup.Clock | None = None
    ) -> None:
        require(o, RunOptions, "train.run._Train")
        self.plan, self.plan_path, self.out, self.o, self.t = plan, plan_path, out, o, o.train
        model = plan["model"]
        self.task, self.recipe = model["task"], model["recipe"]
        if o.threads:
            torch.set_num_threads(int(o.threads))
        self.setting = TrainSetting.of_plan(plan, str(plan_path))  # the benchmark's setting, read once
        super().__init__(None, _device_of(plan, o.train.device), self.setting.method, out / layout.TRAIN_LOG, clock)
        self.notes: list[str] = []
        self.metrics: Metrics | None = None  # rank 0's metrics.csv and TensorBoard events, from the loop's start
        self.elapsed_at_start = 0.0  # the training time this start resumed at (its ETA's)
        self.micro_batch = self.setting.micro_batch
        gb = int(self.recipe["global_batch"])
        self.accum, self.global_batch = accumulation(gb, self.micro_batch, self.world), gb
        self.plan_world = self.setting.world_size
        if self.world != self.plan_world:
            self.notes.append(f"ran on {self.world} rank(s), the plan's setting has {self.plan_world}: accumulation "
                              f"{self.accum} instead of {self.setting.grad_accum_steps}, so the throughput is not the "
                              "same setting as the prediction")  # fmt: skip
        self._budget()

    def prepare(self) -> None:
        """Refuse a checkpoint of another run before anything is written (its parts known before the data), then
        the task's data."""
        run_dir = self.out / layout.TRAIN_RUN
        runidentity.precheck(run_dir, run_dir / layout.CHECKPOINT, self.identity(with_data=False), {})
        self.time_data(self._data)

    # -- set-up ----------------------------------------------------------------------------------------------
    def _budget(self) -> None:
        t, r = self.t, self.recipe
        if t.steps is not None:
            self.budget = {"mode": "steps", "steps": int(t.steps), "source": "--steps"}
        elif t.time_budget_hours is not None:
            self.budget = {"mode": "time", "hours": float(t.time_budget_hours), "source": "--time-budget-h"}
        elif r.get("steps"):
            self.budget = {"mode": "steps", "steps": int(r["steps"]), "source": "the recipe's steps"}
        elif r.get("time_budget_hours"):
            self.budget = {"mode": "time", "hours": float(r["time_budget_hours"]), "source": "the recipe's time budget"}
        else:
            raise ValueError("the recipe has neither steps nor a time budget: pass --steps or --time-budget-h")

    def _data(self) -> None:
        """The task's data (trainer/tasks.py): rank 0 prepares (tokenizer, packing, shards), the others then read
        what it wrote."""
        t, out = self.t, self.out
        need = max(256, self.global_batch * 4)
        for turn in ("rank0", "others"):
            if (turn == "rank0") == self.rank0:
                req = tasks.DataRequest(t.data, t.tokenizer, self.o.seed, need, out / "data", out / layout.TRAIN_LOG,
                                        self.rank0, t.data_dtype, t.data_field)  # fmt: skip
                self.data = tasks.prepare(self.plan["model"], req)
            if turn == "rank0":
                self.ranks.barrier()
        self.model, self.data_info = self.data.model, self.data.info
        self.notes.extend(self.data.notes)

    def build(self) -> None:
        """The plan's method on the plan's model, GPU and recipe values, as a benchmark cell builds it."""
        o, plan = self.o, self.plan
        nodes = self.setting.nodes if self.world == self.plan_world else 1
        spec = RunSpec.of(self.model, plan["gpu"], self.method, self.world, cuda=self.device.type == "cuda",
                          nodes=nodes)  # fmt: skip
        sched = self.recipe.get("schedule") or TASKS[self.task].default_schedule
        self.build_method(
            spec, "plan.json method", o.seed, grad_sync=self.setting.grad_sync,
            lr_schedule=f"the recipe's {json.dumps(sched)} over the run's {self.budget['mode']} budget, set every step "
                        "(trainer.schedule.recipe_lr)",
        )  # fmt: skip
        identity = self.identity()
        self.start_loop(
            self.out / layout.TRAIN_RUN, identity_hash(identity), o.seed, fake_step_s=o.fake_step_s,
            checkpoint_every_s=self.t.checkpoint_every_min * 60 if self.t.checkpoint_every_min else None,
            checkpoint_every_steps=o.checkpoint_every_steps, log_every=o.log_every,
            warmup_steps=o.warmup_steps, extra_state={"budget": self.budget}, identity=identity,
            identity_notes={"data": self.data_info["label"]},
        )  # fmt: skip

    def identity(self, with_data: bool = True) -> dict[str, Any]:
        """What the run's checkpoint belongs to (trainer/runidentity.py): what changes the model it trains and the
        data it reads, by name (the model's settings: the plan's architecture and recipe); not the budget (a larger
        one extends the run), nor paths or launcher. `with_data` False: the parts known before the data."""
        model = self.plan["model"]
        ident = {"model": model["name"], "model_settings": fingerprint(model), "method": self.plan["method"],
                 "micro_batch": self.micro_batch, "grad_accum_steps": self.accum, "ranks": self.world,
                 "seed": self.o.seed}  # fmt: skip
        return {**ident, "data": self.data_info.get("fingerprint")} if with_data else ident

    # -- the loop's hooks ----------------------------------------------------------------------------------
    def progress(self, state: dict[str, Any], budget: dict[str, Any] | None = None) -> float:
        """How far the run is through `budget` (default: this run's)."""
        budget = budget or self.budget
        if budget["mode"] == "steps":
            return state["step"] / budget["steps"]
        return state["elapsed_s"] / schedule.budget_seconds(budget["hours"])

    def lr(self, state: dict[str, Any], budget: dict[str, Any] | None = None) -> float:
        """The recipe's schedule over `budget` (default: this run's; a resumed run with a larger budget has it
        recomputed over the new one from where it stands)."""
        budget = budget or self.budget
        total = budget["steps"] if budget["mode"] == "steps" else None
        return schedule.recipe_lr(self.schedule, float(self.recipe["optimizer"]["lr"]), state["step"],
                                  self.progress(state, budget), total)  # fmt: skip

    @property
    def schedule(self) -> dict[str, Any]:
        return self.recipe.get("schedule") or TASKS[self.task].default_schedule

    def stop(self, state: dict[str, Any]) -> str | None:
        if self.budget["mode"] == "steps" and state["step"] >= self.budget["steps"]:
            return "steps"
        if self.budget["mode"] == "time" and self.progress(state) >= 1.0:
            return "time budget"
        return None

    def step_fields(self, state: dict[str, Any]) -> dict[str, Any]:
        """The step's progress, and its validation loss when one is due (every `eval_every` steps and at the end of
        the budget): every rank evaluates, its time counted as training time (`val_s`)."""
        fields: dict[str, Any] = {"progress": round(self.progress(state), 6)}
        every = self.t.eval_every
        due = (every and state["step"] % every == 0) or self.stop(state) is not None
        if due and self.data.validation is not None and self.t.eval_batches:
            t0 = time.perf_counter()
            vl = validation_loss(self.data.validation, self.built, self.micro_batch, self.t.eval_batches,
                                 self.device)  # fmt: skip
            state["val_s"] = state.get("val_s", 0.0) + self.loop.add_time(t0)
            fields["val_loss"] = vl
        return fields

    def after_step(self, loop: Loop) -> None:
        """Rank 0: the step's metrics (metrics.csv, TensorBoard) and, every log_every steps, at the first and at
        the last, a progress line on the console."""
        rec = loop.last or {}
        if self.metrics is not None:
            self.metrics.write(rec, self.global_batch, self.data.tokens_per_sample)
        step = rec.get("step", 0)
        last = self.stop(loop.state) is not None
        if self.rank0 and (step % loop.log_every == 0 or step == 1 or last or "val_loss" in rec):
            self.say(self.progress_line(loop, rec))

    def progress_line(self, loop: Loop, rec: dict[str, Any]) -> str:
        """step/total (or elapsed/budget), loss, validation loss, tokens/s, step time, ETA, rounded as the tables
        round (tables/units.py)."""
        state, b = loop.state, self.budget
        done = loop.since_start
        spent = state["elapsed_s"] - self.elapsed_at_start
        if b["mode"] == "steps":
            where = f"step {state['step']}/{b['steps']}"
            eta = (b["steps"] - state["step"]) * spent / done if done else None
        else:
            spent_txt, budget_txt = units.duration_s(state["elapsed_s"]), units.duration_s(b["hours"] * 3600)
            where = f"step {state['step']}, {spent_txt} of {budget_txt}"
            eta = schedule.budget_seconds(b["hours"]) - state["elapsed_s"]
        dt = rec.get("step_time_s")
        tps = self.global_batch * self.data.tokens_per_sample / dt if dt and self.data.tokens_per_sample else None
        sps = self.global_batch / dt if dt else None
        parts = [where, f"({units.percent(self.progress(state))})", f"loss {units.number(rec.get('loss'), 3)}"]
        if "val_loss" in rec:
            parts.append(f"val_loss {units.number(rec['val_loss'], 3)}")
        parts.append(f"{units.rate(tps)} tokens/s" if tps is not None else f"{units.rate(sps)} samples/s")
        parts += [f"step {units.step(dt)}", f"ETA {units.duration_s(max(0.0, eta)) if eta is not None else '-'}"]
        return " ".join(parts)

    def say(self, msg: str, *args: Any) -> None:
        """A line for the console (rank 0's stdout) and train.log, marked `train: ` there (what `pretrain-planner
        train` follows while its job runs: cli/train.py)."""
        line = f"{CONSOLE_MARK}{msg % args if args else msg}"
        self.logger.info(line)
        if self.rank0:
            print(line, flush=True)

    def on_resume(self, loop: Loop) -> None:
        """The checkpoint's budget against this run's: a larger one extends the run, its schedule recomputed over
        the new budget from the step the run stands at (the learning rate then continues from its new value, not
        from the old schedule's); a smaller one (or the same) ends the run where it is."""
        state = loop.state
        old = state.get("budget") or self.budget
        state["budget"] = self.budget
        state["stop"] = None  # the budget decides again (the checkpoint of a finished run holds why it stopped)
        self.say("resumed at step %d of %s", state["step"], loop.run_dir)
        if _budget_text(old) == _budget_text(self.budget):  # the same budget, however it was given
            return
        if self.stop(state) is not None:
            self.say("the checkpoint is at step %d, at or past this run's budget (%s): nothing left to train; a "
                     "larger --steps or --time-budget-h extends the run", state["step"],
                     _budget_text(self.budget))  # fmt: skip
            return
        self.say("budget %s (was %s): the run is extended; the %s schedule is recomputed over the new budget, the "
                 "learning rate of the next step %.3g (the old budget's: %.3g)", _budget_text(self.budget),
                 _budget_text(old), self.schedule.get("name", "constant"), self.lr(state),
                 self.lr(state, old))  # fmt: skip

    def on_start(self, loop: Loop) -> None:
        p = self.plan
        self.logger.info(
            "start: plan %s: model %s (%s) on %d rank(s) (%s, plan %dx%d %s), method %s, batch %d = %d x %d x %d, "
            "%s budget %s (%s), data: %s", self.plan_path, p["model"]["name"], p["model"]["family"], self.world,
            self.device, p["nodes"], p["gpus_per_node"], p["gpu"]["name"], p["method"], self.global_batch,
            self.micro_batch, self.accum, self.world, self.budget["mode"],
            self.budget.get("steps", self.budget.get("hours")), self.budget["source"], self.data_info["label"],
        )  # fmt: skip

    # -- the end -------------------------------------------------------------------------------------------
    def result(self, started: str, t0: float) -> dict[str, Any]:
        p, state, loop = self.plan, self.loop.state, self.loop
        steps = read_jsonl(loop.steps_path)
        loss_first, loss_last = loss_ends([s["loss"] for s in steps])
        tokens = self.data.tokens_per_sample
        settings = {**self.built.settings, "observed": loop.observed}
        planned = p.get("method_settings")
        diffs = differences(planned, settings) if planned else None
        thr = record.sustained(steps, self.global_batch, tokens, p["measured"])
        if self.o.fake_step_s is not None:
            thr["note"] = "a fake clock (testing): every step counted fake_step_s"
        costs = loop.restart_costs(steps)  # starts, startup, checkpoint
        return {
            "status": "ok", "model": p["model"]["name"], "family": p["model"]["family"], "task": self.task,
            "gpu": p["gpu"]["name"], "nodes": p["nodes"], "gpus_per_node": p["gpus_per_node"],
            "world_size": self.world, "plan_world_size": self.plan_world, "method": p["method"],
            "plan": str(self.plan_path), "device": str(self.device), "launched_by": self.ranks.launched_by,
            "precision": self.recipe["precision"], "micro_batch": self.micro_batch, "grad_accum_steps": self.accum,
            "global_batch": self.global_batch, "budget": self.budget, "steps": state["step"],
            "elapsed_s": state["elapsed_s"], "stop_reason": state["stop"],
            "starts_at_step": [s["step"] for s in costs["starts"]], **costs,
            "optimizer": self.recipe["optimizer"], "schedule": self.recipe.get("schedule"),
            "grad_clip": self.recipe.get("grad_clip"), "data": self.data_info,
            "method_settings_plan": planned, "method_settings": settings, "settings_differences": diffs,
            "throughput": thr, "loss_first": loss_first,
            "loss_last": loss_last, **self.validation_record(steps), "metrics": self.metrics_record(),
            "notes": self.notes,
            "run_dir": str(loop.run_dir), "versions": versions(TRAIN_PACKAGES), "hostname": socket.gethostname(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "started_at": started,
            "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "wall_time_s": time.time() - t0,
        }  # fmt: skip

    def validation_record(self, steps: list[dict[str, Any]]) -> dict[str, Any]:
        """result.json's `val_loss` (the last validation's) and `validation` (how and every point)."""
        points = [{"step": s["step"], "val_loss": s["val_loss"]} for s in steps if "val_loss" in s]
        held = self.data_info.get("validation_blocks", self.data_info.get("validation_images"))
        how = {"every": self.t.eval_every, "batches": self.t.eval_batches, "micro_batch": self.micro_batch,
               "held_out": held, "points": points, "seconds": self.loop.state.get("val_s", 0.0),
               "on": "every rank evaluates the same held-out micro-batches (the figure does not depend on the "
                     "number of ranks)"}  # fmt: skip
        if self.data.validation is None:
            how["note"] = "no held-out data (a single sample): no validation loss"
        return {"val_loss": points[-1]["val_loss"] if points else None, "validation": how}

    def metrics_record(self) -> dict[str, Any]:
        return self.metrics.record() if self.metrics is not None else {}


def _budget_text(b: dict[str, Any]) -> str:
    return f"{b['steps']} steps" if b["mode"] == "steps" else f"{units.duration_s(b['hours'] * 3600)} of training time"


def train_plan(plan: str | Path, **kwargs: Any) -> dict[str, Any]:
    """See `_train_plan`; one torch job at a time per process (an in-process debug run; torch_job)."""
    with torch_job():
        return _train_plan(plan, **kwargs)


def _train_plan(
    plan: str | Path,
    out: str | Path | None = None,
    *,
    steps: int | None = None,
    time_budget_h: float | None = None,
    data: str | None = None,
    tokenizer: str | None = None,
    data_dtype: str | None = None,
    data_field: str | None = None,
    device: str = DEFAULTS.device,
    threads: int | None = None,
    seed: int = 0,
    warmup_steps: int = 2,
    log_every: int = 10,
    eval_every: int = DEFAULTS.eval_every,
    eval_batches: int = DEFAULTS.eval_batches,
    checkpoint_every_min: float = DEFAULTS.checkpoint_every_min,
    checkpoint_every_steps: int | None = None,
    fake_step_s: float | None = None,
    kill_at_step: int | None = None,
    kill_signal: int = signal.SIGKILL,
) -> dict[str, Any]:
    """Run the plan on this rank (torchrun's, submitit's or a single process); rank 0 writes result.json and
    throughput.{md,csv} in `out` (default: results/train/{model}/{gpu}/{N}x{G} under the working directory) and
    returns the result. `kill_at_step` (testing): rank 0 sends `kill_signal` to itself after that step."""
    clock = startup.Clock(own=startup.own_process(("pretrain_planner.train",)), fallback="train_plan")
    import transformers

    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t0, started = time.time(), dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    rec, plan_path = load_plan(plan)
    # canonical paths: a run started with relative paths and resumed with absolute ones (or from another working
    # directory's launcher) is the same run with the same data
    out_dir = Path(canonical(str(out)) if out is not None else layout.train_dir_of_plan(rec, "results").resolve())
    out_dir.mkdir(parents=True, exist_ok=True)
    train = TrainSection(
        steps=steps,
        time_budget_hours=time_budget_h,
        data=canonical(data),
        data_dtype=data_dtype,
        data_field=data_field,
        tokenizer=canonical_tokenizer(tokenizer),
        checkpoint_every_min=checkpoint_every_min,
        eval_every=eval_every,
        eval_batches=eval_batches,
        device=device,
    )  # the job's JSON arguments, typed once
    o = RunOptions(
        train=train,
        threads=threads,
        seed=seed,
        warmup_steps=warmup_steps,
        log_every=log_every,
        checkpoint_every_steps=checkpoint_every_steps,
        fake_step_s=fake_step_s,
    )
    run = _Train(rec, plan_path.resolve(), out_dir, o, clock)
    try:
        try:
            run.prepare()
            run.build()
            run.loop.resume_or_start()
        except RunRefused as exc:  # every rank reads the checkpoint and refuses alike
            run.logger.info("refused: %s", exc)
            return {"status": "refused", "reason": str(exc), "rank": run.ranks.rank}
        run.elapsed_at_start = run.loop.state["elapsed_s"]
        run.metrics = Metrics(run.loop.run_dir, run.loop.state["step"], run.say) if run.rank0 else None
        run.note_start()
        try:
            run.loop.run(kill_at_step, kill_signal)
        finally:
            if run.metrics is not None:
                run.metrics.close()
        run.logger.info("stopped (%s) at step %d, %.1f s of training time", run.loop.state["stop"],
                        run.loop.state["step"], run.loop.state["elapsed_s"])  # fmt: skip
        run.loop.checkpoint()
        if not run.rank0:
            return {"rank": run.ranks.rank}
        result = run.result(started, t0)
        atomic_write_text(out_dir / layout.RESULT, json.dumps(result, indent=1, default=str))
        record.write_tables(out_dir, result)
        return result
    finally:
        run.ranks.close()
