"""What each Markdown table shows: the columns a reader needs (at most ~12), written with units (tables/units.py).

The CSV and Parquet tables keep every column; each .md says so. One definition per table, read by the aggregation
(results/tables/*.md) and by results/report.md, so both show the same columns with the same rounding.
Imports no torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from pretrain_planner.tables import units
from pretrain_planner.tables.memfix import need_text

Row = dict[str, Any]
Column = tuple[str, Callable[[Row], str]]


def _text(key: str) -> Callable[[Row], str]:
    return lambda r: "" if r.get(key) is None else str(r[key])


def _gpus(r: Row) -> str:
    return units.layout(r["nodes"], r["gpus_per_node"])


def _micro(r: Row) -> str:
    micro_batch, accum = r.get("micro_batch"), r.get("grad_accum_steps")
    return "" if micro_batch is None else f"{micro_batch} x {accum}" if accum is not None else str(micro_batch)


def _throughput(r: Row) -> str:
    """Each row's rate with its own unit: a text model's tokens, an image model's samples, in one column."""
    if r.get("tokens_per_s") is not None:
        return f"{units.rate(r['tokens_per_s'])} tokens/s"
    if r.get("samples_per_s") is not None:
        return f"{units.rate(r['samples_per_s'])} samples/s"
    return ""


def _mfu(r: Row) -> str:
    if r.get("mfu") is None:
        return ""
    return units.percent(r["mfu"]) + ("*" if r.get("peak_kind") == "measured" else "")


def _blank(text: str) -> str:
    return "" if text == units.DASH else text


def _unit(key: str, writer: Callable[[Any], str]) -> Callable[[Row], str]:
    return lambda r: _blank(writer(r.get(key)))


def _need(r: Row) -> str:
    return need_text(r.get("need_gib"), r.get("need_source"))


KEY: list[Column] = [("model", _text("model")), ("GPU", _text("gpu")), ("GPUs", _gpus)]

VIEWS: dict[str, list[Column]] = {
    "time_to_train": [
        *KEY,
        ("best method", lambda r: str(r["best_method"]) + (" (tie)" if r.get("tie") else "")),
        ("mb x accum", _micro),
        ("step", _unit("step_time_s", units.step)),
        ("throughput", _throughput),
        ("MFU", _mfu),
        ("memory", _unit("peak_mem_gib", units.gib)),
        ("days", _unit("training_days", units.days)),
        ("vs naive", _unit("speedup_vs_naive", units.times)),
        ("loss", _text("loss")),
    ],
    "measured_vs_analytic": [
        *KEY,
        ("best method", _text("best_method")),
        ("days", _unit("training_days", units.days)),
        ("analytic days", _unit("analytic_days", units.days)),
        ("measured / analytic", _unit("measured_over_analytic", units.times)),
        ("peak (TFLOP/s)", lambda r: _blank(units.number(r.get("analytic_peak_tflops"), 3))),
        ("peak from", _text("peak_kind")),
    ],
    "feasibility": [
        *KEY,
        ("verdict", _text("verdict")),
        ("naive", _text("naive")),
        ("fl", _text("fl")),
        ("best method", _text("best_method")),
        ("days", _unit("training_days", units.days)),
        ("needs at mb 1", _need),
        ("GPU memory", _unit("gpu_memory_gib", units.gib)),
        ("cheapest fix", _text("cheapest_fix")),
        ("loss", _text("loss")),
    ],
    "loss_check": [
        *KEY,
        ("method", _text("method")),
        ("line", _text("role")),
        ("against", _text("against")),
        ("loss", _text("loss")),
        ("worst / band", lambda r: "" if r.get("worst_ratio") is None else units.number(r["worst_ratio"], 3)),
        ("band runs", _text("band_runs")),
        ("steps", _text("steps")),
        ("note", _text("note")),
    ],
    "oom": [
        *KEY,
        ("method", _text("method")),
        ("needs at mb 1", _need),
        ("GPU memory", _unit("gpu_memory_gib", units.gib)),
        ("from", _text("need_source")),
        ("cheapest fix", _text("cheapest_fix")),
        ("other fixes", _text("other_fixes")),
    ],
    "cells": [
        *KEY,
        ("method", _text("method")),
        ("status", lambda r: str(r["status"]) + (" (suspect)" if r.get("suspect") else "")),
        ("mb x accum", _micro),
        ("step", _unit("step_time_s", units.step)),
        ("MFU", _mfu),
        ("days", _unit("training_days", units.days)),
        ("analytic days", _unit("analytic_days", units.days)),
        ("start-up", _unit("startup_s", units.duration_s)),
        ("compile", _unit("compile_s", units.duration_s)),
        ("reason", _text("reason")),
    ],
    "costs": [
        *KEY,
        ("best method", _text("best_method")),
        ("days", _unit("training_days", units.days)),
        ("hardware", _unit("hardware_usd", units.usd)),
        ("amortised", _unit("amortised_usd", units.usd)),
        ("cloud", _unit("cloud_usd", units.usd)),
        ("Pareto", lambda r: "yes" if r.get("pareto") else ""),
        ("note", _text("cost_note")),
    ],
    "pareto": [
        *KEY,
        ("best method", _text("best_method")),
        ("days", _unit("training_days", units.days)),
        (
            "cost",
            lambda r: _blank(units.usd(r.get("cost_usd"))) + (f" ({r['cost_kind']})" if r.get("cost_kind") else ""),
        ),
        ("hardware", _unit("hardware_usd", units.usd)),
        ("amortised", _unit("amortised_usd", units.usd)),
        ("cloud", _unit("cloud_usd", units.usd)),
    ],
    "problems": [
        ("model", _text("model")),
        ("GPU", _text("gpu")),
        ("GPUs", lambda r: _gpus(r) if r.get("nodes") is not None else ""),
        ("method", _text("method")),
        ("problem", _text("problem")),
    ],
    "benchmark_cost": [
        *KEY,
        ("search", _text("strategy")),
        ("best method", _text("best_method")),
        (
            "methods valid / run / pruned",
            lambda r: f"{r['methods_valid']} / {r['methods_run']} / {r['methods_pruned']}",
        ),
        ("GPU-hours spent", lambda r: _blank(units.number(r.get("gpu_hours_spent"), 3))),
        ("bound (run)", lambda r: _blank(units.number(r.get("gpu_hours_max_run"), 3))),
        ("bound (every valid cell)", lambda r: _blank(units.number(r.get("gpu_hours_max_exhaustive"), 3))),
    ],
}


def _band(lo: str, hi: str, r: Row, writer: Callable[[Any], str]) -> str:
    a, b = r.get(lo), r.get(hi)
    if a is None:
        return ""
    return f"{writer(a)} - {writer(b)}" if b is not None else f">= {writer(a)}"


def _reach(r: Row) -> str:
    """'142B tokens (47%)': what the days reach at the setting's pace, and that share of the recipe's run."""
    if r.get("tokens_in_time") is None:
        return ""
    share = f" ({units.percent(r['share_of_run'])})" if r.get("share_of_run") is not None else ""
    return f"{units.number(r['tokens_in_time'] / 1e9)}B {r.get('unit') or 'tokens'}{share}"


def _fit_days(r: Row) -> str:
    if r.get("days") is not None:
        return _blank(units.days(r["days"]))
    return f">= {units.days(r['days_optimistic'])}" if r.get("days_optimistic") is not None else ""


def _fit_band(r: Row) -> str:
    return _band("days_optimistic", "days_pessimistic", r, units.days) if r.get("days") is not None else ""


FIT_BASIS = {"public evidence": "public runs", "bound only": "physics bound"}
# `pretrain-planner fit`: per model, whether the recipe's run fits in the days (tables/whatif.fit_table)
VIEWS["fit"] = [
    ("model", _text("model")),
    ("fits", _text("fits")),
    ("method", _text("method")),
    ("days", _fit_days),
    ("band", _fit_band),
    ("basis", lambda r: FIT_BASIS.get(r.get("basis") or "", r.get("basis") or "")),
    ("reaches (of the run)", _reach),
]


# ------------------------------------------------------------------ the study's views (tables/study.py)
# Their CSVs keep the study's column names; these are what a reader sees. An averaged view's last row is its mean,
# model "mean" with no GPU type or count (what it averages is said under the table).


def _study_gpus(r: Row) -> str:
    return _gpus(r) if r.get("nodes") is not None else ""


def _yes(key: str) -> Callable[[Row], str]:
    return lambda r: "yes" if r.get(key) else ""


def _yes_no(key: str) -> Callable[[Row], str]:
    return lambda r: "" if r.get(key) is None else "yes" if r[key] else "no"


def _days_of(days: str, method: str) -> Callable[[Row], str]:
    """'1.4 min (fl+ac)': a setting's days and the method that took them."""
    return lambda r: "" if r.get(days) is None else f"{units.days(r[days])} ({r.get(method) or '?'})"


def _share_of(share: str, peak: str) -> Callable[[Row], str]:
    return lambda r: "" if r.get(share) is None else f"{units.percent(r[share])} of {units.number(r.get(peak))} TFLOP/s"


def _original_run(r: Row) -> str:
    """'64 x 3 d': the GPUs and days of a model's original training run, as its authors reported them."""
    return "" if r.get("original_gpus") is None else f"{r['original_gpus']:,} x {units.days(r.get('original_days'))}"


def _batch_steps(r: Row) -> str:
    """'1,024 x 143,000': the recipe's global batch and steps (blank for a time-budgeted recipe)."""
    return "" if r.get("recipe_steps") is None else f"{r['global_batch']:,} x {r['recipe_steps']:,}"


STUDY_KEY: list[Column] = [("model", _text("model")), ("GPU", _text("gpu")), ("GPUs", _study_gpus)]
VIEWS["study_optimal_settings"] = [
    *STUDY_KEY,
    ("optimal method", _text("best_method")),
    ("ac", _yes_no("checkpointing")),  # activation checkpointing, the method grammar's `ac`
    ("sharding", lambda r: r.get("sharding") or ("no" if r.get("best_method") else "")),
    ("offload", _yes_no("offload")),
    ("mb x accum", _micro),
    ("MFU", _mfu),
    ("days", _unit("training_days", units.days)),
]
VIEWS["study_gpu_days"] = [
    ("model", _text("model")),
    ("original run", _original_run),
    ("original GPU-days", lambda r: _blank(units.number(r.get("original_gpu_days"), 3))),
    ("our method", _text("ours_method")),
    ("our days", _unit("ours_days", units.days)),
    ("our GPU-days", lambda r: _blank(units.number(r.get("ours_gpu_days"), 3))),
    ("ours / original", _unit("ours_over_original", units.times)),
]
VIEWS["study_speedups"] = [
    *STUDY_KEY,
    ("naive", _unit("days_naive", units.days)),
    ("optimal (fl-based)", _days_of("days_optimal", "optimal_method")),
    ("analytic vs naive", _unit("speedup_analytic", units.times)),
    ("optimal vs naive", _unit("speedup_optimal", units.times)),
    ("in mean", _yes("in_mean")),
]
VIEWS["study_memory_saving"] = [
    *STUDY_KEY,
    ("free-lunch only", _days_of("days_free_lunch", "free_lunch_method")),
    ("best memory-saving", _days_of("days_memory_saving", "memory_saving_method")),
    ("gain", _unit("gain", units.percent)),
    ("in mean", _yes("in_mean")),
    ("in count mean", _yes("in_count_mean")),
]
VIEWS["study_step_time_stats"] = [
    *STUDY_KEY,
    ("methods", _text("memory_saving_methods")),
    ("worst step", _unit("worst_s", units.step)),
    ("median", _unit("speedup_median", units.times)),
    ("best", _unit("speedup_optimal", units.times)),
    ("best method", _text("optimal_method")),
    ("fl only", _unit("speedup_free_lunch", units.times)),
    ("in mean", _yes("in_mean")),
]
VIEWS["study_model_flops"] = [
    ("model", _text("model")),
    ("family", _text("family")),
    ("in sweep", _yes("in_sweep")),
    ("FLOPs / sample", _unit("flops_per_sample", units.sci)),
    ("batch x steps", _batch_steps),
    ("FLOPs to train", _unit("training_flops", units.sci)),
    ("note", _text("study_counter_note")),
]
VIEWS["study_claims"] = [
    ("model", _text("model")),
    ("GPU", _text("gpu")),
    ("GPUs", lambda r: units.layout(1, r["world_size"])),  # the study's sweep had one node
    ("study's days", _unit("study_days", units.days)),
    ("implied MFU", _share_of("implied_mfu", "peak_tflops")),
    ("at the study's peak", _share_of("implied_mfu_study_peak", "study_peak_tflops")),
    ("suspect", lambda r: (r.get("suspect_reason") or "yes") if r.get("suspect") else "no"),
    ("our days", _unit("ours_days", units.days)),
]


def _wait(r: Row) -> str:
    """'3.2 h' / 'none (local)' / 'wait unknown': the first job's wait, never a blank that reads as none."""
    if r.get("segments") is None:
        return ""
    if r.get("first_wait_h") is None:
        return "wait unknown"
    if (r.get("wait_basis") or "").startswith("local"):
        return "none (local)"
    return units.duration_s(r["first_wait_h"] * 3600)


def _lost(r: Row) -> str:
    return "" if r.get("restart_loss_h") is None else _blank(units.duration_s(r["restart_loss_h"] * 3600))


def _finish(r: Row) -> str:
    return "" if r.get("expected_finish") in (None, "") else str(r["expected_finish"]).replace("T", " ")


VIEWS["calendar"] = [
    *KEY,
    ("method", _text("method")),
    ("run", _text("run")),
    ("compute", _unit("compute_days", units.days)),
    ("segments", lambda r: "" if r.get("segments") is None else str(r["segments"])),
    ("lost to restarts", _lost),
    ("first wait", _wait),
    ("calendar", _unit("calendar_days", units.days)),
    ("finish", _finish),
    ("first", lambda r: "yes" if r.get("finishes_first") else ""),
]


FOOTNOTES = {
    "mfu_measured": "* MFU against the dense peak MEASURED on the host (a matrix-multiply probe of the cell's "
    "precision, recorded in result.json `peak_source`), not a datasheet figure: the `cpu` stand-in has none.",
    "tie": "(tie) a faster method's step was inside the pick's noise (at most the faster one's p90 step): the simpler "
    "method is kept; the CSV's `tie` says which and by how much.",
}


def view(name: str, df: pl.DataFrame) -> pl.DataFrame:
    """The Markdown columns of table `name`: strings, with units."""
    cols = VIEWS[name]
    rows = [{h: fn(r) for h, fn in cols} for r in df.iter_rows(named=True)]
    return pl.DataFrame(rows, schema=dict.fromkeys((h for h, _ in cols), pl.String), orient="row")


def footnotes(name: str, df: pl.DataFrame) -> list[str]:
    """The notes a view's marks need (e.g. `*` on an MFU against a measured peak)."""
    marks = {h for h, _ in VIEWS[name]}
    notes = []
    if "MFU" in marks and "peak_kind" in df.columns and (df["peak_kind"] == "measured").any():
        notes.append(FOOTNOTES["mfu_measured"])
    if name == "time_to_train" and "tie" in df.columns and df["tie"].is_not_null().any():
        notes.append(FOOTNOTES["tie"])
    return notes
