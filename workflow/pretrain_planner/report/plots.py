"""Plots from the tables (PNG + SVG), each readable on its own (report/document.py gathers them into
results/report.md). matplotlib (Agg) only; imports no torch."""

from __future__ import annotations

import math
import os
import textwrap
import time
from pathlib import Path
from typing import Any

import polars as pl

from pretrain_planner.results import atomic_write_text
from pretrain_planner.tables import costs as pp_costs
from pretrain_planner.tables.aggregate import GROUP, VERDICTS, read_table

PLOTS = {
    "days": ("days_to_train", "Days to train with the fastest method that fits"),
    "methods": ("step_time_by_method", "Step time by method"),
    "cost_days": ("cost_vs_days", "Cost vs days to train, per model"),
    "feasibility": ("feasibility_map", "What fits where"),
    "mfu": ("mfu_by_method", "MFU by method"),
}
MAX_BARS = 150  # bar charts show at most this many bars (the tables hold them all)
VERDICT_COLOURS = {
    "naive": "#1a9850",
    "free-lunch": "#91cf60",
    "other method": "#fee08b",
    "out of memory": "#d73027",
    "unsupported": "#fc8d59",
    "not measured": "#d9d9d9",
    "invalid": "#ffffff",
}


def plot_files(folder: str) -> dict[str, str]:
    files = {}
    for key, (stem, _) in PLOTS.items():
        files[f"{key}_png"] = f"{folder}/{stem}.png"
        files[f"{key}_svg"] = f"{folder}/{stem}.svg"
    return files


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: dict[str, str], key: str) -> None:
    plt = _plt()
    for ext in ("png", "svg"):
        path = Path(out[f"{key}_{ext}"])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp.{ext}")
        fig.savefig(tmp, dpi=100, format=ext)
        os.replace(tmp, path)
    plt.close(fig)


CHAR_IN = 0.06  # width of a character at font size 7, inches (for fixed margins)


def _margins(fig, left: float, right: float, bottom: float, top: float) -> None:
    """Margins in inches. tight_layout measures every tick label and takes seconds on a large sweep."""
    width, height = fig.get_size_inches()
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height)


def _empty(ax, title: str, message: str, xlabel: str = "", ylabel: str = "") -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=9, transform=ax.transAxes)


def _setting(row: dict) -> str:
    return f"{row['gpu']} {row['nodes']}x{row['gpus_per_node']}"


def gpu_colours(names) -> dict[str, Any]:
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    return {g: cmap(i % 10) for i, g in enumerate(sorted(set(names)))}


# ---------------------------------------------------------------------------------------------- plots


def plot_days(ttt: pl.DataFrame, out: dict[str, str]) -> None:
    """One horizontal bar per setting (its fastest method), grouped by model; colour = GPU type."""
    plt = _plt()
    title = PLOTS["days"][1]
    shown = ttt.filter(pl.col("training_days").is_not_null()).sort("model", "gpu", "world_size", "nodes")
    n = shown.height
    if n > MAX_BARS:
        shown = shown.head(MAX_BARS)
        title += f"\n(first {MAX_BARS} of {n} settings; all in tables/time_to_train.csv)"
    labels = [f"{r['model']}  {_setting(r)}  {r['best_method']}" for r in shown.iter_rows(named=True)]
    left = 0.4 + CHAR_IN * max((len(x) for x in labels), default=10)
    fig, ax = plt.subplots(figsize=(left + 7, min(60, 1.3 + 0.22 * max(4, shown.height))))
    if shown.is_empty():
        _empty(ax, title, "no setting has a measured time to train yet", xlabel="days to train")
    else:
        colours = gpu_colours(shown["gpu"])
        rows = list(shown.iter_rows(named=True))
        days = [r["training_days"] for r in rows]
        y = range(len(rows))
        ax.barh(y, days, color=[colours[r["gpu"]] for r in rows])
        ax.set_yticks(y, labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("days to train (recipe steps x median step)")
        ax.set_title(title)
        if min(days) > 0 and max(days) / min(days) > 100:
            ax.set_xscale("log")
            ax.minorticks_off()
        if len(days) <= 60:
            for i, d in enumerate(days):
                ax.text(d, i, f" {d:.3g}", va="center", fontsize=6)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
        ax.legend(handles, list(colours), title="GPU type", fontsize=7, loc="lower right")
        ax.grid(True, axis="x", alpha=0.2)
    _margins(fig, left, 0.3, 0.55, 0.7 if "\n" in title else 0.45)
    _save(fig, out, "days")


def plot_methods(cells: pl.DataFrame, out: dict[str, str]) -> None:
    """Median step per method with the p10-p90 spread; with many cells, each method's step time relative
    to the fastest method of the same setting instead (a box per method)."""
    plt = _plt()
    ok = cells.filter(pl.col("status") == "ok").sort("model", "gpu", "nodes", "gpus_per_node", "method")
    method_names = sorted(set(ok["method"].to_list()))
    cmap = plt.get_cmap("tab20")
    colours = {m: cmap(i % 20) for i, m in enumerate(method_names)}
    if ok.height <= 100:
        fig, ax = plt.subplots(figsize=(min(40, max(6, 0.5 * max(1, ok.height))), 5))
        if ok.is_empty():
            _empty(ax, PLOTS["methods"][1], "no cell has run successfully yet",
                   ylabel="seconds per optimizer step")  # fmt: skip
        else:
            rows = list(ok.iter_rows(named=True))
            med = [r["step_time_s"] for r in rows]
            err = [
                [max(0.0, r["step_time_s"] - (r["step_time_p10_s"] or r["step_time_s"])) for r in rows],
                [max(0.0, (r["step_time_p90_s"] or r["step_time_s"]) - r["step_time_s"]) for r in rows],
            ]
            ax.bar(range(len(rows)), med, yerr=err, color=[colours[r["method"]] for r in rows], capsize=2)
            ax.set_xticks(range(len(rows)), [f"{r['model']}\n{_setting(r)}\n{r['method']}" for r in rows], fontsize=6)
            ax.set_ylabel("seconds per optimizer step (median, p10-p90)")
            ax.set_title(PLOTS["methods"][1])
            if len(colours) > 1:
                handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
                ax.legend(handles, list(colours), title="method", fontsize=7)
    else:
        rel = ok.with_columns((pl.col("step_time_s") / pl.col("step_time_s").min().over(GROUP)).alias("rel"))
        data = [rel.filter(pl.col("method") == m)["rel"].to_list() for m in method_names]
        fig, ax = plt.subplots(figsize=(min(40, max(6, 0.6 * len(method_names))), 5))
        ax.boxplot(data, showfliers=True)
        ax.set_xticks(range(1, len(method_names) + 1), method_names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("step time / fastest method of the same setting")
        ax.set_yscale("log")
        ax.set_title(f"{PLOTS['methods'][1]}: {ok.height} cells, relative to the best of each setting")
    fig.tight_layout()
    _save(fig, out, "methods")


def plot_cost_days(costs: pl.DataFrame, out: dict[str, str], kind: str, years: float) -> None:
    plt = _plt()
    from matplotlib.lines import Line2D

    col = f"{kind}_usd"
    ylabel = {
        "hardware": "hardware purchase price (USD)",
        "amortised": f"amortised experiment cost (USD, {years:g}-year amortisation)",
        "cloud": "cloud cost (USD)",
    }[kind]
    timed = costs.filter(pl.col("training_days").is_not_null())
    priced = timed.filter(pl.col(col).is_not_null())
    if priced.is_empty():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        notes = sorted({n for note in timed["cost_note"].drop_nulls().to_list() for n in note.split("; ")})
        if kind != "cloud":
            notes = [n for n in notes if "cloud_usd_per_gpu_hour" not in n]
        msg = f"no setting with a known {kind} cost"
        if not timed.is_empty():
            lines = [textwrap.fill(n, 70) for n in notes[:4]] + (["..."] if len(notes) > 4 else [])
            msg += " and a time to train:\n" + "\n".join(lines) + "\n(fill in the prices)"
        _empty(ax, PLOTS["cost_days"][1], msg, "days to train (log)", ylabel)
        fig.tight_layout()
        _save(fig, out, "cost_days")
        return
    models = sorted(set(timed["model"].to_list()))
    ncols = min(3, len(models))
    nrows = math.ceil(len(models) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4.2 * nrows), squeeze=False)
    colours = gpu_colours(priced["gpu"])
    counts = sorted(set(priced["world_size"].to_list()))

    def size(n: int) -> float:
        return 25 + 18 * n

    for ax, model in zip(axes.flat, models, strict=False):
        mine = priced.filter(pl.col("model") == model).sort("training_days")
        unpriced = timed.filter((pl.col("model") == model) & pl.col(col).is_null()).height
        ax.set_title(model)
        ax.set_xlabel("days to train (log)")
        ax.set_ylabel(ylabel, fontsize=8)
        if mine.is_empty():
            _empty(ax, model, f"{unpriced} settings, none with a known {kind} cost", "days to train (log)", ylabel)
            continue
        ax.scatter(
            mine["training_days"].to_list(),
            mine[col].to_list(),
            s=[size(n) for n in mine["world_size"].to_list()],
            c=[colours[g] for g in mine["gpu"].to_list()],
            alpha=0.8,
            edgecolors=["black" if p else "none" for p in mine["pareto"].to_list()],
            zorder=3,
        )
        front = mine.filter(pl.col("pareto")).sort("training_days")
        if front.height:
            ax.step(front["training_days"].to_list(), front[col].to_list(), where="post", color="black", lw=1,
                    zorder=2, label="Pareto front")  # fmt: skip
            for r in front.iter_rows(named=True) if front.height <= 15 else []:
                ax.annotate(f"{r['world_size']}x{r['gpu']}", (r["training_days"], r[col]), fontsize=6,
                            xytext=(3, 3), textcoords="offset points")  # fmt: skip
        ax.set_xscale("log")
        vals = [v for v in mine[col].to_list() if v > 0]
        if vals and max(vals) / min(vals) > 10:
            ax.set_yscale("log")
        ax.minorticks_off()  # log axes' minor ticks cost most of the drawing time of a large sweep
        if unpriced:
            ax.text(0.02, 0.02, f"+{unpriced} settings without a price (costs.csv: cost_note)", fontsize=6,
                    transform=ax.transAxes)  # fmt: skip
        ax.grid(True, alpha=0.2)
    for ax in list(axes.flat)[len(models) :]:
        ax.axis("off")
    handles = [Line2D([], [], marker="o", ls="", color=c, label=g) for g, c in colours.items()]
    handles += [Line2D([], [], marker="o", ls="", color="grey", markersize=math.sqrt(size(n)), label=f"{n} GPUs")
                for n in counts[:6]]  # fmt: skip
    handles.append(Line2D([], [], color="black", lw=1, label="Pareto front"))
    fig.legend(handles=handles, loc="upper right", fontsize=7, title="colour: GPU type; size: GPU count")
    fig.suptitle(f"{PLOTS['cost_days'][1]} (best method per setting; {kind} cost)")
    width, height = fig.get_size_inches()
    # fixed margins: tight_layout over many log-scaled panels takes seconds
    fig.subplots_adjust(left=1.0 / width, right=0.84, bottom=0.6 / height, top=1 - 0.7 / height, wspace=0.35,
                        hspace=0.45)  # fmt: skip
    _save(fig, out, "cost_days")


def plot_feasibility(feas: pl.DataFrame, out: dict[str, str]) -> None:
    plt = _plt()
    from matplotlib.colors import ListedColormap

    title = PLOTS["feasibility"][1]
    if feas.is_empty():
        fig, ax = plt.subplots(figsize=(6, 4))
        _empty(ax, title, "no settings in the plan", "nodes x GPUs per node", "model / GPU type")
        fig.tight_layout()
        _save(fig, out, "feasibility")
        return
    order = list(VERDICTS)
    rows = feas.select("model", "gpu").unique().sort("model", "gpu").rows()
    cols = feas.select("nodes", "gpus_per_node", "world_size").unique().sort("world_size", "nodes").rows()
    ri = {r: i for i, r in enumerate(rows)}
    ci = {c[:2]: j for j, c in enumerate(cols)}
    grid = [[math.nan] * len(cols) for _ in rows]
    labels: dict[tuple[int, int], str] = {}
    for r in feas.iter_rows(named=True):
        i, j = ri[(r["model"], r["gpu"])], ci[(r["nodes"], r["gpus_per_node"])]
        grid[i][j] = order.index(r["verdict"])
        labels[(i, j)] = r["best_method"] or ""
    left = 0.6 + CHAR_IN * max(len(f"{m} / {g}") for m, g in rows)
    legend = 3.9
    fig, ax = plt.subplots(figsize=(left + min(20, 1.0 * len(cols)) + legend, min(40, 1.4 + 0.25 * len(rows))))
    cmap = ListedColormap([VERDICT_COLOURS[v] for v in order]).with_extremes(bad="#f0f0f0")
    import numpy as np

    ax.imshow(np.ma.masked_invalid(np.array(grid, dtype=float)), cmap=cmap, vmin=-0.5, vmax=len(order) - 0.5,
              aspect="auto", interpolation="nearest")  # fmt: skip
    if len(rows) * len(cols) <= 600:
        for (i, j), text in labels.items():
            ax.text(j, i, text, ha="center", va="center", fontsize=6)
    ax.set_xticks(range(len(cols)), [f"{n}x{g}" for n, g, _ in cols], fontsize=8)
    ax.set_yticks(range(len(rows)), [f"{m} / {g}" for m, g in rows], fontsize=7)
    ax.set_xlabel("nodes x GPUs per node")
    ax.set_ylabel("model / GPU type")
    ax.set_title(f"{title} (text: the fastest method that fits)")
    present = [v for v in order if v in set(feas["verdict"].to_list())]
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=VERDICT_COLOURS[v], edgecolor="grey") for v in present]
    ax.legend(handles, [VERDICTS[v] for v in present], loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    _margins(fig, left, legend, 0.6, 0.45)
    _save(fig, out, "feasibility")


def plot_mfu(cells: pl.DataFrame, out: dict[str, str]) -> None:
    plt = _plt()
    title = PLOTS["mfu"][1]
    ok = cells.filter((pl.col("status") == "ok") & ~pl.col("suspect").fill_null(False) & pl.col("mfu").is_not_null())
    if ok.is_empty():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        _empty(ax, title, "no MFU known: the GPU types of these results declare no dense peak\n"
               "(e.g. the cpu stand-in of the default sweep)", "method", "MFU (% of the dense peak)")  # fmt: skip
        fig.tight_layout()
        _save(fig, out, "mfu")
        return
    method_names = sorted(set(ok["method"].to_list()))
    colours = gpu_colours(ok["gpu"])
    fig, ax = plt.subplots(figsize=(min(40, max(7, 0.7 * len(method_names))), 5.5))
    data = [[v * 100 for v in ok.filter(pl.col("method") == m)["mfu"].to_list()] for m in method_names]
    ax.boxplot(data, showfliers=False)
    import random

    rng = random.Random(0)
    for i, m in enumerate(method_names, start=1):
        sub = ok.filter(pl.col("method") == m)
        ax.scatter([i + rng.uniform(-0.2, 0.2) for _ in range(sub.height)], [v * 100 for v in sub["mfu"].to_list()],
                   c=[colours[g] for g in sub["gpu"].to_list()], s=12, alpha=0.7, zorder=3,
                   rasterized=sub.height > 200)  # fmt: skip
    ax.set_xticks(range(1, len(method_names) + 1), method_names, rotation=45 if len(method_names) > 6 else 0,
                  ha="right" if len(method_names) > 6 else "center", fontsize=7)  # fmt: skip
    ax.set_xlabel("method")
    ax.set_ylabel("MFU (% of the dense peak)")
    ax.set_title(f"{title} (cells that ran, suspect timings excluded; dots coloured by GPU type)", fontsize=9)
    handles = [plt.Line2D([], [], marker="o", ls="", color=c) for c in colours.values()]
    ax.legend(handles, list(colours), title="GPU type", fontsize=7)
    longest = max(len(m) for m in method_names)
    _margins(fig, 0.8, 0.2, 0.7 + (CHAR_IN * 0.75 * longest if len(method_names) > 6 else 0.2), 0.45)
    _save(fig, out, "mfu")


def make_plots(tables: dict[str, str], out: dict[str, str], log_path: str, costs_config: dict | None = None) -> None:
    """The `plots` rule: every plot from the tables (keys as aggregate.table_files)."""
    t0 = time.perf_counter()
    conf = pp_costs.settings(costs_config)
    cells = pl.read_parquet(tables["cells_parquet"])
    ttt = read_table(tables["time_to_train_csv"])
    feas = read_table(tables["feasibility_csv"])
    costs = read_table(tables["costs_csv"])
    plot_days(ttt, out)
    plot_methods(cells, out)
    plot_cost_days(costs, out, conf["pareto_cost"], conf["amortisation_years"])
    plot_feasibility(feas, out)
    plot_mfu(cells, out)
    atomic_write_text(
        log_path,
        f"plotted {ttt.height} settings, {cells.filter(pl.col('status') == 'ok').height} ok cells "
        f"({time.perf_counter() - t0:.2f} s)\n",
    )


# --------------------------------------------------------------------------------------------- report
