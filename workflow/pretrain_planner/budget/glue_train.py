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
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pretrain_planner.budget import glue_metrics


def build_optimizer(model, lr: float, weight_decay: float):
    """AdamW as transformers' Trainer builds it: no weight decay on biases and LayerNorm weights."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "LayerNorm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "LayerNorm" not in n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )


def build_schedule(opt, warmup_steps: int, total: int):
    """The reference's schedule: linear warm-up over `warmup_steps`, then polynomial (power 1) decay to 1e-7."""
    import transformers as tf

    warm = min(warmup_steps, max(0, total - 1))
    end = min(1e-7, opt.defaults["lr"] / 2)  # transformers wants lr > lr_end
    return tf.get_polynomial_decay_schedule_with_warmup(opt, warm, total, lr_end=end, power=1.0)


def predict(model, encode, x: list, regression: bool, batch: int) -> np.ndarray:
    import torch

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


def train_run(
    model, encode, train_x: list, train_y: list, devs: dict[str, tuple[list, list]], task, g: dict[str, Any], *,
    lr: float, batch: int, epochs: float, seed: int, device, logger=None,
) -> dict[str, Any]:  # fmt: skip
    """Fine-tune `model` in place; at the end it holds the model `g["select"]` names (the final one, or the best
    evaluated checkpoint). Returns the run's record: its setting, steps run, the evaluations (step and monitored
    score), the selected step and the metrics there, and the best evaluation's step and score."""
    import torch

    key, select = glue_metrics.monitor(task.name), g["select"]
    if g["patience"] and select != "best_dev":
        raise ValueError("glue.patience needs glue.select: best_dev (early stopping keeps the best checkpoint)")
    total = max(1, math.ceil(math.ceil(len(train_x) / batch) * epochs))
    opt = build_optimizer(model, lr, g["weight_decay"])
    sched = build_schedule(opt, g["warmup_steps"], total)
    gen = torch.Generator().manual_seed(seed)
    y_all = torch.tensor(train_y, dtype=torch.float32 if task.labels is None else torch.long)
    every, patience, clip = g["eval_steps"], g["patience"], g["max_grad_norm"]
    best: dict[str, Any] | None = None
    last: dict[str, Any] = {}
    best_state = None
    history, losses, bad, step, stopped = [], [], 0, 0, False

    def check() -> bool:
        """Evaluate at `step`; keep the checkpoint when it is the best (best_dev); True when patience ran out."""
        nonlocal best, best_state, bad, last
        m = evaluate(model, encode, devs, task, batch)
        history.append({"step": step, key: m[key]})
        last = {"step": step, **m}
        if best is None or glue_metrics.better(m[key], best[key]):
            best, bad = last, 0
            if select == "best_dev":
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        else:
            bad += 1
        if logger:
            logger.info("%s lr %g batch %d epochs %g seed %d step %d/%d: %s %.4f (best %.4f at step %d)", task.name,
                        lr, batch, epochs, seed, step, total, key, m[key], best[key], best["step"])  # fmt: skip
        return bool(patience) and bad >= patience

    model.train()
    while step < total and not stopped:
        for chunk in torch.randperm(len(train_x), generator=gen).split(batch):
            if step >= total:
                break
            out = model(**encode([train_x[i] for i in chunk.tolist()]), labels=y_all[chunk].to(device))
            out.loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(out.loss.item())
            step += 1
            if step % every == 0 and step < total and check():
                stopped = True
                break
    if not stopped:
        check()  # after the last step
    chosen = best if select == "best_dev" else last
    if select == "best_dev":
        model.load_state_dict(best_state)
    return {"lr": lr, "batch": batch, "epochs": epochs, "seed": seed, "steps": step, "total_steps": total,
            "stopped_early": stopped, "select": select, "selected_step": chosen["step"], "best_step": best["step"],
            f"best_dev_{key}": best[key], "evaluations": history, "train_loss_first": losses[0],
            "train_loss_last": losses[-1], **{k: v for k, v in chosen.items() if k != "step"}}  # fmt: skip
