"""The calendar's timeline (tables/calendar.py): one bar per setting from submission to finish, Gantt-like: the wait
for the first job, each segment's training, the restart it pays (start-up, checkpoint read, the write before
it ends) and the wait to start again. A setting whose finish is unknown (the scheduler gave no estimate) is a
labelled empty row, never a bar that leaves the wait out. Imports no torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from pretrain_planner.report.plots import CHAR_IN, _canvas, _empty_figure, _margins, _save
from pretrain_planner.tables import units

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CALENDAR_PLOTS = {"calendar": ("calendar_timeline", "When each setting finishes: queue waits, segments, restarts")}
MAX_ROWS = 40
COLOURS = {"wait": "#bdbdbd", "train": "#4575b4", "restart": "#d73027"}


def _label(r: dict) -> str:
    return f"{r['model']} ({r['run']}): {r['nodes']}x{r['gpus_per_node']} {r['gpu']} {r['method']}"


def _pieces(r: dict) -> list[tuple[float, float, str]]:
    """(start day, length in days, kind) of the row's bar."""
    n, wait = int(r["segments"]), (r["first_wait_h"] or 0.0) / 24
    again = (r["requeue_wait_h"] or 0.0) / 24
    restart = (r["restart_loss_h"] or 0.0) / 24 / n  # spread evenly: one start-up per job, the rest between
    train = r["compute_days"] / n
    out, t = [], 0.0
    if wait > 0:
        out.append((0.0, wait, "wait"))
        t = wait
    for i in range(n):
        if i and again > 0:
            out.append((t, again, "wait"))
            t += again
        out.append((t, restart, "restart"))
        out.append((t + restart, train, "train"))
        t += restart + train
    return out


def figure_calendar(table: pl.DataFrame) -> Figure:
    title = CALENDAR_PLOTS["calendar"][1]
    if table.is_empty():
        return _empty_figure(title, "no setting with a measured training time", "days from submission", "")
    rows = table.head(MAX_ROWS).to_dicts()
    labels = [_label(r) for r in rows]
    left = 0.3 + CHAR_IN * max(len(x) for x in labels)
    cut = table.height > MAX_ROWS
    top = 0.55 if cut else 0.35
    fig = _canvas(left + 7.0, top + 0.5 + 0.28 * len(rows))
    _margins(fig, left, 0.3, 0.5, top)
    ax = fig.add_subplot()
    per, unit = units.duration_unit([r["calendar_days"] for r in rows])  # days per unit of the axis
    end = max([r["calendar_days"] / per for r in rows if r["calendar_days"] is not None] or [1.0])
    for y, r in enumerate(rows):
        if r["calendar_days"] is None:
            ax.text(0, y, "  finish unknown: " + ("wait unknown" if r["segments"] is not None else
                    "restart not priced"), va="center", fontsize=7, color="#636363")  # fmt: skip
            continue
        for start, length, kind in _pieces(r):
            ax.barh(y, length / per, left=start / per, color=COLOURS[kind], height=0.6, linewidth=0)
        mark = " (first)" if r["finishes_first"] else ""
        ax.text(r["calendar_days"] / per, y, f" {units.days(r['calendar_days'])}{mark}", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top; fixed, as rows without a bar set no limits
    ax.set_xlim(0, end * 1.15)
    ax.set_xlabel(f"{unit} from submission")
    shown = f"\n(the first {MAX_ROWS} of {table.height} settings; all of them in calendar.csv)" if cut else ""
    ax.set_title(title + shown, fontsize=10)
    from matplotlib.patches import Patch

    names = {"wait": "queue wait", "train": "training", "restart": "restart (start-up, checkpoint)"}
    ax.legend(handles=[Patch(color=c, label=names[k]) for k, c in COLOURS.items()], fontsize=7, loc="lower right")
    return fig


def plot_calendar(table: pl.DataFrame, out: dict[str, str]) -> None:
    _save(figure_calendar(table), out, "calendar")


def plot_files(folder: str) -> dict[str, str]:
    from pretrain_planner.report.plots import plot_files as files

    return files(folder, CALENDAR_PLOTS)


def make_plot(calendar_csv: str, out: dict[str, str], log_path: str) -> None:
    """The `calendar_plot` rule: the timeline, PNG and SVG."""
    from pretrain_planner.results import atomic_write_text
    from pretrain_planner.tables.calendar import read_calendar

    table = read_calendar(calendar_csv)
    plot_calendar(table, out)
    atomic_write_text(log_path, f"calendar plot: {min(table.height, MAX_ROWS)} of {table.height} settings\n")
