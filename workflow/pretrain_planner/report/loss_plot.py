"""The loss-equivalence check's curves (planning/losscheck.py): one panel per checked setting, each line a method's
loss minus its reference's (naive, or naive at the method's precision) per step, dashed for a precision change's
own line (naive at that precision minus naive), inside the reference's band: the running envelope of its legitimate
variants (another micro-batch split, another dropout seed, its twins at the model's other world sizes), shaded
around zero. The legend gives each line's verdict as loss_check.csv has it. Imports no torch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from pretrain_planner.planning import losscheck
from pretrain_planner.report.plots import CHAR_IN, _canvas, _empty_figure, _margins, _save

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LOSS_PLOTS = {"loss_check": ("loss_check_plot", "Each method's loss minus naive's, inside naive's band")}
MAX_PANELS = 12
COLUMNS = 3  # panels per row
ROLES = ("method", "precision")  # the table's lines that have a curve; `precision` dashed
SETTING = ("model", "gpu", "nodes", "gpus_per_node")
NO_CHECK = "no method was checked (tables/loss_check.md says why at each setting)"
NO_CURVE = "no curve to draw: every checked line is `not checked`, or its curves file is missing"
MAX_NOTE = 40  # characters of a `not checked` line's reason in the legend
AXES_H = 1.9  # inches: a panel's plot area
TICKS_H = 0.5  # inches under a panel: its step ticks and label
TITLE_H = 0.3  # inches over a panel: its setting
LEGEND_ROW_H = 0.17  # inches a legend line takes at font size 7
YLABEL = "loss minus reference's"
SYMLOG_OVER = 20  # a panel whose farthest line is this many bands away draws its y axis log beyond the band
Y_LEFT = 0.95  # inches left of a panel: the difference's tick labels (`%.2g`, at most 8 characters) and label


def _usable(run: dict[str, Any] | None) -> bool:
    """A run the check recorded a whole loss curve of (losscheck.judge_records uses the same)."""
    if not run or run.get("skipped") or run.get("error"):
        return False
    loss = run.get("loss")
    return isinstance(loss, list) and bool(loss) and all(v is not None for v in loss)


def _finite(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else math.nan


def _ident(rec: dict[str, Any]) -> tuple[Any, ...]:
    """Which settings' reference runs may widen each other's band: the same model, GPU type, batches, steps."""
    s, c = rec["setting"], rec.get("check") or {}
    return (s["model"], s["gpu"], c.get("global_batch"), c.get("seed"), c.get("steps"))


def _records(table: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """Each curves file the table names -> its record (unreadable files left out)."""
    out = {}
    for path in table["curves"].drop_nulls().unique(maintain_order=True).to_list():
        rec = losscheck.read(path) if Path(path).is_file() else None
        if rec is not None and "setting" in rec:
            out[path] = rec
    return out


def _twins(records: dict[str, dict[str, Any]]) -> dict[tuple[Any, ...], list[tuple[str, dict[str, Any]]]]:
    """(ident, run name) -> (setting folder, run) of every usable reference or precision run: a reference's
    twins at the model's other settings join its band, as losscheck.judge_records does."""
    refs: dict[tuple[Any, ...], list[tuple[str, dict[str, Any]]]] = {}
    for rec in records.values():
        for run in rec.get("runs") or []:
            if run.get("role") in ("reference", "precision") and _usable(run):
                refs.setdefault((*_ident(rec), run["name"]), []).append((losscheck.folder_of(rec), run))
    return refs


def _line(row: dict[str, Any], rec: dict[str, Any], refs: dict[tuple[Any, ...], list[Any]]) -> dict[str, Any] | None:
    """One table row's curve: the steps, the method's loss minus the reference's, the reference's band."""
    runs = {r.get("name"): r for r in rec.get("runs") or []}
    run, ref = runs.get(row["method"]), runs.get(row["against"])
    if not (_usable(run) and _usable(ref)):
        return None
    here = losscheck.folder_of(rec)
    variants = [r["loss"] for r in runs.values() if r.get("of") == row["against"] and _usable(r)]
    variants += [r["loss"] for f, r in refs.get((*_ident(rec), row["against"]), []) if f != here]
    n = min(len(run["loss"]), len(ref["loss"]))
    diff = [_finite(run["loss"][s]) - _finite(ref["loss"][s]) for s in range(n)]
    return {"steps": list(range(n)), "diff": diff, "band": losscheck.band(ref["loss"], variants)[:n],
            "band_runs": len(variants)}  # fmt: skip


def _label(row: dict[str, Any]) -> str:
    verdict = row["loss"] or losscheck.NOT_CHECKED
    if verdict == losscheck.NOT_CHECKED and row.get("note"):
        note = row["note"] if len(row["note"]) <= MAX_NOTE else row["note"][: MAX_NOTE - 3] + "..."
        verdict += f" ({note})"
    return f"{row['method']}: {verdict}"


def _panels(table: pl.DataFrame) -> list[tuple[dict[str, Any], list[tuple[dict[str, Any], dict[str, Any] | None]]]]:
    """(setting, [(row, its curve or None)]) of each setting with at least one curve to draw, in table order."""
    lines = table.filter(pl.col("role").is_in(ROLES))
    records = _records(lines)
    refs = _twins(records)
    out: dict[tuple[Any, ...], list[tuple[dict[str, Any], dict[str, Any] | None]]] = {}
    for row in lines.iter_rows(named=True):
        rec = records.get(row["curves"]) if row["curves"] else None
        out.setdefault(tuple(row[c] for c in SETTING), []).append((row, _line(row, rec, refs) if rec else None))
    return [(dict(zip(SETTING, k, strict=True)), rows) for k, rows in out.items() if any(c for _, c in rows)]


def _band_label(against: str, runs: int) -> str:
    return f"{against}'s band ({runs} run{'s' * (runs != 1)})"


def _entries(rows: list[tuple[dict[str, Any], Any]]) -> list[tuple[str, dict[str, Any], Any, str]]:
    """A panel's legend, in order: (what, row, curve, label); a reference's band once, before its first line."""
    out, shaded = [], set()
    for row, curve in rows:
        if curve is not None and row["against"] not in shaded:
            shaded.add(row["against"])
            out.append(("band", row, curve, _band_label(row["against"], curve["band_runs"])))
        out.append(("line" if curve is not None else "text", row, curve, _label(row)))
    return out


def _draw(ax: Axes, setting: dict[str, Any], rows: list[tuple[dict[str, Any], Any]], colours: dict[str, Any],
          legend_y: float) -> None:  # fmt: skip
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.axhline(0.0, color="#636363", linewidth=0.6)
    handles, drawn = [], 0
    for what, row, curve, label in _entries(rows):
        if what == "text":  # not checked: named in the legend, nothing drawn
            handles.append(Line2D([], [], linestyle="none", label=label))
        elif what == "band":  # naive's; naive at another precision's in orange
            colour = "#bdbdbd" if row["against"] == "naive" else "#fdd0a2"
            lo = [-w for w in curve["band"]]
            handles.append(ax.fill_between(curve["steps"], lo, curve["band"], color=colour, alpha=0.6, linewidth=0,
                                           label=label))  # fmt: skip
        else:
            style = "--" if row["role"] == "precision" else "-"
            width = max(0.8, 2.4 - 0.6 * drawn)  # each line thinner than the last: identical curves stay apart
            (line,) = ax.plot(curve["steps"], curve["diff"], style, color=colours[row["method"]], linewidth=width,
                              marker="o", markersize=1.5 + width, label=label)  # fmt: skip
            handles.append(line)
            drawn += 1
    ax.set_title(f"{setting['model']} {setting['gpu']} {setting['nodes']}x{setting['gpus_per_node']}", fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.set_ylabel(YLABEL, fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))
    widest = max(max(c["band"], default=0.0) for _, c in rows if c is not None)
    farthest = max((abs(d) for _, c in rows if c is not None for d in c["diff"] if math.isfinite(d)), default=0.0)
    if widest > 0 and farthest > SYMLOG_OVER * widest:  # a line far outside: the band stays visible, linear inside
        ax.set_yscale("symlog", linthresh=widest, linscale=1.0)
        ax.set_ylabel(YLABEL + "\n(log beyond the band)", fontsize=8)
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2g}"))  # no offset text over the title
    ax.tick_params(labelsize=7)
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, legend_y), frameon=False,
              borderaxespad=0.0, handlelength=2.0)  # fmt: skip


def figure_loss_check(table: pl.DataFrame) -> Figure:
    """loss_check.csv's curves (see the module's docstring); the empty figure says why there is nothing."""
    title = LOSS_PLOTS["loss_check"][1]
    if table.is_empty() or table.filter(pl.col("role").is_in(ROLES)).is_empty():
        return _empty_figure(title, NO_CHECK, "step", YLABEL)
    panels = _panels(table)
    if not panels:
        return _empty_figure(title, NO_CURVE, "step", YLABEL)
    shown = panels[:MAX_PANELS]
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    names = sorted({row["method"] for _, rows in panels for row, _ in rows})
    colours = {m: cmap(i % 10) for i, m in enumerate(names)}
    legends = [_entries(rows) for _, rows in shown]
    labels = [label for entries in legends for *_, label in entries]
    entries = max(len(e) for e in legends)
    width = max(3.0, 0.5 + CHAR_IN * max(len(x) for x in labels))  # a panel: as wide as its longest legend line
    legend_h = LEGEND_ROW_H * entries + 0.15
    cols = len(shown) if len(shown) <= COLUMNS else min(COLUMNS, math.ceil(math.sqrt(len(shown))))
    rows_n = math.ceil(len(shown) / cols)
    gap_w, gap_h = Y_LEFT + 0.3, TICKS_H + legend_h + TITLE_H
    notes = []
    if len(panels) > MAX_PANELS:
        notes.append(f"(the first {MAX_PANELS} of {len(panels)} settings; all of them in loss_check.csv)")
    unseen = table.filter(pl.col("role").is_in(ROLES)).select(SETTING).unique().height - len(panels)
    if unseen > 0:
        notes.append(f"({unseen} setting{'s' * (unseen != 1)} without a curve to draw: see loss_check.csv)")
    top = 0.45 + 0.2 * len(notes) + TITLE_H
    bottom = TICKS_H + legend_h + 0.05
    wide = Y_LEFT + cols * width + (cols - 1) * gap_w + 0.25
    fig = _canvas(wide, top + rows_n * AXES_H + (rows_n - 1) * gap_h + bottom)
    _margins(fig, Y_LEFT, 0.25, bottom, top)
    fig.subplots_adjust(wspace=gap_w / width, hspace=gap_h / AXES_H)
    axes = fig.subplots(rows_n, cols, squeeze=False).ravel()
    for ax, (setting, lines) in zip(axes, shown, strict=False):
        _draw(ax, setting, lines, colours, -TICKS_H / AXES_H)
    for ax in axes[len(shown) :]:
        ax.remove()
    fig.suptitle("\n".join([title, *notes]), fontsize=10, y=1 - 0.1 / fig.get_size_inches()[1], va="top")
    return fig


def plot_loss_check(table: pl.DataFrame, out: dict[str, str]) -> None:
    _save(figure_loss_check(table), out, "loss_check")


def plot_files(folder: str) -> dict[str, str]:
    from pretrain_planner.report.plots import plot_files as files

    return files(folder, LOSS_PLOTS)


def make_plot(loss_check_csv: str, out: dict[str, str], log_path: str) -> None:
    """The `loss_plot` rule: the check's curves, PNG and SVG."""
    from pretrain_planner.results import atomic_write_text
    from pretrain_planner.tables.aggregate import read_table

    table = read_table(loss_check_csv)
    plot_loss_check(table, out)
    settings = table.filter(pl.col("role").is_in(ROLES)).select(SETTING).unique().height if table.height else 0
    drawn = len(_panels(table)) if settings else 0
    atomic_write_text(log_path, f"loss plot: {min(drawn, MAX_PANELS)} panels of {settings} checked settings "
                                f"({drawn} with a curve)\n")  # fmt: skip
