"""The GLUE table of the budget stage: per task the median over seeds of the best setting (dev sets), beside the
published 24-hour numbers of Izsak et al. 2021 (test sets) and, as context, Cramming's and MosaicBERT's GLUE-dev
averages. The published numbers are those of ../shared/reference/papers.md, section B."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from pretrain_planner.budget.config import file_logger
from pretrain_planner.results import atomic_write_text

# the one number per task the study reports first
PRIMARY = {"cola": "mcc", "mrpc": "f1", "qqp": "f1", "stsb": "pearson"}
ORDER = ["mnli", "qnli", "qqp", "rte", "sst2", "mrpc", "cola", "stsb", "wnli"]  # the study's order
# The 24-hour model of Izsak et al. 2021 on the GLUE *test* sets, as listed by PapersWithCode (papers.md B:
# "test set, unverified"); MNLI matched / mismatched. x100.
PUBLISHED_24H_TEST = {"mnli": 84.4, "mnli_mm": 83.8, "qnli": 90.6, "qqp": 70.7, "rte": 57.7, "sst2": 93.0,
                      "mrpc": 87.5, "cola": 57.1, "stsb": 82.0}  # fmt: skip
# GLUE-dev averages of neighbours (papers.md B, "Neighbours"), context only: other models, budgets and task sets
CONTEXT_DEV_AVERAGES = [
    ("Cramming (Geiping & Goldstein 2022), 1 GPU, 24 h, v1 checkpoint", 78.6),
    ("Cramming, v2 checkpoint", 80.7),
    ("MosaicBERT (Portes et al. 2023), 1.13 h on 8xA100-80GB", 79.6),
]
TABLE_COLUMNS = ["task", "init", "lr", "batch", "epochs", "seeds", "train_rows", "dev_rows", "acc", "acc_mm", "f1",
                 "mcc", "pearson", "spearman", "score", "published_24h_test", "published_24h_test_mm"]  # fmt: skip


def _fmt(c: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if c.startswith("published"):
        return f"{v:.1f}"
    if c in ("lr",):
        return f"{v:g}"
    return f"{100 * v:.1f}" if isinstance(v, float) else str(v)


def _row(r: dict[str, Any]) -> dict[str, Any]:
    task, setting = r["task"], r.get("setting") or {}
    row = {c: r.get(c) for c in TABLE_COLUMNS}
    row.update(lr=setting.get("lr"), batch=setting.get("batch"), epochs=setting.get("epochs"))
    row["seeds"] = len(r["seeds"]) if r.get("seeds") else None
    row["score"] = r.get(PRIMARY.get(task, "acc"))
    row["published_24h_test"] = PUBLISHED_24H_TEST.get(task)
    row["published_24h_test_mm"] = PUBLISHED_24H_TEST.get(f"{task}_mm")
    return row


def _scored(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["score"] is not None and not math.isnan(r["score"])]


def average_score(rows: list[dict[str, Any]]) -> tuple[int, float | None]:
    """Tasks with a headline score (not NaN) and the mean of those scores x100: the table's GLUE average."""
    scored = _scored(rows)
    return len(scored), (100 * float(np.mean([r["score"] for r in scored])) if scored else None)


def glue_table(metric_files: list[str], out_csv: str | Path, out_md: str | Path, log: str | Path | None = None):
    """results: one row per task (the median over seeds of its best setting; metrics x100 in the markdown)."""
    logger = file_logger("glue_table", log)
    rows = sorted((_row(json.loads(Path(f).read_text())) for f in metric_files), key=lambda r: ORDER.index(r["task"]))
    lines = [",".join(TABLE_COLUMNS)]
    lines += [",".join("" if r[c] is None else str(r[c]) for c in TABLE_COLUMNS) for r in rows]
    atomic_write_text(out_csv, "\n".join(lines) + "\n")
    scored = _scored(rows)
    md = ["# GLUE (dev) of the time-budgeted model", "",
          "Per task the median over seeds of the best setting of the grid (learning rate x batch x epochs), each run "
          "keeping its best evaluated checkpoint (Izsak et al. 2021, appendix B). Metrics x100: accuracy (MNLI "
          "matched / mismatched), F1 and accuracy (MRPC, QQP), Matthews (CoLA), Pearson / Spearman (STS-B); "
          "`score` is the task's headline metric.", "",
          "**Ours are dev-set numbers; `published_24h_test` are the paper's 24-hour model on the GLUE *test* sets** "
          "(as listed by PapersWithCode, unverified): not the same data, a guide to the scale only.", "",
          "| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]  # fmt: skip
    md += ["| " + " | ".join(_fmt(c, r[c]) for c in TABLE_COLUMNS) + " |" for r in rows]
    if scored:
        md += ["", f"Average score over {len(scored)} tasks (dev): {average_score(rows)[1]:.1f}"]
        pub = [PUBLISHED_24H_TEST[r["task"]] for r in scored if r["task"] in PUBLISHED_24H_TEST]
        if len(pub) == len(scored):
            md += [f"Published 24-hour model, same tasks (test): {float(np.mean(pub)):.1f}"]
    md += ["", "Context, GLUE-dev averages of other budget recipes (other models and task sets, not comparable "
           "one to one):", ""]  # fmt: skip
    md += [f"- {name}: {avg:.1f}" for name, avg in CONTEXT_DEV_AVERAGES]
    atomic_write_text(out_md, "\n".join(md) + "\n")
    logger.info("GLUE table: %d tasks -> %s, %s", len(rows), out_csv, out_md)
    return rows
