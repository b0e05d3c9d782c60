"""One GLUE fine-tuning run (one setting, one seed) as the reference's run_glue.py trains it.

IntelLabs/academic-budget-bert README (fine-tuning): AdamW, weight decay 0.01, `--warmup_steps 50` then
`--lr_scheduler_type polynomial` (transformers' polynomial decay, power 1, to 1e-7 at the last step),
`--max_grad_norm 1.0`, `--evaluation_strategy steps --eval_steps 50`, max length 128; run_glue.py adds
`early_stopping_patience` on the task's metric (F1 for MRPC, Matthews for CoLA, ...). Here: evaluation on the
first dev file every `glue.eval_steps` optimizer steps and after the last step. What the run reports and keeps is
`glue.select`: `final` (default) - the model after the last step, as the reference's command reports it
(`trainer.evaluate()` after `trainer.train()`, no `load_best_model_at_end`); `best_dev` - the best evaluated
checkpoint (its weights restored at the end), chosen on the same dev set it is reported on, so its score is biased
upward; only with it may `glue.patience` stop a run after that many evaluations without improvement (run_glue.py's
EarlyStoppingCallback, which needs load_best_model_at_end).

Its steps are the one training loop's (trainer/loop.py `Loop.step`, with this run's `Hooks`): the learning rate set
on every parameter group (methodbuild.Built), dropout reseeded per step, the micro-batch's forward and backward,
the gradient clipping, the optimizer step and the zeroed gradients (trainer/step.py TrainStep), the loss; its AdamW
is the trainer's (parallel.make_optimizer: no weight decay on 1-d parameters, i.e. biases and LayerNorm weights, as
transformers' Trainer leaves them out) and its schedule a catalog schedule (trainer/schedule.recipe_lr). What it does
not take of the loop, and why: docs/architecture.md ("Decisions, and why": GLUE fine-tuning).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch

from pretrain_planner.budget import glue_metrics
from pretrain_planner.planning.configtypes import BudgetGlue, require
from pretrain_planner.trainer.loop import Hooks, Loop
from pretrain_planner.trainer.methodbuild import Built
from pretrain_planner.trainer.parallel import Applied, make_optimizer
from pretrain_planner.trainer.rank import RankEnv
from pretrain_planner.trainer.ranks import Ranks
from pretrain_planner.trainer.schedule import recipe_lr
from pretrain_planner.trainer.step import TrainStep

# AdamW's moments and epsilon: run_glue.py's (transformers' TrainingArguments defaults adam_beta1, adam_beta2,
# adam_epsilon), the glue section sets only the learning rate and the weight decay
BETAS, EPS = (0.9, 0.999), 1e-8
PATIENCE = "patience"  # the loop's stop reason when glue.patience evaluations in a row did not improve


def build_optimizer(model, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW as transformers' Trainer builds it, through the trainer's one construction (parallel.make_optimizer):
    no weight decay on biases and LayerNorm weights (the model's 1-d parameters)."""
    opt, _ = make_optimizer("AdamW", model.parameters(), lr, BETAS, EPS, weight_decay, no_decay_1d=True)
    return opt


def schedule(warmup_steps: int, total: int) -> dict[str, Any]:
    """The reference's schedule as a catalog schedule of trainer/schedule.recipe_lr over `total` steps: linear
    warm-up over `warmup_steps` (at most total - 1), then linear decay to 0 at the last step. transformers'
    polynomial decay (power 1) that run_glue.py uses ends at lr_end 1e-7 instead: the two differ by at most 1e-7."""
    return {"name": "linear", "warmup_steps": min(warmup_steps, max(0, total - 1))}


def lr_at(sched: dict[str, Any], peak_lr: float, step: int, total: int) -> float:
    """The learning rate of optimizer step `step` (0-based) of `total`."""
    return recipe_lr(sched, peak_lr, step, step / total, total)


def predict(model, encode, x: list, regression: bool, batch: int) -> np.ndarray:
    was_training = model.training
    model.eval()
    preds = []
    with torch.no_grad():
        for s in range(0, len(x), batch):
            logits = model(**encode(x[s : s + batch])).logits.float().cpu()
            preds.append(logits[:, 0] if regression else logits.argmax(-1))
    model.train(was_training)
    return torch.cat(preds).numpy() if preds else np.array([])


def evaluate(model, encode, devs: dict[str, tuple[list, list]], task, batch: int) -> dict[str, Any]:
    """The task's metrics on each dev file (the second, MNLI's mismatched, with suffix _mm) and its row count."""
    out: dict[str, Any] = {}
    for i, (x, y) in enumerate(devs.values()):
        p = predict(model, encode, x, task.labels is None, batch)
        suffix = "" if i == 0 else "_mm"
        out.update({f"{k}{suffix}": v for k, v in glue_metrics.task_metrics(task.metrics, y, p).items()})
        out[f"dev_rows{suffix}"] = len(x)
    return out


class _Run(Hooks):
    """One fine-tuning run's hooks on the shared loop: each step one batch of rows of the epoch's shuffle (a new
    shuffle when an epoch's rows are used up, the last batch of an epoch maybe smaller), the schedule's learning
    rate, the stop after `total` steps; after a step its loss, and every `glue.eval_steps` steps an evaluation on
    the dev files (`check`), which stops the run when glue.patience ran out."""

    def __init__(self, model, encode, train_x: list, train_y: list, devs, task, g: BudgetGlue, *, lr: float,
                 batch: int, seed: int, total: int, device, log) -> None:  # fmt: skip
        self.model, self.encode, self.x, self.devs, self.task = model, encode, train_x, devs, task
        self.y = torch.tensor(train_y, dtype=torch.float32 if task.labels is None else torch.long)
        self.peak, self.batch, self.total, self.device, self.log = lr, batch, total, device, log
        self.sched = schedule(g.warmup_steps, total)
        self.every, self.patience, self.select = g.eval_steps, g.patience, g.select
        self.key = glue_metrics.monitor(task.name)
        self.gen = torch.Generator().manual_seed(seed)
        self.chunks: Any = iter(())
        self.best: dict[str, Any] | None = None
        self.last: dict[str, Any] = {}
        self.best_state: dict[str, torch.Tensor] | None = None
        self.history: list[dict[str, Any]] = []
        self.losses: list[float] = []
        self.bad = 0

    def batch_at(self, index: int) -> dict[str, torch.Tensor]:
        chunk = next(self.chunks, None)
        if chunk is None:  # a new epoch
            self.chunks = iter(torch.randperm(len(self.x), generator=self.gen).split(self.batch))
            chunk = next(self.chunks)
        return {**self.encode([self.x[i] for i in chunk.tolist()]), "labels": self.y[chunk].to(self.device)}

    def lr(self, state: dict[str, Any]) -> float:
        return lr_at(self.sched, self.peak, state["step"], self.total)

    def stop(self, state: dict[str, Any]) -> str | None:
        return "steps" if state["step"] >= self.total else None

    def after_step(self, loop: Loop) -> None:
        self.losses.append(loop.last["loss"])
        step = loop.state["step"]
        if step % self.every == 0 and step < self.total and self.check(step):
            loop.state["stop"] = PATIENCE

    def check(self, step: int) -> bool:
        """Evaluate at `step`; keep the checkpoint when it is the best (best_dev); True when patience ran out."""
        m = evaluate(self.model, self.encode, self.devs, self.task, self.batch)
        key = self.key
        self.history.append({"step": step, key: m[key]})
        self.last = {"step": step, **m}
        if self.best is None or glue_metrics.better(m[key], self.best[key]):
            self.best, self.bad = self.last, 0
            if self.select == "best_dev":
                self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        else:
            self.bad += 1
        self.log.info("%s lr %g batch %d step %d/%d: %s %.4f (best %.4f at step %d)", self.task.name, self.peak,
                      self.batch, step, self.total, key, m[key], self.best[key], self.best["step"])  # fmt: skip
        return bool(self.patience) and self.bad >= self.patience


def train_run(
    model, encode, train_x: list, train_y: list, devs: dict[str, tuple[list, list]], task, g: BudgetGlue, *,
    lr: float, batch: int, epochs: float, seed: int, device, logger=None,
) -> dict[str, Any]:  # fmt: skip
    """Fine-tune `model` in place on the shared loop; at the end it holds the model `g.select` names (the final
    one, or the best evaluated checkpoint). Returns the run's record: its setting, steps run, the evaluations (step
    and monitored score), the selected step and the metrics there, and the best evaluation's step and score."""
    require(g, BudgetGlue, "budget.glue_train.train_run")
    select = g.select
    if g.patience and select != "best_dev":
        raise ValueError("glue.patience needs glue.select: best_dev (early stopping keeps the best checkpoint)")
    total = max(1, math.ceil(math.ceil(len(train_x) / batch) * epochs))
    log = logger or logging.getLogger(__name__)
    run = _Run(model, encode, train_x, train_y, devs, task, g, lr=lr, batch=batch, seed=seed, total=total,
               device=device, log=log)  # fmt: skip
    step = TrainStep(Applied(model, model), build_optimizer(model, lr, g.weight_decay), g.max_grad_norm or None,
                     device.type, settings={})  # fmt: skip
    loop = Loop(built=Built(step, model, {}), ranks=Ranks.of(RankEnv(0, 1, 0, device)), hooks=run, run_dir=None,
                fingerprint="", accum=1, seed=seed, logger=log, log_every=run.every)  # fmt: skip
    log.info("%s lr %g batch %d epochs %g seed %d: %d steps", task.name, lr, batch, epochs, seed, total)
    model.train()
    # Loop.run's steps without its checkpoints and signal handling (docs/architecture.md: GLUE fine-tuning)
    while loop.state["stop"] is None:
        loop.state["stop"] = run.stop(loop.state)
        if loop.state["stop"] is None:
            loop.step([])
            run.after_step(loop)
    stopped = loop.state["stop"] == PATIENCE
    if not stopped:
        run.check(loop.state["step"])  # after the last step
    best, key = run.best, run.key
    chosen = best if select == "best_dev" else run.last
    if select == "best_dev":
        model.load_state_dict(run.best_state)
    return {"lr": lr, "batch": batch, "epochs": epochs, "seed": seed, "steps": loop.state["step"],
            "total_steps": total, "stopped_early": stopped, "select": select, "selected_step": chosen["step"],
            "best_step": best["step"], f"best_dev_{key}": best[key], "evaluations": run.history,
            "train_loss_first": run.losses[0], "train_loss_last": run.losses[-1],
            **{k: v for k, v in chosen.items() if k != "step"}}  # fmt: skip
