"""The GLUE table of the budget stage: per task the median over seeds of the best setting (dev sets), beside the
published 24-hour numbers of Izsak et al. 2021 (test sets) and, as context, Cramming's and MosaicBERT's GLUE-dev
averages. docs/budget.md (GLUE) carries every published number with its source.

Every average this table shows is on one basis, `AVERAGE_BASIS`: one entry per (task, headline metric), MNLI
matched and mismatched as two entries, WNLI left out - the basis of Cramming's average, so that its figure can sit
beside ours; the entries an average takes are listed under it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from pretrain_planner.results import atomic_write_text
from pretrain_planner.runlog import FileLog
from pretrain_planner.tables.markdown import csv_text, table

# the one number per task the study reports first
PRIMARY = {"cola": "mcc", "mrpc": "f1", "qqp": "f1", "stsb": "pearson"}
ORDER = ["mnli", "qnli", "qqp", "rte", "sst2", "mrpc", "cola", "stsb", "wnli"]  # the study's order
# The 24-hour model of Izsak et al. 2021 on the GLUE *test* sets, as listed by PapersWithCode (unverified);
# MNLI matched / mismatched. x100.
PUBLISHED_24H_TEST = {"mnli": 84.4, "mnli_mm": 83.8, "qnli": 90.6, "qqp": 70.7, "rte": 57.7, "sst2": 93.0,
                      "mrpc": 87.5, "cola": 57.1, "stsb": 82.0}  # fmt: skip
# The basis of every average shown: (task, metric) entries; the key of PUBLISHED_24H_TEST each one reads
AVERAGE_BASIS = (("mnli", "acc"), ("mnli", "acc_mm"), ("qnli", "acc"), ("qqp", "f1"), ("rte", "acc"), ("sst2", "acc"),
                 ("mrpc", "f1"), ("cola", "mcc"), ("stsb", "pearson"))  # fmt: skip
BASIS_TEXT = ("one entry per task's headline metric (accuracy; F1 for MRPC and QQP; Matthews for CoLA; Pearson for "
              "STS-B), MNLI matched and mismatched as two entries, WNLI left out")  # fmt: skip
# GLUE-dev averages of neighbours (Cramming, Geiping & Goldstein 2022; MosaicBERT, Portes et al. 2023), context
# only: other models and budgets. Cramming averages MNLI matched and mismatched as two entries without WNLI (as
# issue 24 reads its table): our basis. MosaicBERT's per-task entries are not in our sources: its figure is quoted
# apart, not as an average of our basis.
CONTEXT_DEV_AVERAGES = [
    ("Cramming (Geiping & Goldstein 2022), 1 GPU, 24 h, v1 checkpoint", 78.6),
    ("Cramming, v2 checkpoint", 80.7),
]
CONTEXT_OTHER_BASIS = [("MosaicBERT (Portes et al. 2023), 1.13 h on 8xA100-80GB", 79.6)]
SELECT_TEXT = {
    "final": "each run's **final model** (as the reference's run_glue.py command reports it: no "
    "load_best_model_at_end)",
    "best_dev": "each run's **best dev checkpoint** (`glue.select: best_dev`): chosen on the same dev set it is "
    "reported on, so these scores are biased upward against the reference's final-model ones",
    "unrecorded": "runs that do not record which model they report (written before `glue.select` existed: those "
    "kept their best dev checkpoint, biased upward)",
}
TABLE_COLUMNS = ["task", "init", "lr", "batch", "epochs", "seeds", "train_rows", "dev_rows", "acc", "acc_mm", "f1",
                 "mcc", "pearson", "spearman", "score", "published_24h_test", "published_24h_test_mm",
                 "select"]  # fmt: skip


METRICS = ("acc", "acc_mm", "f1", "mcc", "pearson", "spearman", "score")  # shares in the CSV, x100 in the Markdown


def _shown(c: str, v: Any) -> Any:
    """A value as the Markdown table takes it (tables.markdown writes it): a metric x100, the rest as it is."""
    return 100 * v if c in METRICS and isinstance(v, float) else v


def _row(r: dict[str, Any]) -> dict[str, Any]:
    task, setting = r["task"], r.get("setting") or {}
    row = {c: r.get(c) for c in TABLE_COLUMNS}
    row.update(lr=setting.get("lr"), batch=setting.get("batch"), epochs=setting.get("epochs"))
    row["seeds"] = len(r["seeds"]) if r.get("seeds") else None
    row["score"] = r.get(PRIMARY.get(task, "acc"))
    row["published_24h_test"] = PUBLISHED_24H_TEST.get(task)
    row["published_24h_test_mm"] = PUBLISHED_24H_TEST.get(f"{task}_mm")
    return row


def _entry(task: str, metric: str) -> str:
    return f"{task}_mm" if metric.endswith("_mm") else task


def average_score(rows: list[dict[str, Any]]) -> tuple[list[str], float | None]:
    """The basis's entries the rows score (not NaN) and the mean of those scores x100: every GLUE average shown."""
    got = {r["task"]: r for r in rows}
    entries = [(_entry(t, m), got[t].get(m)) for t, m in AVERAGE_BASIS if t in got]
    scored = [(e, float(v)) for e, v in entries if v is not None and not math.isnan(float(v))]
    return [e for e, _ in scored], (100 * float(np.mean([v for _, v in scored])) if scored else None)


def published_average(entries: list[str]) -> float | None:
    """The published 24-hour model's (test) average over the same entries; None if one is not published."""
    if not entries or any(e not in PUBLISHED_24H_TEST for e in entries):
        return None
    return float(np.mean([PUBLISHED_24H_TEST[e] for e in entries]))


def _selected(rows: list[dict[str, Any]]) -> str:
    """Which model of each run the rows report (glue.select), in words; per task when the tasks differ."""
    kinds = {r["task"]: r.get("select") or "unrecorded" for r in rows}
    if len(set(kinds.values())) == 1:
        return SELECT_TEXT[next(iter(kinds.values()))]
    return "; ".join(f"{', '.join(t for t, k in kinds.items() if k == kind)}: {SELECT_TEXT[kind]}"
                     for kind in sorted(set(kinds.values())))  # fmt: skip


def glue_table(metric_files: list[str], out_csv: str | Path, out_md: str | Path, log: str | Path | None = None):
    """results: one row per task (the median over seeds of its best setting; metrics x100 in the markdown)."""
    logger = FileLog(log)
    rows = sorted((_row(json.loads(Path(f).read_text())) for f in metric_files), key=lambda r: ORDER.index(r["task"]))
    atomic_write_text(out_csv, csv_text(TABLE_COLUMNS, ([r[c] for c in TABLE_COLUMNS] for r in rows)))
    chosen = _selected(rows)
    md = ["# GLUE (dev) of the time-budgeted model", "",
          "Per task the median over seeds of the best setting of the grid (learning rate x batch x epochs; Izsak et "
          f"al. 2021, appendix B), {chosen}. Metrics x100: accuracy (MNLI matched / mismatched), F1 and accuracy "
          "(MRPC, QQP), Matthews (CoLA), Pearson / Spearman (STS-B); `score` is the task's headline metric.", "",
          "**Ours are dev-set numbers; `published_24h_test` are the paper's 24-hour model on the GLUE *test* sets** "
          "(as listed by PapersWithCode, unverified): not the same data, a guide to the scale only.", "",
          table(TABLE_COLUMNS, [[_shown(c, r[c]) for c in TABLE_COLUMNS] for r in rows]).rstrip("\n")]  # fmt: skip
    entries, avg = average_score(rows)
    md += ["", f"Every average below is on one basis: {BASIS_TEXT}."]
    if avg is not None:
        md += ["", f"Average score over {len(entries)} entries (dev): {avg:.1f} - entries: {', '.join(entries)}"]
        pub = published_average(entries)
        if pub is not None:
            md += ["", f"Published 24-hour model, same entries (test): {pub:.1f} - entries: {', '.join(entries)}"]
    full = [_entry(t, m) for t, m in AVERAGE_BASIS]
    md += ["", f"Published 24-hour model, all {len(full)} entries (test): {published_average(full):.1f} - entries: "
           f"{', '.join(full)}", "",
           "Context, GLUE-dev averages of other budget recipes on the same basis (all 9 entries; other models, data "
           "and budgets, not comparable one to one):", ""]  # fmt: skip
    md += [f"- {name}: {value:.1f}" for name, value in CONTEXT_DEV_AVERAGES]
    md += ["", "Quoted apart (its per-task entries are not in our sources, so not known to be on this basis):", ""]
    md += [f"- {name}: GLUE-dev {value:.1f}" for name, value in CONTEXT_OTHER_BASIS]
    atomic_write_text(out_md, "\n".join(md) + "\n")
    logger.info("GLUE table: %d tasks -> %s, %s", len(rows), out_csv, out_md)
    return rows
