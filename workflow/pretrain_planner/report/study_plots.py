"""Plots of the study's views (tables/study.py) and of the what-if predictions (tables/whatif.py), PNG + SVG.

Same conventions as plots.py: a `figure_*` builder per plot on the Agg canvas, fixed margins in inches from the
labels' lengths, an explanatory figure instead of a blank one when there is nothing to draw. Imports no torch."""

from __future__ import annotations

import math
import textwrap
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from pretrain_planner.report import plots
from pretrain_planner.report.plots import (
    CHAR_IN,
    MAX_BARS,
    TITLE_CHAR_IN,
    _canvas,
    _empty_figure,
    _legend_width,
    _margins,
    _save,
    _setting,
)
from pretrain_planner.results import atomic_write_text
from pretrain_planner.tables import units
from pretrain_planner.tables.study import _round_days, read_study_table, setting_label, stand_in_line

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STUDY_PLOTS = {
    "study_days": ("study_days", "Days to train with the optimal setting (the study's table)"),
    "gpu_days": ("gpu_days_plot", "GPU-days: the original run vs ours"),
    "speedups": ("speedups_plot", "Mean speed-ups (the study's two bar charts)"),
    "memory_saving": ("memory_saving_gain", "Memory-saving gain over free-lunch"),
    "whatif": ("whatif_plot", "What-if: predicted days on GPU types not measured"),
}


def plot_files(folder: str) -> dict[str, str]:
    return plots.plot_files(folder, STUDY_PLOTS)


def _read(tables: dict[str, str], name: str) -> pl.DataFrame:
    return read_study_table(tables[f"{name}_csv"])


@dataclass(frozen=True)
class Panel:
    """One grid of coloured cells with their text (a heat-map) and its labels."""

    rows: list[str]
    cols: list[str]
    values: list[list[float]]
    texts: list[list[str]]
    xlabel: str
    ylabel: str
    cmap: str
    vmin: float
    vmax: float
    title: str = ""

    @property
    def cell(self) -> tuple[float, float]:
        """(width, height) of one cell, inches."""
        return min(1.2, max(0.45, 8.0 / len(self.cols))), min(0.6, max(0.22, 4.0 / len(self.rows)))

    @property
    def bottom(self) -> float:
        """Inches under the grid for the rotated column labels and the x label."""
        return 0.5 + CHAR_IN * max(len(c) for c in self.cols)


def _heatmap(title: str, panels: list[Panel]) -> Figure:
    """Heat-maps stacked top to bottom, each as high as its rows need and as wide as the widest needs (or the
    title), no colour bar (the text says it)."""
    import numpy as np

    left = 0.6 + CHAR_IN * max(len(r) for p in panels for r in p.rows)
    head, sub = 0.4, (0.3 if len(panels) > 1 else 0.0)
    heights = [min(40, p.cell[1] * len(p.rows)) for p in panels]
    grid_w = max(p.cell[0] * len(p.cols) for p in panels)
    width = max(left + grid_w + 0.3, 0.4 + TITLE_CHAR_IN * 1.1 * len(title))
    total = head + sum(sub + h + p.bottom for p, h in zip(panels, heights, strict=True))
    fig = _canvas(width, total)
    top = total - head
    for p, h in zip(panels, heights, strict=True):
        top -= sub
        ax = fig.add_axes((left / width, (top - h) / total, (width - left - 0.3) / width, h / total))
        ax.imshow(np.ma.masked_invalid(np.array(p.values, dtype=float)), cmap=p.cmap, vmin=p.vmin, vmax=p.vmax,
                  aspect="auto", interpolation="nearest")  # fmt: skip
        fontsize = 7 if p.cell[0] >= 0.6 else 5
        if len(p.rows) * len(p.cols) <= 800:
            for i, line in enumerate(p.texts):
                for j, text in enumerate(line):
                    ax.text(j, i, text, ha="center", va="center", fontsize=fontsize)
        ax.set_xticks(range(len(p.cols)), p.cols, rotation=90, fontsize=7)
        ax.set_yticks(range(len(p.rows)), p.rows, fontsize=7)
        ax.set_xlabel(p.xlabel)
        ax.set_ylabel(p.ylabel)
        if p.title:
            ax.set_title(p.title, fontsize=8, loc="left")
        top -= h + p.bottom
    fig.suptitle(title, y=1 - 0.12 / total, va="top", fontsize=10)
    return fig


def figure_study_days(days: pl.DataFrame) -> Figure:
    """Model x setting, colour log10 of the optimal days, text the study's rounding (a dash: nothing fits)."""
    title = f"{STUDY_PLOTS['study_days'][1]}; a dash: nothing fits"
    cols = [c for c in days.columns if c != "model"]
    if days.is_empty() or not cols:
        return _empty_figure(title, "no settings", "GPU type, nodes x GPUs", "model")
    vals = [[math.log10(v) if v and v > 0 else math.nan for v in r[1:]] for r in days.rows()]
    finite = [v for r in vals for v in r if not math.isnan(v)]
    texts = [[_round_days(v) for v in r[1:]] for r in days.rows()]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    return _heatmap(title, [Panel(days["model"].to_list(), cols, vals, texts, "GPU type, nodes x GPUs", "model",
                                  "YlOrRd", lo - 0.5, hi + 0.5)])  # fmt: skip


def _hbars(title: str, labels: list[str], series: dict[str, list[float | None]], xlabel: str) -> Figure:
    """Horizontal bars, one group per label, one bar per series; values written at the bar ends; a log axis when
    the values span more than 100x."""
    from matplotlib import colormaps

    left = 0.4 + CHAR_IN * max(len(x) for x in labels)
    right = 0.3 + TITLE_CHAR_IN * 0.8 * max(len(s) for s in series)
    n = len(series)
    fig = _canvas(max(left + 6 + right, 0.4 + TITLE_CHAR_IN * len(title)), 1.3 + 0.2 * n * max(2, len(labels)))
    ax = fig.subplots()
    _margins(fig, left, right, 0.55, 0.45)
    height = 0.8 / n
    shown = [v for vs in series.values() for v in vs if v]
    for k, (name, vs) in enumerate(series.items()):
        ys = [i + (k - (n - 1) / 2) * height for i in range(len(labels))]
        ax.barh(ys, [v or 0 for v in vs], height=height, color=colormaps["tab10"](k), label=name)
        if len(labels) * n <= 60:
            for y, v in zip(ys, vs, strict=True):
                if v:
                    ax.text(v, y, f" {units.number(v)}", va="center", fontsize=6)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    if shown and max(shown) / min(shown) > 100:
        ax.set_xscale("log")
        ax.minorticks_off()
    ax.margins(x=0.15)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    return fig


def figure_gpu_days(gd: pl.DataFrame, whatif: pl.DataFrame | None = None) -> Figure:
    """Per model: the original run's GPU-days, ours (GPUs x the optimal days measured on the GPU-days setting) and,
    where the what-if predicts that setting, the predicted GPU-days (central; a PREDICTION, labelled so)."""
    title = STUDY_PLOTS["gpu_days"][1]
    setting = gd["ours_setting"].drop_nulls().first() if gd.height else None
    predicted = _predicted_gpu_days(whatif, setting)
    gd = gd.with_columns(pl.col("model").replace_strict(predicted, default=None, return_dtype=pl.Float64)
                         .alias("predicted_gpu_days"))  # fmt: skip
    gd = gd.filter(pl.any_horizontal(pl.col("ours_gpu_days", "original_gpu_days", "predicted_gpu_days").is_not_null()))
    if gd.is_empty():
        why = f"no model with an original record or an optimal setting on {setting or 'the GPU-days setting'}"
        return _empty_figure(title, f"{why}\n(study.gpu_days_* in the config names the setting)", "GPU-days", "model")
    series = {"originally reported": gd["original_gpu_days"].to_list(),
              f"ours: GPUs x optimal days on {setting}": gd["ours_gpu_days"].to_list(),
              f"PREDICTED on {setting} (what-if, central)": gd["predicted_gpu_days"].to_list()}  # fmt: skip
    shown = {k: v for k, v in series.items() if any(x is not None for x in v)}  # a series with no bar: no legend
    measured = gd["ours_gpu_days"].is_not_null().any()
    xlabel = "GPU-days (GPUs x days to train" + ("" if measured else f"; ours: nothing measured on {setting}") + ")"
    return _hbars(title, gd["model"].to_list(), shown, xlabel)


def _predicted_gpu_days(whatif: pl.DataFrame | None, setting: str | None) -> dict[str, float]:
    """model -> GPUs x the what-if's central days on the GPU-days setting (its rows of status `predicted`)."""
    if whatif is None or whatif.is_empty() or setting is None:
        return {}
    rows = whatif.filter((pl.col("status") == "predicted") & pl.col("days_central").is_not_null())
    return {r["model"]: r["days_central"] * r["world_size"] for r in rows.iter_rows(named=True)
            if setting_label(r["gpu"], r["nodes"], r["gpus_per_node"]) == setting}  # fmt: skip


def _in_mean(df: pl.DataFrame) -> pl.DataFrame:
    """The rows the study's average takes (the table's `in_mean`)."""
    return df.filter(pl.col("in_mean").fill_null(False)) if "in_mean" in df.columns else df


def figure_speedups(spd: pl.DataFrame, stats: pl.DataFrame) -> Figure:
    """Left: mean speed-up over naive of the analytic estimate and the optimal (the fastest fl-based method, the
    study's: labelled so, since it can be slower than naive). Right: mean speed-up over the worst memory-saving method
    of its median, best and free-lunch alone. Each over the rows with `in_mean` (the study's: its Pythia models; more
    than one GPU on the right). Where the averaged rows ran on the `cpu` stand-in, a line under the bars says why
    free-lunch wins little there (study.stand_in_line)."""
    line = stand_in_line(_in_mean(spd))
    note = textwrap.fill(line, 130) if line else ""
    height = 4.2 + 0.14 * (note.count("\n") + 1) if note else 4.2
    fig = _canvas(10, height)
    axes = fig.subplots(1, 2)
    _margins(fig, 0.8, 0.2, height - 3.6, 0.6)
    fig.subplots_adjust(wspace=0.3)
    panels = [
        (axes[0], _in_mean(spd), {"analytic": "speedup_analytic", "naive": "speedup_naive",
                                  "optimal\n(fastest fl-based)": "speedup_optimal"},
         "over naive", "no setting of the averaged models\nwith naive, optimal and analytic times"),
        (axes[1], _in_mean(stats), {"worst": None, "median": "speedup_median", "best": "speedup_optimal",
                                    "free-lunch\nalone": "speedup_free_lunch"}, "over the worst memory-saving",
         "no memory-saving method ran on more than one GPU\nfor the averaged models (add e.g. fl+ac)"),
    ]  # fmt: skip
    if note:
        fig.text(0.5, 0.1 / height, note, ha="center", va="bottom", fontsize=7)
    for ax, df, cols, what, empty in panels:
        ax.set_title(f"mean speed-up {what} (n={df.height})", fontsize=9)
        if df.is_empty():
            ax.set_xticks([])
            ax.set_yticks([])
            ax.text(0.5, 0.5, empty, ha="center", va="center", fontsize=8, transform=ax.transAxes)
            continue
        means = [1.0 if c is None else (df[c].drop_nulls().mean() or 0.0) for c in cols.values()]
        ax.bar(range(len(cols)), means, color=["#4c78a8", "#f58518", "#54a24b", "#e45756"][: len(cols)])
        ax.set_xticks(range(len(cols)), list(cols), fontsize=8)
        ax.set_ylabel("speed-up (x)", fontsize=8)
        for i, v in enumerate(means):
            ax.text(i, v, units.times(v), ha="center", va="bottom", fontsize=7)
        ax.margins(y=0.15)
    fig.suptitle(f"{STUDY_PLOTS['speedups'][1]}: means over the rows marked in_mean", fontsize=10,
                 y=1 - 0.1 / height, va="top")  # fmt: skip
    return fig


def _gain_panel(ms: pl.DataFrame, by: str, title: str) -> Panel | None:
    """GPU type x (GPU count | model): the mean gain of the rows, in the table's order; None without rows."""
    if ms.is_empty():
        return None
    if by == "count":
        ms = ms.with_columns(pl.format("{}x{}", "nodes", "gpus_per_node").alias("col"))
        cols = ms.sort("world_size", "nodes")["col"].unique(maintain_order=True).to_list()
        xlabel = "nodes x GPUs"
    else:
        ms = ms.with_columns(pl.col("model").alias("col"))
        cols, xlabel = ms["col"].unique(maintain_order=True).to_list(), "model"
    mean = ms.group_by("gpu", "col").agg(pl.col("gain").mean())
    rows = ms["gpu"].unique(maintain_order=True).to_list()
    got = {(g, c): v for g, c, v in mean.rows()}
    vals = [[got.get((g, c), math.nan) for c in cols] for g in rows]
    texts = [["" if math.isnan(v) else units.percent(v) for v in line] for line in vals]
    return Panel(rows, cols, vals, texts, xlabel, "GPU type", "RdYlGn", -1.0, 1.0, title)


def figure_memory_saving(ms: pl.DataFrame) -> Figure:
    """The study's two heat-maps of the mean gain (text: percent; red: memory saving costs time): GPU type x count
    over the averaged models (`in_count_mean`), GPU type x model on more than one GPU (`in_mean`)."""
    title = f"{STUDY_PLOTS['memory_saving'][1]}: mean of (fl only - best memory-saving) / fl only"
    flag = {c: pl.col(c).fill_null(False) for c in ("in_mean", "in_count_mean") if c in ms.columns}
    panels = [
        _gain_panel(ms.filter(flag["in_count_mean"]), "count", "by GPU count (the averaged models, every count)"),
        _gain_panel(ms.filter(flag["in_mean"]), "model", "by model (more than one GPU)"),
    ] if len(flag) == 2 else []  # fmt: skip
    shown = [p for p in panels if p is not None]
    if not shown:
        why = "no setting of the averaged models with both free-lunch alone\nand a memory-saving method (try fl+ac)"
        return _empty_figure(STUDY_PLOTS["memory_saving"][1], why, "nodes x GPUs", "GPU type")
    return _heatmap(title, shown)


def figure_whatif(w: pl.DataFrame) -> Figure:
    """One bar per prediction (central days), the optimistic-pessimistic band as an error bar, the measurement of
    the same setting (where there is one) as a black dot. The bars follow whatif.csv's rows, which tables/whatif.py
    writes in the order a reader asks (`reading_order`): every setting of the swept models and of those the config
    names (whatif.models), each model's ranked by days, then each other model's fastest, then the rest; the first
    MAX_BARS with days are drawn, and the title says so (sorted by name, the swept models were never reached)."""
    from matplotlib.lines import Line2D

    title = STUDY_PLOTS["whatif"][1] + " (PREDICTIONS; dot: measured)"
    title += "\nthe swept and named models first, each ranked by days; then each other model's fastest"
    shown = w.filter(pl.col("days_optimistic").is_not_null())
    n = shown.height
    if n > MAX_BARS:
        shown = shown.head(MAX_BARS)
        title += f"\n(the first {MAX_BARS} of {n}; all in tables/whatif.csv)"
    if shown.is_empty():
        return _empty_figure(title, "no prediction: see tables/whatif.md for why", "days to train", "")
    rows = list(shown.iter_rows(named=True))
    kinds = ["predicted from your cells", "predicted from public evidence", "bound only", "measured"]
    tag = {"your cells": "", "public evidence": "  (public)"}
    labels = [f"{r['model']}  {_setting(r)}  {r['method'] or r['status']}{tag.get(r.get('evidence') or '', '')}"
              for r in rows]  # fmt: skip
    left = 0.4 + CHAR_IN * max(len(x) for x in labels)
    right = _legend_width("", kinds)
    lines = title.split("\n")
    fig = _canvas(max(left + 6 + right, 0.4 + TITLE_CHAR_IN * 0.9 * max(len(x) for x in lines)),
                  min(60, 1.2 + 0.2 * len(lines) + 0.2 * max(4, len(rows))))  # fmt: skip
    ax = fig.subplots()
    _margins(fig, left, right, 0.55, 0.25 + 0.2 * len(lines))
    per, unit = units.duration_unit([r["days_central"] or r["days_optimistic"] for r in rows])
    central = [(r["days_central"] or r["days_optimistic"]) / per for r in rows]
    lo = [max(0.0, c - r["days_optimistic"] / per) for c, r in zip(central, rows, strict=True)]
    hi = [
        max(0.0, r["days_pessimistic"] / per - c) if r["days_pessimistic"] else 0.0
        for c, r in zip(central, rows, strict=True)
    ]
    colour = {"your cells": "#9ecae1", "public evidence": "#fdae6b"}
    colours = [colour.get(r.get("evidence") or "your cells", "#9ecae1") if r["status"] == "predicted" else "#d9d9d9"
               for r in rows]  # fmt: skip
    ax.barh(range(len(rows)), central, xerr=[lo, hi], color=colours, capsize=2, error_kw={"lw": 0.8})
    for i, r in enumerate(rows):
        if r["measured_days"]:
            ax.plot([r["measured_days"] / per], [i], "o", color="black", ms=3)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xlabel(f"time to train, {unit} (bar: central; whisker: optimistic - pessimistic)")
    ax.set_title(title, fontsize=10)
    handles = [Line2D([], [], color=c, lw=6) for c in ("#9ecae1", "#fdae6b", "#d9d9d9")]
    handles.append(Line2D([], [], marker="o", ls="", color="black", ms=3))
    ax.legend(handles, kinds, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    return fig


def figures(tables: dict[str, str]) -> dict[str, Figure]:
    """Every study plot as a Figure, keyed as STUDY_PLOTS (tables: keys as study.table_files + whatif)."""
    return {
        "study_days": figure_study_days(_read(tables, "days_optimal")),
        "gpu_days": figure_gpu_days(_read(tables, "gpu_days"), _read(tables, "whatif")),
        "speedups": figure_speedups(_read(tables, "speedups"), _read(tables, "step_time_stats")),
        "memory_saving": figure_memory_saving(_read(tables, "memory_saving")),
        "whatif": figure_whatif(_read(tables, "whatif")),
    }


def make_plots(tables: dict[str, str], out: dict[str, str], log_path: str) -> None:
    """The `study_plots` rule: every study plot, PNG and SVG."""
    t0 = time.perf_counter()
    for key, fig in figures(tables).items():
        _save(fig, out, key)
    atomic_write_text(log_path, f"study plots: {len(STUDY_PLOTS)} ({time.perf_counter() - t0:.2f} s)\n")
