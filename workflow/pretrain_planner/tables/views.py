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
    mb, accum = r.get("micro_batch_size"), r.get("grad_accum_steps")
    return "" if mb is None else f"{mb} x {accum}" if accum is not None else str(mb)


def _throughput(r: Row) -> str:
    if r.get("tokens_per_s") is not None:
        return units.rate(r["tokens_per_s"])
    if r.get("samples_per_s") is not None:
        return f"{units.rate(r['samples_per_s'])} img"
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
        ("best method", _text("best_method")),
        ("mb x accum", _micro),
        ("step", _unit("step_time_s", units.step)),
        ("tokens/s", _throughput),
        ("MFU", _mfu),
        ("memory", _unit("peak_mem_gib", units.gib)),
        ("days", _unit("training_days", units.days)),
        ("vs naive", _unit("speedup_vs_naive", units.times)),
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


def _whatif_basis(r: Row) -> str:
    if r.get("status") == "predicted":
        return str(r.get("basis") or "")
    if r.get("status") == "bound only":
        return "physics bound only (the `suspect` share of the dense peak): no measurement of its kind to transfer"
    return str(r.get("why") or "")


VIEWS["whatif"] = [
    *KEY,
    ("status", _text("status")),
    ("evidence", _text("evidence")),
    ("transfer", _text("transfer")),
    ("method", _text("method")),
    ("days", lambda r: _blank(units.days(r.get("days_central") or r.get("days_optimistic")))),
    ("band", lambda r: _band("days_optimistic", "days_pessimistic", r, units.days)),
    ("measured", _unit("measured_days", units.days)),
    ("amortised cost", lambda r: _band("amortised_usd_optimistic", "amortised_usd_pessimistic", r, units.usd)),
    ("rests on / why", _whatif_basis),
]

FOOTNOTES = {
    "mfu_measured": "* MFU against the dense peak MEASURED on the host (a matrix-multiply probe of the cell's "
    "precision, recorded in result.json `peak_source`), not a datasheet figure: the `cpu` stand-in has none.",
}


def view(name: str, df: pl.DataFrame) -> pl.DataFrame:
    """The Markdown columns of table `name`: strings, with units."""
    cols = VIEWS[name]
    rows = [{h: fn(r) for h, fn in cols} for r in df.iter_rows(named=True)]
    return pl.DataFrame(rows, schema=dict.fromkeys((h for h, _ in cols), pl.String), orient="row")


def footnotes(name: str, df: pl.DataFrame) -> list[str]:
    """The notes a view's marks need (e.g. `*` on an MFU against a measured peak)."""
    marks = {h for h, _ in VIEWS[name]}
    if "MFU" in marks and "peak_kind" in df.columns and (df["peak_kind"] == "measured").any():
        return [FOOTNOTES["mfu_measured"]]
    return []
