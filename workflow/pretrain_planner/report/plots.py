"""Plots from the tables (PNG + SVG), each readable on its own (report/document.py gathers them into
results/report.md).

Each plot is a `figure_*` function that builds a matplotlib Figure from a table, so that tests can measure its
text boxes (tests/test_plots_layout.py), and a `plot_*` function that saves it. Figures live on matplotlib's
Agg canvas, never pyplot's: no GUI back-end, no global list of open figures. Margins are fixed in inches from
the labels' lengths (tight_layout measures every tick label and takes seconds on a large sweep). Imports no
torch."""

from __future__ import annotations

import math
import random
import textwrap
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from pretrain_planner.planning.configtypes import CostsSection
from pretrain_planner.results import atomic_savefig, atomic_write_text
from pretrain_planner.tables import costs as pp_costs
from pretrain_planner.tables import units
from pretrain_planner.tables.aggregate import GROUP, VERDICTS, read_table

if TYPE_CHECKING:
    from collections.abc import Iterable

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

PLOTS = {
    "days": ("days_to_train", "Days to train with the fastest method that fits"),
    "methods": ("step_time_by_method", "Step time by method"),
    "cost_days": ("cost_vs_days", "Cost vs days to train, per model"),
    "feasibility": ("feasibility_map", "What fits where"),
    "mfu": ("mfu_by_method", "MFU by method"),
}
MAX_BARS = 150  # bar charts show at most this many bars (the tables hold them all)
MAX_FRONT_LABELS = 15  # a cost panel labels its Pareto points only up to this many (then the front speaks alone)
VERDICT_COLOURS = {
    "naive": "#1a9850",
    "free-lunch": "#91cf60",
    "other method": "#fee08b",
    "out of memory": "#d73027",
    "unsupported": "#fc8d59",
    "not measured": "#d9d9d9",
    "invalid": "#ffffff",
}
DPI = 100
MAX_LEGEND = 12  # a bar chart's legend lists at most this many methods
MAX_WIDTH = 30  # inches: a wider bar chart turns its labels upright (one line each) instead
CHAR_IN = 0.06  # width of a character at font size 7, inches (for fixed margins)
TITLE_CHAR_IN = 0.1  # the same at the default title / legend-title size (10-12 pt)


def plot_files(folder: str, plots: dict[str, tuple[str, str]] = PLOTS) -> dict[str, str]:
    """{key}_png / {key}_svg -> folder/{stem}.png / .svg for each plot of `plots`."""
    return {f"{key}_{ext}": f"{folder}/{stem}.{ext}" for key, (stem, _) in plots.items() for ext in ("png", "svg")}


# -------------------------------------------------------------------------------------------- helpers


def _canvas(width: float, height: float) -> Figure:
    """An empty Figure on the Agg canvas (inches)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, out: dict[str, str], key: str) -> None:
    """PNG and SVG, each written to a temporary name and renamed: a reader never sees half a file."""
    for ext in ("png", "svg"):
        atomic_savefig(fig, out[f"{key}_{ext}"], DPI)


def _margins(fig: Figure, left: float, right: float, bottom: float, top: float) -> None:
    """Margins in inches."""
    width, height = fig.get_size_inches()
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height)


def _legend_width(title: str, labels: Iterable[str], fontsize: float = 7) -> float:
    """Inches a legend outside the axes needs: its title, or a handle and the longest label, and padding."""
    longest = max((len(x) for line in labels for x in line.split("\n")), default=0)
    return max(TITLE_CHAR_IN * len(title), 0.45 + CHAR_IN * fontsize / 7 * longest) + 0.3


def _empty(ax: Axes, title: str, message: str, xlabel: str = "", ylabel: str = "") -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=9, transform=ax.transAxes)


def _empty_figure(title: str, message: str, xlabel: str, ylabel: str) -> Figure:
    """A labelled figure that says why there is nothing to draw (instead of no file, or a blank one)."""
    fig = _canvas(7, 4.5)
    _empty(fig.subplots(), title, message, xlabel, ylabel)
    fig.tight_layout()  # one axes and no ticks: cheap
    return fig


def _setting(row: dict) -> str:
    return f"{row['gpu']} {row['nodes']}x{row['gpus_per_node']}"


def gpu_colours(names: Iterable[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {g: cmap(i % 10) for i, g in enumerate(sorted(set(names)))}


def _vertical_ticks(ax: Axes, names: list[str], fontsize: float = 7) -> None:
    """Method names under a box plot, read bottom to top: slanted names' boxes overlap their neighbours'."""
    rotate = len(names) > 6
    ax.set_xticks(range(1, len(names) + 1), names, rotation=90 if rotate else 0, fontsize=fontsize)


def _patches(colours: dict[str, Any]) -> list:
    from matplotlib.patches import Rectangle

    return [Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="grey") for c in colours.values()]


# ------------------------------------------------------------------------------------------ days, methods


def figure_days(ttt: pl.DataFrame) -> Figure:
    """One horizontal bar per setting (its fastest method), grouped by model; colour = GPU type. The legend
    sits outside the axes and the value labels inside (head-room on the right), so neither covers the other."""
    title = PLOTS["days"][1]
    shown = ttt.filter(pl.col("training_days").is_not_null()).sort("model", "gpu", "world_size", "nodes")
    n = shown.height
    if n > MAX_BARS:
        shown = shown.head(MAX_BARS)
        title += f"\n(first {MAX_BARS} of {n} settings; all in tables/time_to_train.csv)"
    labels = [f"{r['model']}  {_setting(r)}  {r['best_method']}" for r in shown.iter_rows(named=True)]
    left = 0.4 + CHAR_IN * max((len(x) for x in labels), default=10)
    colours = gpu_colours(shown["gpu"])
    right = _legend_width("GPU type", colours) if colours else 0.3
    fig = _canvas(left + 7 + right, min(60, 1.3 + 0.22 * max(4, shown.height)))
    ax = fig.subplots()
    _margins(fig, left, right, 0.55, 0.7 if "\n" in title else 0.45)
    if shown.is_empty():
        _empty(ax, title, "no setting has a measured time to train yet", xlabel="days to train")
        return fig
    days = shown["training_days"].to_list()
    per, unit = units.duration_unit(days)  # tiny models' minutes are drawn in minutes, not as 1e-3 days
    ax.barh(range(shown.height), [d / per for d in days], color=[colours[g] for g in shown["gpu"].to_list()])
    ax.set_yticks(range(shown.height), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"time to train, {unit} (recipe steps x median step)")
    ax.set_title(title)
    if min(days) > 0 and max(days) / min(days) > 100:
        ax.set_xscale("log")
        ax.minorticks_off()
    if len(days) <= 60:
        ax.margins(x=0.1)  # room for the value at the end of the longest bar, inside the axes
        for i, d in enumerate(days):
            ax.text(d / per, i, f" {units.days(d)}", va="center", fontsize=6)
    ax.legend(_patches(colours), list(colours), title="GPU type", fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1), borderaxespad=0)  # fmt: skip
    ax.grid(True, axis="x", alpha=0.2)
    return fig


def figure_methods(cells: pl.DataFrame) -> Figure:
    """Median step per method with the p10-p90 spread; with many cells, each method's step time relative
    to the fastest method of the same setting instead (a box per method)."""
    ok = cells.filter(pl.col("status") == "ok").sort("model", "gpu", "nodes", "gpus_per_node", "method")
    if ok.is_empty():
        return _empty_figure(PLOTS["methods"][1], "no cell has run successfully yet", "",
                             "seconds per optimizer step")  # fmt: skip
    fig = _method_bars(ok) if ok.height <= 100 else _method_boxes(ok)
    fig.tight_layout()
    return fig


def _method_bars(ok: pl.DataFrame) -> Figure:
    """One bar per cell, labelled model / setting / method; each bar as wide as its longest label line."""
    from matplotlib import colormaps

    rows = list(ok.iter_rows(named=True))
    labels = [f"{r['model']}\n{_setting(r)}\n{r['method']}" for r in rows]
    per_bar = max(0.5, 0.1 + CHAR_IN * 6 / 7 * max(len(x) for lab in labels for x in lab.split("\n")))
    upright = per_bar * len(rows) <= MAX_WIDTH
    if not upright:  # too wide with three-line labels: one line each, read bottom to top
        labels = [lab.replace("\n", "  ") for lab in labels]
    longest = max(len(lab) for lab in labels)
    fig = _canvas(max(6, per_bar * len(rows) if upright else 0.22 * len(rows)),
                  5 if upright else 5 + CHAR_IN * 6 / 7 * longest)  # fmt: skip
    ax = fig.subplots()
    method_names = sorted(set(ok["method"].to_list()))
    colours = {m: colormaps["tab20"](i % 20) for i, m in enumerate(method_names)}
    med = [r["step_time_s"] for r in rows]
    err = [
        [max(0.0, r["step_time_s"] - (r["step_time_p10_s"] or r["step_time_s"])) for r in rows],
        [max(0.0, (r["step_time_p90_s"] or r["step_time_s"]) - r["step_time_s"]) for r in rows],
    ]
    ax.bar(range(len(rows)), med, yerr=err, color=[colours[r["method"]] for r in rows], capsize=2)
    ax.set_xticks(range(len(rows)), labels, fontsize=6, rotation=0 if upright else 90)
    ax.set_ylabel("seconds per optimizer step (median, p10-p90)")
    ax.set_title(PLOTS["methods"][1])
    if min(med) > 0 and max(med) / min(med) > 100:
        ax.set_yscale("log")
    if 1 < len(colours) <= MAX_LEGEND:  # more methods: the labels name them, a legend would outgrow the plot
        ax.legend(_patches(colours), list(colours), title="method", fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.01, 1), borderaxespad=0)  # fmt: skip
    return fig


def _method_boxes(ok: pl.DataFrame) -> Figure:
    """Many cells: per method, the step time over the fastest method of the same setting (1 = the fastest)."""
    method_names = sorted(set(ok["method"].to_list()))
    rel = ok.with_columns((pl.col("step_time_s") / pl.col("step_time_s").min().over(GROUP)).alias("rel"))
    data = [rel.filter(pl.col("method") == m)["rel"].to_list() for m in method_names]
    fig = _canvas(min(40, max(6, 0.45 * len(method_names))), 5 + CHAR_IN * max(len(m) for m in method_names))
    ax = fig.subplots()
    ax.boxplot(data, showfliers=True)
    _vertical_ticks(ax, method_names)
    ax.set_ylabel("step time / fastest method of the same setting")
    ax.set_yscale("log")
    ax.set_title(f"{PLOTS['methods'][1]}: {ok.height} cells, relative to the best of each setting")
    return fig


# -------------------------------------------------------------------------------------------- cost vs days


@dataclass(frozen=True)
class CostAxis:
    """Which cost a cost-vs-days figure plots: the costs.csv column and its axis label."""

    kind: str  # hardware | amortised | cloud
    years: float

    @property
    def column(self) -> str:
        return f"{self.kind}_usd"

    @property
    def label(self) -> str:
        return {
            "hardware": "hardware purchase price (USD)",
            "amortised": f"amortised experiment cost (USD, {self.years:g}-year amortisation)",
            "cloud": "cloud cost (USD)",
        }[self.kind]


def _size(gpus: int) -> float:
    """Marker area for a GPU count."""
    return 25 + 18 * gpus


def figure_cost_days(costs: pl.DataFrame, kind: str, years: float) -> Figure:
    """One panel per model: each setting's fastest method at (days, cost), the Pareto front as a step line.
    A figure-level legend (colour: GPU type; size: GPU count) to the right, the title above every panel."""
    axis = CostAxis(kind, years)
    timed = costs.filter(pl.col("training_days").is_not_null())
    priced = timed.filter(pl.col(axis.column).is_not_null())
    if priced.is_empty():
        return _no_cost_figure(timed, axis)
    models = sorted(set(timed["model"].to_list()))
    colours = gpu_colours(priced["gpu"])
    ncols = min(3, len(models))
    nrows = math.ceil(len(models) / ncols)
    handles = _cost_legend_handles(colours, sorted(set(priced["world_size"].to_list())))
    legend_title = "colour: GPU type\nsize: GPU count"
    right = _legend_width("size: GPU count", [h.get_label() for h in handles]) + 0.2
    fig = _canvas(5.5 * ncols + right, 4.2 * nrows + 0.4)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    # fixed margins: tight_layout over many log-scaled panels takes seconds; the title gets its own band
    width, height = fig.get_size_inches()
    fig.subplots_adjust(left=1.0 / width, right=1 - right / width, bottom=0.6 / height, top=1 - 1.0 / height,
                        wspace=0.35, hspace=0.45)  # fmt: skip
    per, unit = units.duration_unit(priced["training_days"].to_list())
    for ax, model in zip(axes.flat, models, strict=False):
        mine = priced.filter(pl.col("model") == model).sort("training_days")
        unpriced = timed.filter((pl.col("model") == model) & pl.col(axis.column).is_null()).height
        _cost_panel(ax, model, mine, unpriced, axis, colours, (per, unit))
    for ax in list(axes.flat)[len(models) :]:
        ax.axis("off")
    fig.legend(handles=handles, loc="upper right", bbox_to_anchor=(1 - 0.1 / width, 1 - 0.1 / height), fontsize=7,
               title=legend_title, title_fontsize=8)  # fmt: skip
    fig.suptitle(f"{PLOTS['cost_days'][1]} (best method per setting; {kind} cost)", y=1 - 0.2 / height, va="top")
    return fig


def _no_cost_figure(timed: pl.DataFrame, axis: CostAxis) -> Figure:
    """Nothing priced: say which prices are missing (costs.csv's cost_note) rather than draw an empty grid."""
    notes = sorted({n for note in timed["cost_note"].drop_nulls().to_list() for n in note.split("; ")})
    if axis.kind != "cloud":
        notes = [n for n in notes if "cloud_usd_per_gpu_hour" not in n]
    msg = f"no setting with a known {axis.kind} cost"
    if not timed.is_empty():
        lines = [textwrap.fill(n, 70) for n in notes[:4]] + (["..."] if len(notes) > 4 else [])
        msg += " and a time to train:\n" + "\n".join(lines) + "\n(fill in the prices)"
    return _empty_figure(PLOTS["cost_days"][1], msg, "days to train (log)", axis.label)


def _cost_legend_handles(colours: dict[str, Any], counts: list[int]) -> list:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", ls="", color=c, label=g) for g, c in colours.items()]
    handles += [Line2D([], [], marker="o", ls="", color="grey", markersize=math.sqrt(_size(n)), label=f"{n} GPUs")
                for n in counts[:6]]  # fmt: skip
    handles.append(Line2D([], [], color="black", lw=1, label="Pareto front"))
    return handles


def _cost_panel(ax: Axes, model: str, mine: pl.DataFrame, unpriced: int, axis: CostAxis, colours: dict,
                time_unit: tuple[float, str] = (1.0, "days")) -> None:  # fmt: skip
    """One model's settings; the Pareto points labelled where a label fits."""
    col = axis.column
    per, unit = time_unit
    ax.set_title(model)
    ax.set_xlabel(f"time to train, {unit}")
    ax.set_ylabel(axis.label, fontsize=8)
    if mine.is_empty():
        _empty(ax, model, f"{unpriced} settings, none with a known {axis.kind} cost", f"time to train, {unit} (log)",
               axis.label)  # fmt: skip
        return
    ax.scatter(
        [d / per for d in mine["training_days"].to_list()],
        mine[col].to_list(),
        s=[_size(n) for n in mine["world_size"].to_list()],
        c=[colours[g] for g in mine["gpu"].to_list()],
        alpha=0.8,
        edgecolors=["black" if p else "none" for p in mine["pareto"].to_list()],
        zorder=3,
    )
    front = mine.filter(pl.col("pareto")).sort("training_days")
    if front.height:
        ax.step([d / per for d in front["training_days"].to_list()], front[col].to_list(), where="post",
                color="black", lw=1, zorder=2, label="Pareto front")  # fmt: skip
    days = [d for d in mine["training_days"].to_list() if d > 0]
    if days and max(days) / min(days) > 3:  # within a factor 3 a log axis would show no tick at all
        ax.set_xscale("log")
    vals = [v for v in mine[col].to_list() if v > 0]
    if vals and max(vals) / min(vals) > 10:
        ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: units.usd(v)))  # money as the tables write it
    ax.minorticks_off()  # log axes' minor ticks cost most of the drawing time of a large sweep
    ax.grid(True, alpha=0.2)
    avoid = []
    if unpriced:
        note = ax.text(0.02, 0.02, f"+{unpriced} settings without a price (costs.csv: cost_note)", fontsize=6,
                       transform=ax.transAxes)  # fmt: skip
        avoid.append(note.get_window_extent(ax.figure.canvas.get_renderer()))
    if 0 < front.height <= MAX_FRONT_LABELS:
        points = [(r["training_days"] / per, r[col], _setting(r)) for r in front.iter_rows(named=True)]
        _label_points(ax, points, avoid)


# (offset in points, horizontal and vertical alignment) tried in turn for a point's label
LABEL_SPOTS = [((4, 3), "left", "bottom"), ((4, -3), "left", "top"), ((-4, 3), "right", "bottom"),
               ((-4, -3), "right", "top")]  # fmt: skip
LABEL_BOX = {"boxstyle": "square,pad=0.1", "facecolor": "white", "alpha": 0.7, "linewidth": 0}  # over markers


def _label_points(ax: Axes, points: list[tuple[float, float, str]], avoid: list[Bbox]) -> int:
    """Label each point at the first of LABEL_SPOTS where the label stays inside the axes and clears every label
    placed so far (and `avoid`); a point with no such spot stays unlabelled (its colour and size still say it).
    Measures real text extents, so the axes' position, scales and limits must be final. Returns labels placed."""
    renderer = ax.figure.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    placed = list(avoid)
    for x, y, text in points:
        for offset, ha, va in LABEL_SPOTS:
            label = ax.annotate(text, (x, y), xytext=offset, textcoords="offset points", fontsize=6, ha=ha, va=va,
                                zorder=4, bbox=LABEL_BOX)  # fmt: skip
            box = label.get_window_extent(renderer)
            fits = inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
            if fits and not any(_boxes_meet(box, other) for other in placed):
                placed.append(box)
                break
            label.remove()
    return len(placed) - len(avoid)


def _boxes_meet(a: Bbox, b: Bbox, pad: float = 1.0) -> bool:
    return a.x0 < b.x1 + pad and b.x0 < a.x1 + pad and a.y0 < b.y1 + pad and b.y0 < a.y1 + pad


# ------------------------------------------------------------------------------------------- feasibility


def figure_feasibility(feas: pl.DataFrame) -> Figure:
    """Rows model / GPU type, columns the GPU count, colour the verdict, text the fastest method. Cells are
    sized to fill the figure (a small sweep gets large cells, not a stamp in a blank canvas); the title spans
    the figure (over the axes it ran into the y label) and the legend sits right of the map, as wide as it needs."""
    title = f"{PLOTS['feasibility'][1]} (text: the fastest method that fits)"
    if feas.is_empty():
        return _empty_figure(title, "no settings in the plan", "nodes x GPUs per node", "model / GPU type")
    order = list(VERDICTS)
    rows = feas.select("model", "gpu").unique().sort("model", "gpu").rows()
    cols = feas.select("nodes", "gpus_per_node", "world_size").unique().sort("world_size", "nodes").rows()
    grid, labels = _verdict_grid(feas, rows, cols, order)
    present = [v for v in order if v in set(feas["verdict"].to_list())]
    names = [textwrap.fill(VERDICTS[v], 30) for v in present]
    left = 0.6 + CHAR_IN * max(len(f"{m} / {g}") for m, g in rows)
    right = _legend_width("", names) + 0.1
    cell_w = min(2.0, max(1.1, 6.0 / len(cols)))
    cell_h = min(1.0, max(0.25, 3.0 / len(rows)))
    map_h = min(40, cell_h * len(rows))
    # as wide as the cells want or the title needs; any extra width widens the map, not a blank margin
    width = max(left + min(24, cell_w * len(cols)) + right, 0.2 + TITLE_CHAR_IN * 1.2 * len(title))
    fig = _canvas(width, map_h + 1.2)
    ax = fig.subplots()
    _margins(fig, left, right, 0.6, 0.6)
    _draw_verdicts(ax, grid, order)
    fontsize = 8 if (width - left - right) / len(cols) >= 1.5 else 6  # "fl+ac+fsdp-full+off" is ~1.2 in at 8 pt
    if len(rows) * len(cols) <= 600:
        for (i, j), text in labels.items():
            ax.text(j, i, text, ha="center", va="center", fontsize=fontsize)
    ax.set_xticks(range(len(cols)), [f"{n}x{g}" for n, g, _ in cols], fontsize=8)
    ax.set_yticks(range(len(rows)), [f"{m} / {g}" for m, g in rows], fontsize=7)
    ax.set_xlabel("nodes x GPUs per node")
    ax.set_ylabel("model / GPU type")
    fig.suptitle(title, y=1 - 0.15 / fig.get_size_inches()[1], va="top")
    handles = _patches({v: VERDICT_COLOURS[v] for v in present})
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0, fontsize=7)
    return fig


def _verdict_grid(
    feas: pl.DataFrame, rows: list[tuple], cols: list[tuple], order: list[str]
) -> tuple[list[list[float]], dict[tuple[int, int], str]]:
    """The verdict index of each (row, column) (NaN: not in the plan) and the fastest method's name."""
    ri = {r: i for i, r in enumerate(rows)}
    ci = {c[:2]: j for j, c in enumerate(cols)}
    grid = [[math.nan] * len(cols) for _ in rows]
    labels: dict[tuple[int, int], str] = {}
    for r in feas.iter_rows(named=True):
        i, j = ri[(r["model"], r["gpu"])], ci[(r["nodes"], r["gpus_per_node"])]
        grid[i][j] = order.index(r["verdict"])
        labels[(i, j)] = r["best_method"] or ""
    return grid, labels


def _draw_verdicts(ax: Axes, grid: list[list[float]], order: list[str]) -> None:
    import numpy as np
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap([VERDICT_COLOURS[v] for v in order]).with_extremes(bad="#f0f0f0")
    ax.imshow(np.ma.masked_invalid(np.array(grid, dtype=float)), cmap=cmap, vmin=-0.5, vmax=len(order) - 0.5,
              aspect="auto", interpolation="nearest")  # fmt: skip


# --------------------------------------------------------------------------------------------------- MFU


def figure_mfu(cells: pl.DataFrame) -> Figure:
    """A box per method of the MFU of the cells that ran, each cell a dot coloured by GPU type."""
    title = PLOTS["mfu"][1]
    ok = cells.filter((pl.col("status") == "ok") & ~pl.col("suspect").fill_null(False) & pl.col("mfu").is_not_null())
    if ok.is_empty():
        why = (
            "no MFU known: no cell that ran has a dense peak\n"
            "(a GPU type without peak_tflops in the catalog,\nor cpu results from before its peak was measured)"
        )
        return _empty_figure(title, why, "method", "MFU (% of the dense peak)")
    method_names = sorted(set(ok["method"].to_list()))
    colours = gpu_colours(ok["gpu"])
    fig = _canvas(min(40, max(7, 0.5 * len(method_names))), 5.5)
    ax = fig.subplots()
    data = [[v * 100 for v in ok.filter(pl.col("method") == m)["mfu"].to_list()] for m in method_names]
    ax.boxplot(data, showfliers=False)
    rng = random.Random(0)
    for i, m in enumerate(method_names, start=1):
        sub = ok.filter(pl.col("method") == m)
        ax.scatter([i + rng.uniform(-0.2, 0.2) for _ in range(sub.height)], [v * 100 for v in sub["mfu"].to_list()],
                   c=[colours[g] for g in sub["gpu"].to_list()], s=12, alpha=0.7, zorder=3,
                   rasterized=sub.height > 200)  # fmt: skip
    _vertical_ticks(ax, method_names)
    ax.set_xlabel("method")
    measured = "peak_kind" in ok.columns and (ok["peak_kind"] == "measured").any()
    ax.set_ylabel("MFU (% of the dense peak" + ("; cpu: a peak measured\non the host, not a datasheet)" if measured
                                               else ")"))  # fmt: skip
    ax.set_title(f"{title} (cells that ran, suspect timings excluded; dots coloured by GPU type)", fontsize=9)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", ls="", color=c) for c in colours.values()]
    ax.legend(handles, list(colours), title="GPU type", fontsize=7)
    longest = max(len(m) for m in method_names)
    _margins(fig, 0.8, 0.2, 0.7 + (CHAR_IN * longest if len(method_names) > 6 else 0.2), 0.45)
    return fig


# ------------------------------------------------------------------------------------------ the plots rule


def plot_cost_days(costs: pl.DataFrame, out: dict[str, str], kind: str, years: float) -> None:
    _save(figure_cost_days(costs, kind, years), out, "cost_days")


def plot_mfu(cells: pl.DataFrame, out: dict[str, str]) -> None:
    _save(figure_mfu(cells), out, "mfu")


def figures(tables: dict[str, str], costs: CostsSection | None = None) -> dict[str, Figure]:
    """Every plot as a Figure, keyed as PLOTS, from the table files (keys as aggregate.table_files; `costs`: the
    config's section, typed: the cost plot's axis and amortisation; None: the schema's defaults)."""
    conf = pp_costs.typed(costs, "report.plots.figures")
    cells = pl.read_parquet(tables["cells_parquet"])
    return {
        "days": figure_days(read_table(tables["time_to_train_csv"])),
        "methods": figure_methods(cells),
        "cost_days": figure_cost_days(read_table(tables["costs_csv"]), conf.pareto_cost, conf.amortisation_years),
        "feasibility": figure_feasibility(read_table(tables["feasibility_csv"])),
        "mfu": figure_mfu(cells),
    }


def make_plots(tables: dict[str, str], out: dict[str, str], log_path: str, costs: CostsSection | None = None) -> None:
    """The `plots` rule: every plot from the tables (keys as aggregate.table_files), PNG and SVG."""
    t0 = time.perf_counter()
    for key, fig in figures(tables, costs).items():
        _save(fig, out, key)
    cells = pl.read_parquet(tables["cells_parquet"], columns=["status"])
    settings = read_table(tables["time_to_train_csv"]).height
    atomic_write_text(
        log_path,
        f"plotted {settings} settings, {cells.filter(pl.col('status') == 'ok').height} ok cells "
        f"({time.perf_counter() - t0:.2f} s)\n",
    )
