"""GLUE by the paper's protocol: tasks and readers of the standard layout, and the fine-tuning job of one task.

Protocol (Izsak et al. 2021, appendix B, and its code's run_glue.py): every setting of the grid (`glue.lr` x
`glue.batch` x `glue.epochs`) is fine-tuned with each of `glue.seeds`, each run reporting the model `glue.select`
names - its final model (default, as the reference's command) or its best evaluated checkpoint
(`budget/glue_train.py`); per task the table reports the median over seeds of the best setting
(`budget/glue_metrics.py`). MNLI is fine-tuned first from the pre-trained model; RTE, STS-B and MRPC (config
`glue.from_mnli`) start from the MNLI-fine-tuned model (that of the best seed of MNLI's best setting).
Metrics (scikit-learn, scipy): accuracy (MNLI matched/mismatched, QNLI, RTE, SST-2, WNLI), accuracy and F1
(MRPC, QQP), Matthews correlation (CoLA), Pearson and Spearman correlation (STS-B). The table:
`budget/glue_report.py`.
"""

from __future__ import annotations

import csv
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pretrain_planner.budget import glue_metrics
from pretrain_planner.budget.config import set_torch_threads
from pretrain_planner.launch.local import TORCH_LOCK
from pretrain_planner.planning.configtypes import BudgetGlue, BudgetRecipe, require
from pretrain_planner.results import atomic_write_text
from pretrain_planner.runlog import FileLog

# GLUE task -> the folder name of the standard download
TASK_DIRS = {
    "cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B",
    "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI",
}  # fmt: skip


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
def grid(g: BudgetGlue) -> list[dict[str, Any]]:
    """The settings of `glue` (lr x batch x epochs; a single value is a one-value axis), in grid order."""
    require(g, BudgetGlue, "budget.glue.grid")
    return [{"lr": lr, "batch": b, "epochs": e} for lr, b, e in itertools.product(g.lr, g.batch, g.epochs)]


def finetune(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The grid x seeds on one task from `init_model` (a model folder with tokenizer.json), the protocol's
    result in `out_metrics`. Arguments as `_finetune`; one torch job at a time per process (TORCH_LOCK)."""
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
    import torch
    import transformers as tf

    from pretrain_planner.budget.glue_train import train_run

    tf.utils.logging.disable_progress_bar()
    logger = FileLog(log)
    recipe = BudgetRecipe.of(cfg)  # the job's JSON, typed once
    g, tr = recipe.glue, recipe.train
    task = TASKS[task_name]
    set_torch_threads(tr, threads)
    device = torch.device("cuda" if tr.wants_gpu() and torch.cuda.is_available() else "cpu")
    train_x, train_y, devs = _task_data(g, task)
    init_model = Path(init_model)
    encode = _encoder(init_model, g.max_len, device)
    settings, key = grid(g), glue_metrics.monitor(task_name)
    logger.info("%s from %s (%s): %d train rows, %d settings x seeds %s, monitor %s, device %s", task_name,
                init_model, init_kind, len(train_x), len(settings), list(g.seeds), key, device)  # fmt: skip
    runs, keep = [], {}  # keep: per setting, the best seed's weights (on CPU) when a model is to be written
    for s in settings:
        for seed in g.seeds:
            torch.manual_seed(seed)  # the new head's initialisation, dropout
            model = _classifier(init_model, task, device)
            run = train_run(model, encode, train_x, train_y, devs, task, g, **s, seed=seed, device=device,
                            logger=logger)  # fmt: skip
            runs.append(run)
            k = (s["lr"], s["batch"], s["epochs"])
            if out_model and (k not in keep or glue_metrics.better(run[key], keep[k][0])):
                keep[k] = (run[key], seed, {n: v.detach().to("cpu", copy=True) for n, v in model.state_dict().items()})
            del model
    metric_keys = [m for m in runs[0] if m in _METRIC_KEYS]
    agg = glue_metrics.aggregate(runs, key, metric_keys)
    best = agg["setting"]
    logger.info("%s: best setting %s, median over seeds %s", task_name, json.dumps(best), json.dumps(agg["metrics"]))
    result: dict[str, Any] = {
        "task": task_name, "init": init_kind, "init_model": str(init_model), "train_rows": len(train_x),
        "monitor": key, "select": g.select, "setting": best, "seeds": agg["seeds"], **agg["metrics"],
        **{k: runs[0][k] for k in ("dev_rows", "dev_rows_mm") if k in runs[0]},
        "settings": agg["settings"], "runs": runs,
    }  # fmt: skip
    if out_model:
        _, seed, state = keep[(best["lr"], best["batch"], best["epochs"])]
        model = _classifier(init_model, task, device)
        model.load_state_dict(state)
        out_model = Path(out_model)
        model.save_pretrained(out_model)
        (out_model / "tokenizer.json").write_bytes((init_model / "tokenizer.json").read_bytes())
        result["model"] = {**best, "seed": seed}
    atomic_write_text(out_metrics, json.dumps(result, indent=1))
    return result


_METRIC_KEYS = ("acc", "f1", "mcc", "pearson", "spearman", "acc_mm", "f1_mm")


def _task_data(g: BudgetGlue, task: Task) -> tuple[list[tuple[str, ...]], list[Any], dict[str, tuple[list, list]]]:
    """The task's training rows (at most glue.max_train_samples) and its dev files' rows."""
    folder = task_dir(g.data_dir, task.name)
    train_x, train_y = read_tsv(folder / "train.tsv", task)
    if g.max_train_samples:
        train_x, train_y = train_x[: g.max_train_samples], train_y[: g.max_train_samples]
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
