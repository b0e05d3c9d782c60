"""Plots of the study's views (tables/study.py) and of the what-if predictions (tables/whatif.py), PNG + SVG.

Same conventions as plots.py: a `figure_*` builder per plot on the Agg canvas, fixed margins in inches from the
labels' lengths, an explanatory figure instead of a blank one when there is nothing to draw. Imports no torch."""

from __future__ import annotations

import math
import time
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
from pretrain_planner.tables.study import _round_days, read_study_table

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


def _heatmap(title: str, rows: list[str], cols: list[str], values: list[list[float]], texts: list[list[str]],
             xlabel: str, ylabel: str, cmap: str, vmin: float, vmax: float) -> Figure:  # fmt: skip
    """A grid of coloured cells with their text, sized to fill the figure; no colour bar (the text says it)."""
    import numpy as np

    left = 0.6 + CHAR_IN * max(len(r) for r in rows)
    bottom = 0.5 + CHAR_IN * max(len(c) for c in cols)
    cell_w, cell_h = min(1.2, max(0.45, 8.0 / len(cols))), min(0.6, max(0.22, 4.0 / len(rows)))
    width = max(left + cell_w * len(cols) + 0.3, 0.4 + TITLE_CHAR_IN * 1.1 * len(title))
    fig = _canvas(width, min(40, cell_h * len(rows)) + bottom + 0.4)
    ax = fig.subplots()
    _margins(fig, left, 0.3, bottom, 0.4)
    ax.imshow(np.ma.masked_invalid(np.array(values, dtype=float)), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
              interpolation="nearest")  # fmt: skip
    fontsize = 7 if cell_w >= 0.6 else 5
    if len(rows) * len(cols) <= 800:
        for i, line in enumerate(texts):
            for j, text in enumerate(line):
                ax.text(j, i, text, ha="center", va="center", fontsize=fontsize)
    ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.suptitle(title, y=1 - 0.12 / fig.get_size_inches()[1], va="top", fontsize=10)
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
    return _heatmap(title, days["model"].to_list(), cols, vals, texts, "GPU type, nodes x GPUs", "model", "YlOrRd",
                    lo - 0.5, hi + 0.5)  # fmt: skip


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
                    ax.text(v, y, f" {v:.3g}", va="center", fontsize=6)
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


def figure_gpu_days(gd: pl.DataFrame) -> Figure:
    title = STUDY_PLOTS["gpu_days"][1]
    gd = gd.filter(pl.col("ours_gpu_days").is_not_null() | pl.col("original_gpu_days").is_not_null())
    if gd.is_empty():
        return _empty_figure(title, "no model with a measured time to train yet", "GPU-days", "model")
    labels = [
        f"{r['model']} ({r['ours_setting']})" if r["ours_setting"] else r["model"] for r in gd.iter_rows(named=True)
    ]
    return _hbars(title, labels, {"originally reported": gd["original_gpu_days"].to_list(),
                                  "ours (fewest GPU-days measured)": gd["ours_gpu_days"].to_list()},
                  "GPU-days (GPUs x days to train)")  # fmt: skip


def figure_speedups(spd: pl.DataFrame, stats: pl.DataFrame) -> Figure:
    """Left: mean speed-up over naive of the analytic estimate and the optimal method. Right: mean speed-up over the
    worst memory-saving method of its median, optimal and free-lunch alone."""
    fig = _canvas(10, 4.2)
    axes = fig.subplots(1, 2)
    _margins(fig, 0.8, 0.2, 0.5, 0.6)
    fig.subplots_adjust(wspace=0.3)
    panels = [
        (axes[0], spd, {"analytic": "speedup_analytic", "naive": "speedup_naive", "optimal": "speedup_optimal"},
         "over naive", "no setting with a naive time"),
        (axes[1], stats, {"worst": None, "median": "speedup_median", "optimal": "speedup_optimal",
                          "free-lunch": "speedup_free_lunch"}, "over the worst memory-saving method",
         "no memory-saving method ran\n(add e.g. fl+ac to sweep.methods)"),
    ]  # fmt: skip
    for ax, df, cols, what, empty in panels:
        ax.set_title(f"mean speed-up {what}", fontsize=9)
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
            ax.text(i, v, f"{v:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.margins(y=0.15)
    fig.suptitle(f"{STUDY_PLOTS['speedups'][1]}: means over the settings of the sweep", fontsize=10,
                 y=1 - 0.1 / 4.2, va="top")  # fmt: skip
    return fig


def figure_memory_saving(ms: pl.DataFrame) -> Figure:
    """GPU type x count, the mean gain over the models (text: percent; red: memory saving costs time)."""
    title = f"{STUDY_PLOTS['memory_saving'][1]}: mean over models of (fl - best memory-saving) / fl"
    ms = ms.filter(pl.col("gain").is_not_null())
    if ms.is_empty():
        why = "no setting where free-lunch and a memory-saving method both ran\n(add e.g. fl+ac to sweep.methods)"
        return _empty_figure(STUDY_PLOTS["memory_saving"][1], why, "nodes x GPUs", "GPU type")
    mean = ms.group_by("gpu", "nodes", "gpus_per_node", "world_size").agg(pl.col("gain").mean())
    rows = sorted(set(mean["gpu"].to_list()))
    cols = mean.select("nodes", "gpus_per_node", "world_size").unique().sort("world_size", "nodes").rows()
    got = {(r["gpu"], r["nodes"], r["gpus_per_node"]): r["gain"] for r in mean.iter_rows(named=True)}
    vals = [[got.get((g, n, k), math.nan) for n, k, _ in cols] for g in rows]
    texts = [["" if math.isnan(v) else f"{v:.0%}" for v in line] for line in vals]
    return _heatmap(title, rows, [f"{n}x{k}" for n, k, _ in cols], vals, texts, "nodes x GPUs", "GPU type", "RdYlGn",
                    -1.0, 1.0)  # fmt: skip


def figure_whatif(w: pl.DataFrame) -> Figure:
    """One bar per prediction (central days), the optimistic-pessimistic band as an error bar, the measurement of
    the same setting (where there is one) as a black dot."""
    from matplotlib.lines import Line2D

    title = STUDY_PLOTS["whatif"][1] + " (PREDICTIONS; dot: measured)"
    shown = w.filter(pl.col("days_optimistic").is_not_null()).sort("model", "gpu", "world_size", "nodes")
    n = shown.height
    if n > MAX_BARS:
        shown = shown.head(MAX_BARS)
        title += f"\n(first {MAX_BARS} of {n}; all in tables/whatif.csv)"
    if shown.is_empty():
        return _empty_figure(title, "no prediction: see tables/whatif.md for why", "days to train", "")
    rows = list(shown.iter_rows(named=True))
    kinds = ["predicted from your cells", "predicted from public evidence", "bound only", "measured"]
    tag = {"your cells": "", "public evidence": "  (public)"}
    labels = [f"{r['model']}  {_setting(r)}  {r['method'] or r['status']}{tag.get(r.get('evidence') or '', '')}"
              for r in rows]  # fmt: skip
    left = 0.4 + CHAR_IN * max(len(x) for x in labels)
    right = _legend_width("", kinds)
    fig = _canvas(max(left + 6 + right, 0.4 + TITLE_CHAR_IN * 0.9 * len(title.split("\n")[0])),
                  min(60, 1.4 + 0.2 * max(4, len(rows))))  # fmt: skip
    ax = fig.subplots()
    _margins(fig, left, right, 0.55, 0.7 if "\n" in title else 0.45)
    central = [r["days_central"] or r["days_optimistic"] for r in rows]
    lo = [max(0.0, c - r["days_optimistic"]) for c, r in zip(central, rows, strict=True)]
    hi = [
        max(0.0, r["days_pessimistic"] - c) if r["days_pessimistic"] else 0.0
        for c, r in zip(central, rows, strict=True)
    ]
    colour = {"your cells": "#9ecae1", "public evidence": "#fdae6b"}
    colours = [colour.get(r.get("evidence") or "your cells", "#9ecae1") if r["status"] == "predicted" else "#d9d9d9"
               for r in rows]  # fmt: skip
    ax.barh(range(len(rows)), central, xerr=[lo, hi], color=colours, capsize=2, error_kw={"lw": 0.8})
    for i, r in enumerate(rows):
        if r["measured_days"]:
            ax.plot([r["measured_days"]], [i], "o", color="black", ms=3)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xlabel("days to train (bar: central; whisker: optimistic - pessimistic)")
    ax.set_title(title, fontsize=10)
    handles = [Line2D([], [], color=c, lw=6) for c in ("#9ecae1", "#fdae6b", "#d9d9d9")]
    handles.append(Line2D([], [], marker="o", ls="", color="black", ms=3))
    ax.legend(handles, kinds, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    return fig


def figures(tables: dict[str, str]) -> dict[str, Figure]:
    """Every study plot as a Figure, keyed as STUDY_PLOTS (tables: keys as study.table_files + whatif)."""
    return {
        "study_days": figure_study_days(_read(tables, "days_optimal")),
        "gpu_days": figure_gpu_days(_read(tables, "gpu_days")),
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
