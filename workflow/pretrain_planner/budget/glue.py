"""GLUE fine-tuning from local files in the standard layout, the study's metrics, and the results table.

Protocol (Izsak et al. 2021 and later papers): MNLI is fine-tuned first from the pre-trained model;
RTE, STS-B and MRPC (config `glue.from_mnli`) start from the MNLI-fine-tuned model. Metrics: accuracy
(MNLI matched/mismatched, QNLI, RTE, SST-2, WNLI), accuracy and F1 (MRPC, QQP), Matthews correlation
(CoLA), Pearson and Spearman correlation (STS-B).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pretrain_planner.budget.config import TASK_DIRS, TORCH_LOCK, file_logger, set_torch_threads, wants_gpu
from pretrain_planner.results import atomic_write_text


@dataclass(frozen=True)
class Task:
    name: str
    text: tuple[str | int, ...]  # header names, or column numbers for header-less files (CoLA)
    label: str | int
    labels: tuple[str, ...] | None  # None: regression
    dev: tuple[str, ...]
    metrics: tuple[str, ...]
    header: bool = True


TASKS = {
    "cola": Task("cola", (3,), 1, ("0", "1"), ("dev",), ("mcc",), header=False),
    "sst2": Task("sst2", ("sentence",), "label", ("0", "1"), ("dev",), ("acc",)),
    "mrpc": Task("mrpc", ("#1 String", "#2 String"), "Quality", ("0", "1"), ("dev",), ("acc", "f1")),
    "qqp": Task("qqp", ("question1", "question2"), "is_duplicate", ("0", "1"), ("dev",), ("acc", "f1")),
    "stsb": Task("stsb", ("sentence1", "sentence2"), "score", None, ("dev",), ("pearson", "spearman")),
    "mnli": Task(
        "mnli",
        ("sentence1", "sentence2"),
        "gold_label",
        ("contradiction", "entailment", "neutral"),
        ("dev_matched", "dev_mismatched"),
        ("acc",),
    ),  # fmt: skip
    "qnli": Task("qnli", ("question", "sentence"), "label", ("entailment", "not_entailment"), ("dev",), ("acc",)),
    "rte": Task("rte", ("sentence1", "sentence2"), "label", ("entailment", "not_entailment"), ("dev",), ("acc",)),
    "wnli": Task("wnli", ("sentence1", "sentence2"), "label", ("0", "1"), ("dev",), ("acc",)),
}
# the one number per task the study reports first
PRIMARY = {"cola": "mcc", "mrpc": "f1", "qqp": "f1", "stsb": "pearson"}
TABLE_COLUMNS = ["task", "init", "train_rows", "dev_rows", "acc", "acc_mm", "f1", "mcc", "pearson", "spearman", "score"]


# ----------------------------------------------------------------------------------------------- metrics
def accuracy(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.mean(np.asarray(y) == np.asarray(p))) if len(y) else float("nan")


def f1_binary(y: np.ndarray, p: np.ndarray, positive: int = 1) -> float:
    y, p = np.asarray(y), np.asarray(p)
    tp = int(np.sum((p == positive) & (y == positive)))
    fp = int(np.sum((p == positive) & (y != positive)))
    fn = int(np.sum((p != positive) & (y == positive)))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews(y: np.ndarray, p: np.ndarray) -> float:
    y, p = np.asarray(y), np.asarray(p)
    tp = float(np.sum((p == 1) & (y == 1)))
    tn = float(np.sum((p == 0) & (y == 0)))
    fp = float(np.sum((p == 1) & (y == 0)))
    fn = float(np.sum((p == 0) & (y == 1)))
    den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / den if den else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    x, y = x - x.mean(), y - y.mean()
    den = math.sqrt(float((x * x).sum() * (y * y).sum()))
    return float((x * y).sum() / den) if den else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (as scipy.stats.rankdata)."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return sums[inv] / counts[inv]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(_ranks(x), _ranks(y))


def task_metrics(task: Task, y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    fns = {"acc": accuracy, "f1": f1_binary, "mcc": matthews, "pearson": pearson, "spearman": spearman}
    return {m: fns[m](y, p) for m in task.metrics}


# ----------------------------------------------------------------------------------------------- data
def read_tsv(path: str | Path, task: Task) -> tuple[list[tuple[str, ...]], list[Any]]:
    """(texts, labels) of one GLUE TSV file; rows without a usable label (e.g. MNLI '-') are skipped."""
    csv.field_size_limit(sys.maxsize)
    texts, labels = [], []
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        head = next(reader) if task.header else None
        col = {name: i for i, name in enumerate(head)} if head else {}

        def idx(key: str | int) -> int:
            if isinstance(key, int):
                return key
            if key not in col:
                raise ValueError(f"{path}: no column {key!r} (columns: {head})")
            return col[key]

        text_idx, label_idx = [idx(k) for k in task.text], idx(task.label)
        for row in reader:
            if len(row) <= max(*text_idx, label_idx):
                continue
            raw = row[label_idx].strip()
            if task.labels is None:
                try:
                    y: Any = float(raw)
                except ValueError:
                    continue
            elif raw in task.labels:
                y = task.labels.index(raw)
            else:
                continue
            texts.append(tuple(row[i] for i in text_idx))
            labels.append(y)
    return texts, labels


def task_dir(data_dir: str | Path, task: str) -> Path:
    d = Path(data_dir)
    for name in (TASK_DIRS[task], task, task.upper()):
        if (d / name).is_dir():
            return d / name
    raise FileNotFoundError(f"GLUE task {task}: no folder {TASK_DIRS[task]}/ in {d}")


# ----------------------------------------------------------------------------------------------- fine-tuning
def finetune(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Fine-tune `init_model` (a model folder with tokenizer.json) on one task; evaluate each dev file.

    Arguments as `_finetune`; one torch job at a time per process (TORCH_LOCK)."""
    with TORCH_LOCK:
        return _finetune(*args, **kwargs)


def _finetune(
    cfg: dict[str, Any],
    task_name: str,
    init_model: str | Path,
    out_metrics: str | Path,
    log: str | Path | None = None,
    *,
    out_model: str | Path | None = None,
    init_kind: str = "pretrained",
    threads: int | None = None,
) -> dict[str, Any]:
    """Fine-tune `init_model` (a model folder with tokenizer.json) on one task; evaluate each dev file."""
    import torch
    import transformers as tf

    tf.utils.logging.disable_progress_bar()
    logger = file_logger(f"glue.{task_name}", log)
    g, tr = cfg["glue"], cfg["train"]
    task = TASKS[task_name]
    set_torch_threads(tr, threads)
    torch.manual_seed(cfg["seed"])
    device = torch.device("cuda" if wants_gpu(tr) and torch.cuda.is_available() else "cpu")
    train_x, train_y, devs = _task_data(g, task)
    init_model = Path(init_model)
    encode = _encoder(init_model, g["max_len"], device)
    model = _classifier(init_model, task, device)
    total = max(1, math.ceil(math.ceil(len(train_x) / g["batch"]) * g["epochs"]))
    logger.info("%s from %s (%s): %d train rows, %d steps, device %s", task_name, init_model, init_kind,
                len(train_x), total, device)  # fmt: skip
    losses = _train(model, encode, train_x, train_y, task, g, total, cfg["seed"], device)
    logger.info("training loss first %.4f last %.4f", losses[0], losses[-1])
    result: dict[str, Any] = {"task": task_name, "init": init_kind, "init_model": str(init_model),
                              "train_rows": len(train_x), "steps": total, "train_loss_last": losses[-1]}  # fmt: skip
    result.update(_evaluate(model, encode, devs, task, g["batch"], logger))
    if out_model:
        out_model = Path(out_model)
        model.save_pretrained(out_model)
        (out_model / "tokenizer.json").write_bytes((init_model / "tokenizer.json").read_bytes())
    atomic_write_text(out_metrics, json.dumps(result, indent=1))
    return result


def _task_data(g: dict[str, Any], task: Task) -> tuple[list[tuple[str, ...]], list[Any], dict[str, tuple[list, list]]]:
    """The task's training rows (at most glue.max_train_samples) and its dev files' rows."""
    folder = task_dir(g["data_dir"], task.name)
    train_x, train_y = read_tsv(folder / "train.tsv", task)
    if g["max_train_samples"]:
        train_x, train_y = train_x[: g["max_train_samples"]], train_y[: g["max_train_samples"]]
    devs = {d: read_tsv(folder / f"{d}.tsv", task) for d in task.dev}
    if not train_x:
        raise ValueError(f"{folder}/train.tsv: no usable rows")
    return train_x, train_y, devs


def _encoder(init_model: Path, max_len: int, device):
    """rows of texts -> model inputs on `device`, with the model folder's tokenizer (truncated, padded)."""
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(init_model / "tokenizer.json"))
    pad = tok.token_to_id("[PAD]")
    tok.enable_truncation(max_len)
    tok.enable_padding(pad_id=pad, pad_token="[PAD]")

    def encode(rows: list[tuple[str, ...]]) -> dict[str, torch.Tensor]:
        enc = tok.encode_batch([r if len(r) > 1 else r[0] for r in rows])
        ids = torch.tensor([e.ids for e in enc])
        return {"input_ids": ids.to(device), "attention_mask": (ids != pad).long().to(device)}

    return encode


def _classifier(init_model: Path, task: Task, device):
    """The pre-trained model with a fresh head for the task's labels (one output for a regression)."""
    import transformers as tf

    labels = task.labels or ("score",)
    return tf.AutoModelForSequenceClassification.from_pretrained(
        init_model, num_labels=len(task.labels) if task.labels else 1, ignore_mismatched_sizes=True,
        problem_type="regression" if task.labels is None else "single_label_classification",
        id2label=dict(enumerate(labels)), label2id={v: i for i, v in enumerate(labels)},
    ).to(device)  # fmt: skip


def _train(model, encode, train_x, train_y, task: Task, g: dict[str, Any], total: int, seed: int, device) -> list:
    """`total` AdamW steps (linear warm-up and decay) over seeded shuffles of the training rows; the losses."""
    import torch

    batch = g["batch"]
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": g["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}], lr=g["lr"]
    )
    warm = min(g["warmup_steps"], total - 1) if total > 1 else 0
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / (warm + 1) if s < warm else max(0.0, (total - s) / max(1, total - warm))
    )
    gen = torch.Generator().manual_seed(seed)
    y_all = torch.tensor(train_y, dtype=torch.float32 if task.labels is None else torch.long)
    model.train()
    step, losses = 0, []
    while step < total:
        for chunk in torch.randperm(len(train_x), generator=gen).split(batch):
            if step >= total:
                break
            inputs = encode([train_x[i] for i in chunk.tolist()])
            out = model(**inputs, labels=y_all[chunk].to(device))
            out.loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(out.loss.item())
            step += 1
    return losses


def _evaluate(model, encode, devs: dict[str, tuple[list, list]], task: Task, batch: int, logger) -> dict[str, Any]:
    """The task's metrics on each dev file (the second, MNLI's mismatched, with suffix _mm) and its row count."""
    import torch

    model.eval()
    result: dict[str, Any] = {}
    with torch.no_grad():
        for i, (dev, (x, y)) in enumerate(devs.items()):
            preds = []
            for s in range(0, len(x), batch):
                logits = model(**encode(x[s : s + batch])).logits.float().cpu()
                preds.append(logits[:, 0] if task.labels is None else logits.argmax(-1))
            p = torch.cat(preds).numpy() if preds else np.array([])
            m = task_metrics(task, np.asarray(y), p)
            suffix = "" if i == 0 else "_mm"
            result.update({f"{k}{suffix}": v for k, v in m.items()})
            result[f"dev_rows{suffix}"] = len(x)
            logger.info("%s %s: %s", task.name, dev, json.dumps(m))
    return result


# ----------------------------------------------------------------------------------------------- table
def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{100 * v:.1f}" if isinstance(v, float) else str(v)


def glue_table(metric_files: list[str], out_csv: str | Path, out_md: str | Path, log: str | Path | None = None):
    """results: one row per task with its metrics (x100 in the markdown) and the study's headline score."""
    logger = file_logger("glue_table", log)
    rows = []
    for f in metric_files:
        r = json.loads(Path(f).read_text())
        task = r["task"]
        main = PRIMARY.get(task, "acc")
        row = {c: r.get(c) for c in TABLE_COLUMNS}
        row["dev_rows"] = r.get("dev_rows")
        row["score"] = r.get(main)
        rows.append(row)
    order = ["mnli", "qnli", "qqp", "rte", "sst2", "mrpc", "cola", "stsb", "wnli"]  # the study's order
    rows.sort(key=lambda r: order.index(r["task"]))
    scores = [r["score"] for r in rows if r["score"] is not None and not math.isnan(r["score"])]
    lines = [",".join(TABLE_COLUMNS)]
    for r in rows:
        lines.append(",".join("" if r[c] is None else str(r[c]) for c in TABLE_COLUMNS))
    atomic_write_text(out_csv, "\n".join(lines) + "\n")
    md = ["# GLUE (dev) of the time-budgeted model", "",
          "Metrics x100: accuracy (MNLI matched / mismatched), F1 and accuracy (MRPC, QQP), Matthews (CoLA), "
          "Pearson / Spearman (STS-B). `score` is the task's headline metric.", "",
          "| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]  # fmt: skip
    for r in rows:
        md.append("| " + " | ".join(_fmt(r[c]) for c in TABLE_COLUMNS) + " |")
    if scores:
        md += ["", f"Average score over {len(scores)} tasks: {100 * float(np.mean(scores)):.1f}"]
    atomic_write_text(out_md, "\n".join(md) + "\n")
    logger.info("GLUE table: %d tasks -> %s, %s", len(rows), out_csv, out_md)
    return rows
