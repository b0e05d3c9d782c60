"""Time-budgeted masked-LM pre-training (Izsak et al. 2021) with checkpoint/resume.

Progress is elapsed time / budget on `train.clock`: `wall` (default, the reference's) counts wall time from the
start of the run - model building, data loading, validation, checkpoint and model writes included; `train` counts
the optimizer steps and validations only. Both survive a restart (they are part of the checkpoint; the wall time
between the last checkpoint and a kill is lost, as in the reference, which saves its clock with the checkpoint) and
both are in the result. The learning rate, validation points, early stop and fine-tuning checkpoints all key on
progress. The run also stops, with the reason in the result's stop_reason, on a NaN or infinite step loss, a NaN
validation loss, and under fp16 on a loss scale stuck at its floor (the reference's scale_cnt_limit).

`run_dir` keeps what must outlive a killed job (checkpoint.pt, steps.jsonl, validation.jsonl, the
fine-tuning checkpoints finetune-0.50/ ...); it is not a Snakemake output, so a failed job does not
delete it and the rerun resumes. A run that gets SIGTERM or SIGUSR1 (SLURM pre-emption / time limit), or
submitit's USR2, writes a checkpoint after the current step and exits non-zero (USR2: submitit requeues it).

The steps, accumulation, checkpoint/resume, signal handling and step log are the shared loop's
(trainer/loop.py, also the train stage's); this module is its hooks. Data-parallel over the setting's ranks
(trainer.ranks.Ranks: gloo on CPU, NCCL on GPUs) with the benchmark's method applied by the trainer's code
(trainer/methodbuild.py on the budget's run, `run_spec`: DDP, FSDP2, DeepSpeed ZeRO, offload, fl and its extras):
every rank walks the
same sample stream and trains on its own slice of each micro-batch, so rank 0's checkpoint (weights, optimizer,
sampler position, elapsed time; FSDP2 as full state dicts, ZeRO naming the engine's sharded checkpoint) resumes
them all. After each step the ranks take the largest elapsed time and any
rank's stop signal, so schedule, validation points and the stop agree. Dropout is reseeded per (rank, step),
so a resumed run draws what the uninterrupted one drew.

For tests, `train.fake_step_s` makes every step count a fixed time (a deterministic clock; the wall clock then
counts the steps at that time and everything else at its real time) and `train.max_steps` caps the steps.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from pretrain_planner import layout
from pretrain_planner.budget.config import checked, set_torch_threads
from pretrain_planner.budget.summary import plot_loss, reference_comparison, write_summary
from pretrain_planner.launch.local import torch_job
from pretrain_planner.planning.catalog import ModelSpec, Optimizer, Recipe
from pretrain_planner.planning.configtypes import BudgetModel, BudgetRecipe, BudgetTokenizer, BudgetTrain, require
from pretrain_planner.planning.families import family
from pretrain_planner.planning.runspec import RunSpec, TrainSetting, device_gpu
from pretrain_planner.results import atomic_write_text
from pretrain_planner.runlog import fingerprint
from pretrain_planner.train.run import Training
from pretrain_planner.trainer import schedule, startup
from pretrain_planner.trainer.data.shards import validation_loss, validation_shards
from pretrain_planner.trainer.loop import Loop
from pretrain_planner.trainer.models import build_model
from pretrain_planner.trainer.steplog import append_jsonl, loss_ends, read_jsonl
from pretrain_planner.trainer.tasks import masked_lm_shards


def model_dict(m: BudgetModel, tok: BudgetTokenizer, index: dict[str, Any]) -> dict[str, Any]:
    """The config's model with the tokenizer's vocabulary and special ids (a dict like ModelSpec.to_dict())."""
    require(m, BudgetModel, "budget.pretrain.model_dict")
    require(tok, BudgetTokenizer, "budget.pretrain.model_dict")
    sp = index["special_ids"]
    arch = dict(m.arch)
    # the reference pads the vocabulary to a multiple of 8 (30522 -> 30528; base.py _init_vocab_size)
    multiple = tok.pad_vocab_to_multiple_of
    vocab = -(-index["vocab_size"] // multiple) * multiple
    arch.update(vocab_size=vocab, pad_token_id=sp["pad"], bos_token_id=sp["cls"], eos_token_id=sp["sep"])
    # the positions the family skips (RoBERTa numbers them from pad_token_id + 1: families.py)
    need = index["seq_len"] + family(m.family, "model.family").position_offset(sp["pad"])
    arch["max_position_embeddings"] = max(arch.get("max_position_embeddings", 0), need)
    arch.setdefault("type_vocab_size", 1)
    return {"name": m.name, "family": m.family, "task": "masked_lm", "arch": arch}


def run_spec(tr: BudgetTrain, setting: TrainSetting, mdict: dict[str, Any], index: dict[str, Any], gb: int,
             device: torch.device) -> RunSpec:  # fmt: skip
    """The budget's run of the setting's method: the recipe of the budget file (AdamW without weight decay on
    biases and norms; train.precision, train.lr ...) on the prepared data's sequence length; TF32 and
    torch.compile (automatic dynamic shapes: sparse prediction's masked rows vary) on CUDA only (on CPU the compile
    time would eat the budget of the small runs this stage is tested with)."""
    require(tr, BudgetTrain, "budget.pretrain.run_spec")
    on_cuda = device.type == "cuda"
    opt = Optimizer("adamw", tr.lr, tuple(tr.betas), tr.eps, tr.weight_decay, no_decay_1d=True)
    recipe = Recipe(global_batch=gb, steps=None, time_budget_hours=tr.budget_hours, sequence_length=index["seq_len"],
                    image_size=None, precision=tr.precision, optimizer=opt, schedule={},
                    grad_clip=tr.grad_clip or None, mlm_probability=index["mlm_probability"])  # fmt: skip
    model = ModelSpec(mdict["name"], mdict["family"], dict(mdict["arch"]), recipe)
    gpu = device_gpu(tr.gpu, on_cuda)
    return RunSpec(model, gpu, setting.method, setting.world_size, on_cuda, compile_dynamic=None,
                   compile_model=on_cuda)  # fmt: skip


def _device(tr: BudgetTrain, local_rank: int = 0) -> torch.device:
    """CUDA when train.device says so, or when it is auto, train.gpu is a GPU type and CUDA is there."""
    if tr.wants_gpu() and torch.cuda.is_available():
        from pretrain_planner.trainer.rank import device_index  # the trainer's one device rule

        return torch.device("cuda", device_index(local_rank, torch.cuda.device_count()))
    return torch.device("cpu")


def save_model(
    model: torch.nn.Module, out_dir: Path, tokenizer: Path, info: dict[str, Any], state: dict[str, Any] | None = None
) -> None:
    """A transformers model folder (config.json + weights) with tokenizer.json and what produced it. `state`:
    the full weights of a sharded model (then `model` is a fresh unsharded one of the same class)."""
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if state is not None:
        model.load_state_dict(state)
    model.save_pretrained(tmp)
    shutil.copyfile(tokenizer, tmp / "tokenizer.json")
    (tmp / "budget.json").write_text(json.dumps(info, indent=1))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)


def pretrain(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """See `_pretrain`; one torch job at a time per process (torch_job)."""
    with torch_job():
        return _pretrain(*args, **kwargs)


def _pretrain(
    cfg: dict[str, Any],
    index_path: str | Path,
    out_model: str | Path,
    out_result: str | Path,
    run_dir: str | Path,
    log: str | Path | None = None,
    *,
    threads: int | None = None,
    kill_at_step: int | None = None,
    kill_signal: int = signal.SIGKILL,
) -> dict[str, Any]:
    """Pre-train within the time budget (resuming from run_dir/checkpoint.pt when present); write the final
    model folder and a result JSON. `kill_at_step` (testing) sends `kill_signal` to this process after that
    step: SIGKILL is a crash; SIGTERM/SIGUSR1 (pre-emption) end the run with a checkpoint and SystemExit."""
    t_start = time.perf_counter()  # the wall clock starts here: building, loading, validation, writes all count
    clock = startup.Clock(own=startup.own_process(), fallback="pretrain")  # the start-up phases' (trainer/startup.py)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    recipe = BudgetRecipe.of(cfg)  # the job's JSON, typed once
    run = _Run(recipe, Path(index_path), Path(run_dir), log, threads, t_start, clock)
    run.build()
    run.resume_or_start()
    run.note_start()
    run.loop.run(kill_at_step, kill_signal)
    return run.finish(Path(out_model), out_result)


def _run_fingerprint(recipe: BudgetRecipe, setting: TrainSetting, index: dict[str, Any], mdict: dict[str, Any]) -> str:
    """What a checkpoint must match to be resumed: data, seed, model, the training settings that change the
    result and the setting actually used (not the logging, checkpoint cadence, device or thread settings). The
    train section as JSON with sorted keys (runlog.fingerprint), as the file has it: the fingerprint of
    checkpoints written before stays."""
    keyed = {k: v for k, v in asdict(recipe.train).items() if k not in ("max_steps", "checkpoint_every_s",
                                                                         "log_every", "device", "threads",
                                                                         "setting", "micro_batch", "method",
                                                                         "plot")}  # fmt: skip
    used = {k: setting.to_json()[k] for k in ("micro_batch", "grad_accum_steps", "world_size", "method")}
    return fingerprint(index["fingerprint"], recipe.prep.seed, mdict, keyed, used)


class _Run(Training):
    """One pre-training process: the general run (train/run.py Training: ranks, log, the masked-LM task's data,
    the method's build, the shared loop) with what the budget adds as its hooks: the time-based learning rate,
    the budget and max-steps stop, validation points with the early stop, fine-tuning checkpoints, the model
    folder and the result."""

    def __init__(
        self,
        recipe: BudgetRecipe,
        index_path: Path,
        run_dir: Path,
        log,
        threads: int | None,
        t_start: float,
        clock: startup.Clock | None = None,
    ) -> None:
        """Ranks (process group), log, index and the run's sizes and fingerprint."""
        self.t_start = t_start
        self.wall_base = 0.0  # wall time of the run before this process (a resumed run's, from the checkpoint)
        self.train_base = 0.0  # training time likewise
        self.real_step_s = 0.0  # under the fake clock: the real time of this process's steps (replaced by fake)
        self.stopped_s: float | None = None  # the clock when the loop stopped (finish)
        self._step_t0: float | None = None
        require(recipe, BudgetRecipe, "budget.pretrain._Run")
        self.recipe, self.setting, self.seed = recipe, checked(recipe.setting), recipe.prep.seed
        self.tr = recipe.train
        tr, setting = self.tr, self.setting
        set_torch_threads(tr, threads)
        if setting.world_size > 1 and "SUBMITIT_EXECUTOR" not in os.environ:
            raise RuntimeError(f"{setting.world_size} ranks: run the pre-training through the local or slurm "
                               "launcher")  # fmt: skip
        super().__init__(setting.world_size, lambda local: _device(tr, local), setting.method, log, clock)
        self.data_dir, self.index_path = index_path.parent, index_path
        self.index = json.loads(index_path.read_text())
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.budget_s = schedule.budget_seconds(tr.budget_hours)
        self.clock_kind = tr.clock
        self.curve = {"curve": tr.curve, "decay_rate": tr.decay_rate, "decay_step_hours": tr.decay_step_hours}
        self.micro_batch, self.accum = setting.micro_batch, setting.grad_accum_steps
        self.global_batch = setting.global_batch
        self.pad_id = self.index["special_ids"]["pad"]
        self.mdict = model_dict(recipe.model, recipe.prep.tokenizer, self.index)
        self.fp = _run_fingerprint(recipe, setting, self.index, self.mdict)
        self.val_path = run_dir / layout.VALIDATION_LOG

    def build(self) -> None:
        """The benchmark's method through the trainer's one build path (trainer/methodbuild.py) on the budget's
        run (`run_spec`); the same weights on every rank. Then the shared loop with this run as hooks."""
        self.spec = run_spec(self.tr, self.setting, self.mdict, self.index, self.global_batch, self.device)
        self.build_method(
            self.spec, "train.method", self.seed, attn=self.tr.attn_implementation,
            grad_sync=self.setting.grad_sync, compile_note="the budget stage compiles on CUDA only",
            lr_schedule="set every step from elapsed training time (trainer.schedule.lr_at)",
        )  # fmt: skip
        self.model, self.method_settings = self.built.net, self.built.settings
        self.attn = self.method_settings["attn_implementation"]
        self.amp_dtype = self.built.autocast_dtype
        self.plain: list[torch.nn.Module] = []  # an unsharded model to save a sharded one's weights from
        tr = self.tr
        self.data = self.time_data(lambda: masked_lm_shards(self.index_path, self.seed, self.mdict, {}))
        self.val_points = schedule.validation_points(tr.validation)
        self.ft_points = sorted(tr.finetune_checkpoints)
        self.start_loop(
            self.run_dir, self.fp, self.seed, fake_step_s=tr.fake_step_s,
            checkpoint_every_s=tr.checkpoint_every_s, log_every=tr.log_every,
            extra_state={"val_s": 0.0, "last_val_loss": None, "wall_s": 0.0, "scale_floor_steps": 0, "val_count": 0},
        )  # fmt: skip

    @property
    def state(self) -> dict[str, Any]:
        return self.loop.state

    def resume_or_start(self) -> None:
        """From run_dir/checkpoint.pt when it is there (and belongs to this configuration), else fresh; the step
        and validation logs cut back to the checkpoint's step; the next validation and fine-tuning points."""
        self.loop.resume_or_start(extra_logs=(self.val_path,))
        self.wall_base, self.train_base = self.state["wall_s"], self.state["elapsed_s"]
        self._tick()
        progress = self._elapsed(self.state) / self.budget_s
        self.val_idx = schedule.next_after(self.val_points, progress)
        self.ft_idx = schedule.next_after(self.ft_points, progress)

    # -- the clocks -------------------------------------------------------------------------------------------
    def _wall_local(self) -> float:
        """This rank's wall time of the run: the earlier processes' (checkpoint) + this process's since it started.
        Under the fake clock the steps count their fake time instead of their real time."""
        wall = self.wall_base + time.perf_counter() - self.t_start
        if self.tr.fake_step_s is not None:
            wall += (self.state["elapsed_s"] - self.train_base) - self.real_step_s
        return wall

    def _tick(self) -> None:
        """state["wall_s"]: the wall time now, the slowest rank's (so that every rank decides the same)."""
        (self.state["wall_s"],) = self.ranks.max(self._wall_local())

    def _elapsed(self, state: dict[str, Any]) -> float:
        """The time that counts against the budget (train.clock)."""
        return state["wall_s"] if self.clock_kind == "wall" else state["elapsed_s"]

    # -- the loop's hooks ------------------------------------------------------------------------------------
    def lr(self, state: dict[str, Any]) -> float:
        self._step_t0 = time.perf_counter()  # the step starts (the fake clock's real-time bookkeeping)
        return schedule.lr_at(self._elapsed(state), self.budget_s, self.tr.lr, self.tr.warmup_fraction, self.curve)

    def stop(self, state: dict[str, Any]) -> str | None:
        """The budget (on train.clock) or train.max_steps ends the run before another step."""
        self._tick()
        if self._elapsed(state) / self.budget_s >= 1.0:
            return "budget"
        if self.tr.max_steps is not None and state["step"] >= self.tr.max_steps:
            return "max_steps"
        return None

    def step_fields(self, state: dict[str, Any]) -> dict[str, Any]:
        wall = self._wall_local()
        now = wall if self.clock_kind == "wall" else state["elapsed_s"]
        return {"progress": round(now / self.budget_s, 6), "wall_s": round(wall, 6)}

    def after_step(self, loop: Loop) -> None:
        """The loss checks (a NaN / infinite loss, fp16's loss scale at its floor); a validation point passed (its
        time counts as training time; the early stop); fine-tuning checkpoints."""
        if self._step_t0 is not None:
            self.real_step_s += time.perf_counter() - self._step_t0
            self._step_t0 = None
        state = self.state
        if self._loss_checks(loop):
            return
        self._tick()
        progress = self._elapsed(state) / self.budget_s
        if self.val_idx < len(self.val_points) and progress >= self.val_points[self.val_idx]:
            self._validate(progress)
        self._finetune_checkpoints(progress)

    def _loss_checks(self, loop: Loop) -> bool:
        """Set the stop reason on a NaN / infinite step loss, or (fp16) a loss scale at its floor for
        train.loss_scale_floor.steps steps in a row; True when the run stops."""
        state, tr = self.state, self.tr
        why = schedule.nonfinite_loss(loop.last["loss"], state["step"]) if tr.stop_on_nonfinite_loss else None
        if why is None and tr.precision == "fp16":
            floor = tr.loss_scale_floor
            scale = loop.step_fn.loss_scale()
            state["scale_floor_steps"], why = schedule.loss_scale_floor(
                scale, state["scale_floor_steps"], floor.scale, floor.steps
            )
        if why is None:
            return False
        state["stop"] = why
        self.logger.info("stopping: %s", why)
        return True

    def on_start(self, loop: Loop) -> None:
        """The log's first line of a fresh run: model, ranks, budget, batch and method."""
        mdict, model, world = self.mdict, self.model, self.world
        self.logger.info(
            "start: model %s (%s, %.1fM parameters, attention %s, %s) on %d x %s, budget %.1f s, "
            "batch %d = %d x %d x %d ranks, method %s (setting from %s)",
            mdict["name"], mdict["family"], sum(p.numel() for p in model.parameters()) / 1e6, self.attn,
            type(model).__name__, world, self.device, self.budget_s, self.global_batch, self.micro_batch, self.accum,
            world, self.setting.method.slug, self.setting.source,
        )  # fmt: skip

    # -- validation and fine-tuning checkpoints ---------------------------------------------------------------
    def _autocast(self):
        """Validation's autocast: the method's compute dtype (none under fp32 or when the method casts)."""
        return torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None)

    def _validation_loss(self) -> tuple[float, list[str]]:
        """The validation loss of the model now (at a validation point and at the end) and the held-out shards it
        was taken on: the next in the rotation (`train.validation.rotate`; the count is in the checkpoint, so a
        resumed run goes on with the next shard)."""
        val = self.tr.validation
        count = self.state.get("val_count", 0)
        shards = validation_shards(self.index["splits"]["validation"], count, val.rotate)
        self.state["val_count"] = count + 1
        loss = validation_loss(self.model, shards, self.data_dir, self.pad_id, self.micro_batch, val.max_samples,
                               self.device, self._autocast)  # fmt: skip
        return loss, [sh["name"] for sh in shards]

    def _validate(self, progress: float) -> None:
        """A validation point: the loss (its time counts as training time), validation.jsonl, the early stop."""
        state = self.state
        t0 = time.perf_counter()
        vl, shards = self._validation_loss()
        state["val_s"] += self.loop.add_time(t0)
        state["last_val_loss"] = vl
        self.val_idx = schedule.next_after(self.val_points, progress)
        if self.rank0:
            with self.val_path.open("a") as fh:
                append_jsonl(fh, {"step": state["step"], "progress": round(progress, 6), "val_loss": vl,
                                  "shards": shards})  # fmt: skip
        self.logger.info("validation at step %d progress %.4f: loss %.4f", state["step"], progress, vl)
        state["stop"] = schedule.early_stop(list(self.tr.early_stop), progress, vl, self._elapsed(state))
        if state["stop"]:
            self.logger.info(state["stop"])

    def _finetune_checkpoints(self, progress: float) -> None:
        """The model folders run_dir/finetune-<p> of every fine-tuning point that progress has passed."""
        while self.ft_idx < len(self.ft_points) and progress >= self.ft_points[self.ft_idx]:
            d = self.run_dir / f"finetune-{self.ft_points[self.ft_idx]:.2f}"
            self.save_full(d, {"step": self.state["step"], "progress": progress, "clock": self.clock_kind,
                               "sequences": self.state["step"] * self.global_batch})  # fmt: skip
            if self.rank0:
                self.logger.info("fine-tuning checkpoint %s at step %d", d, self.state["step"])
            self.ranks.barrier()
            self.ft_idx += 1

    def checkpoint(self) -> None:
        self.loop.checkpoint()

    # -- model folders and the end -------------------------------------------------------------------------
    def save_full(self, out_dir: Path, info: dict[str, Any]) -> None:
        """Every rank (gathering a sharded model's weights is a collective); rank 0 writes the model folder."""
        full = self.built.full_state()
        if self.rank0:
            if full is not None and not self.plain:  # an unsharded copy to save from
                self.plain.append(build_model(self.mdict, self.attn, fused_ce=self.spec.method.fused_ce)[0])
            model = self.model if full is None else self.plain[0]
            save_model(model, out_dir, self.data_dir / self.index["tokenizer"], info, full)

    # -- the end -----------------------------------------------------------------------------------------
    def finish(self, out_model: Path, out_result: str | Path) -> dict[str, Any]:
        """After the loop: a last validation when the last point was not reached, the last checkpoint, the model
        folder; rank 0 writes the result JSON. Closes the process group."""
        state = self.state
        self._tick()
        self.stopped_s = self._elapsed(state)  # the run's clock when it stopped: what the budget bounds
        self.logger.info("stopped (%s) at step %d, %.1f s of training time, %.1f s of wall time", state["stop"],
                         state["step"], state["elapsed_s"], state["wall_s"])  # fmt: skip
        if state["last_val_loss"] is None or self.val_idx < len(self.val_points):
            state["last_val_loss"], state["last_val_shards"] = self._validation_loss()
        self.checkpoint()
        info = {"model": self.mdict, "step": state["step"], "elapsed_s": state["elapsed_s"], "wall_s": state["wall_s"],
                "stop": state["stop"]}  # fmt: skip
        self.save_full(out_model, info)
        self._tick()
        if not self.rank0:
            self.ranks.close()
            return {"rank": self.ranks.rank}
        result = self._result(out_model)
        atomic_write_text(out_result, json.dumps(result, indent=1))
        write_summary(result, Path(out_result).parent)
        if self.tr.plot:
            try:
                plot_loss(
                    self.loop.steps_path, self.val_path, Path(out_result).parent / layout.LOSS_PLOT, self.clock_kind
                )
            except Exception as exc:  # noqa: BLE001 - a plot must not fail the run
                self.logger.info("loss plot not written: %s: %s", type(exc).__name__, exc)
        self.ranks.close()
        return result

    def _result(self, out_model: Path) -> dict[str, Any]:
        """The result JSON: steps, time, stop reason, the setting and method, throughput and losses."""
        state, tr, mdict, gb = self.state, self.tr, self.mdict, self.global_batch
        steps = read_jsonl(self.loop.steps_path)
        loss_first, loss_last = loss_ends([r["loss"] for r in steps])
        result = {
            "model": mdict["name"], "family": mdict["family"], "device": str(self.device), "precision": tr.precision,
            "steps": state["step"], "budget_s": self.budget_s, "clock": self.clock_kind,
            "elapsed_s": self._elapsed(state), "train_s": state["elapsed_s"], "wall_s": state["wall_s"],
            # the budget ends the run at the first check after it ran out (a check before every step): `stopped_s`;
            # what follows on the clock (the last validation, checkpoint and model write) is `finish_s`
            "stopped_s": self.stopped_s, "finish_s": self._elapsed(state) - self.stopped_s,
            "validation_s": state["val_s"], "stop_reason": state["stop"], "micro_batch": self.micro_batch,
            "checkpoint_every_s": tr.checkpoint_every_s, "checkpoints": state.get("checkpoints", 0),
            "checkpoint_s": state.get("checkpoint_s", 0.0), **self.loop.restart_costs(steps),
            "sequences": state["step"] * gb, "tokens": state["step"] * gb * self.index["seq_len"],
            "reference": reference_comparison(state["step"], state["step"] * gb, self.budget_s),
            "grad_accum_steps": self.accum, "world_size": self.world, "global_batch": gb,
            "setting": self.setting.to_json(),
            "method_settings": {**self.method_settings, "observed": self.loop.observed},
            "sparse_prediction": bool(mdict["arch"].get("sparse_prediction")),
            "model_class": type(self.model).__name__,
            "tokens_per_s": state["step"] * gb * self.index["seq_len"] / max(state["elapsed_s"], 1e-9),
            "vocab_size": mdict["arch"]["vocab_size"], "tokenizer_vocab_size": self.index["vocab_size"],
            "loss_first": loss_first, "loss_last": loss_last,
            "val_loss": state["last_val_loss"],
            "validation": self._validation_history(),
            "recipe": self.recipe.named,
            "finetune_checkpoints": sorted(str(p) for p in self.run_dir.glob("finetune-*")),
            "run_dir": str(self.run_dir), "model_dir": str(out_model),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        }  # fmt: skip
        if gb != tr.global_batch:
            result["note"] = f"global batch {gb} (the benchmark's setting) instead of train.global_batch"
        return result

    def _validation_history(self) -> list[dict[str, Any]]:
        """Every validation point's loss with its time on train.clock (progress x budget), and the final one
        (taken at the end when the run stopped before its last point): the sweep's loss-against-time plot."""
        state = self.state
        hist = [{"step": v["step"], "elapsed_s": v["progress"] * self.budget_s, "val_loss": v["val_loss"],
                 "shards": v.get("shards")} for v in read_jsonl(self.val_path)]  # fmt: skip
        if not hist or hist[-1]["step"] != state["step"]:
            hist.append({"step": state["step"], "elapsed_s": self._elapsed(state), "val_loss": state["last_val_loss"],
                         "shards": state.get("last_val_shards")})  # fmt: skip
        return hist
