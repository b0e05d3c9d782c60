"""Every plot stays readable across the scales it is drawn at: the default sweep's tables (its 12 cells on the `cpu`
stand-in, a peak measured on the host, no price here), test_aggregate's hand-made priced set, and 60 and 10,000
synthetic results (benchmarks/aggregate_bench.py). On each, no two text boxes of a figure (titles, axis labels, tick
labels, annotations, legends) overlap, none leaves the canvas, and the content fills the canvas (the feasibility
heat-map is not a stamp in a blank page). No training: results are written as a cell writes them."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox
from pretrain_planner.planning.configtypes import TrainSection
from pretrain_planner.report import calendar_plot, loss_plot, study_plots
from pretrain_planner.report import plots as pp_plots
from pretrain_planner.tables import aggregate, calendar, study, whatif

from .conftest import CATALOG, COSTS, INVALID, REPO, gpu_set_results, write_set
from .demo_results import measured

sys.path.insert(0, str(REPO / "benchmarks"))
import aggregate_bench  # noqa: E402

pytestmark = pytest.mark.slow  # aggregating 10,000 results and drawing every plot of four sets: ~1.5 min
SETS = ["default sweep", "hand-made GPU set", "60 results", "10k results"]
SLACK_PX = 1.0  # boxes that merely touch (anti-aliasing, rounding) do not count as overlapping


def demo_results() -> list[dict]:
    """The default sweep's cells (config/config.yaml's sweep), all `ok`, as a cpu cell writes them (its MFU against
    the peak measured on the host): fl faster than naive, two ranks faster than one."""
    sweep = yaml.safe_load((REPO / "config/config.yaml").read_text())["sweep"]
    return [measured(model, 1, gpn, method, CATALOG) for model in sweep["models"] for gpn in sweep["gpus_per_node"]
            for method in sweep["methods"]]  # fmt: skip


def _tables(root: Path, plan: str, paths: list[str]) -> dict[str, str]:
    """The aggregation's tables, the study's views and the what-if predictions (every plot's input)."""
    out = aggregate.table_files(str(root / "tables"))
    aggregate.build_tables(plan, paths, out, str(root / "aggregate.log"), CATALOG, COSTS)
    extra = {**study.table_files(str(root / "tables" / "study")), **whatif.table_files(str(root / "tables"))}
    study.build_study_tables(out["cells_parquet"], extra, str(root / "study.log"), CATALOG, 0.85)
    cells = pl.read_parquet(out["cells_parquet"], columns=["model", "nodes", "gpus_per_node"])
    counts = sorted(set(cells.select("nodes", "gpus_per_node").rows()))
    whatif.build_whatif(out["cells_parquet"], extra, str(root / "whatif.log"), CATALOG,
                        sorted(set(cells["model"].to_list())), counts, 0.85, COSTS.to_json())  # fmt: skip
    extra |= calendar.table_files(str(root / "tables"))
    train = replace(TrainSection.defaults(), steps=20)
    calendar.build_calendar({"time_to_train": out["time_to_train_csv"], "cells": out["cells_parquet"]}, extra,
                            str(root / "calendar.log"), None, CATALOG, train)  # fmt: skip
    return {**out, **extra}


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> dict[str, dict[str, str]]:
    """Table files of each set: the two ends of the scale, the hand-made priced set of test_aggregate (small
    Pareto fronts, labelled) and 60 synthetic results (a bar per cell, too many for three-line labels)."""
    root = {name: tmp_path_factory.mktemp(name.replace(" ", "-")) for name in SETS}
    return {
        "default sweep": _tables(root["default sweep"], *write_set(root["default sweep"], demo_results())),
        "hand-made GPU set": _tables(root["hand-made GPU set"], *write_set(root["hand-made GPU set"],
                                     gpu_set_results(), INVALID)),
        "60 results": _tables(root["60 results"], *aggregate_bench.synthesise(root["60 results"], 60)),
        "10k results": _tables(root["10k results"], *aggregate_bench.synthesise(root["10k results"], 10_000)),
    }  # fmt: skip


@pytest.fixture(scope="module")
def figures(sets) -> dict[tuple[str, str], Figure]:
    return {(name, key): fig for name, tables in sets.items()
            for key, fig in {**pp_plots.figures(tables, COSTS), **study_plots.figures(tables),
                             "calendar": calendar_plot.figure_calendar(calendar.read_calendar(
                                 tables["calendar_csv"])),
                             "loss_check": loss_plot.figure_loss_check(aggregate.read_table(
                                 tables["loss_check_csv"]))}.items()}  # fmt: skip


def text_boxes(fig: Figure) -> list[tuple[str, Bbox]]:
    """(what, window extent) of every visible, non-empty text of the drawn figure; a legend is one box."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes: list[tuple[str, Bbox]] = []

    def add(what: str, text) -> None:
        if text.get_visible() and text.get_text().strip():
            boxes.append((f"{what} {text.get_text()!r}", text.get_window_extent(renderer)))

    for text in fig.texts:
        add("figure text", text)
    for legend in fig.legends:
        boxes.append(("figure legend", legend.get_window_extent(renderer)))
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        for title in (ax.title, ax._left_title, ax._right_title):
            add(f"axes {i} title", title)
        for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")) if ax.axison else ():
            add(f"axes {i} {name} label", axis.label)
            # the ticks that were drawn: those inside the view interval (get_ticklabels lists all the locator's)
            for tick in axis._update_ticks():
                for label in (tick.label1, tick.label2):
                    add(f"axes {i} {name} tick", label)
        for text in ax.texts:
            add(f"axes {i} text", text)
        if ax.get_legend() is not None:
            boxes.append((f"axes {i} legend", ax.get_legend().get_window_extent(renderer)))
    return boxes


def overlaps(boxes: list[tuple[str, Bbox]]) -> list[str]:
    """Every pair of boxes that overlap by more than SLACK_PX in both directions."""
    if len(boxes) < 2:
        return []
    ext = np.array([[b.x0, b.y0, b.x1, b.y1] for _, b in boxes])
    w = np.minimum(ext[:, None, 2], ext[None, :, 2]) - np.maximum(ext[:, None, 0], ext[None, :, 0])
    h = np.minimum(ext[:, None, 3], ext[None, :, 3]) - np.maximum(ext[:, None, 1], ext[None, :, 1])
    hit = np.triu((w > SLACK_PX) & (h > SLACK_PX), k=1)
    return [f"{boxes[i][0]} overlaps {boxes[j][0]}" for i, j in zip(*np.nonzero(hit), strict=True)]


def outside(fig: Figure, boxes: list[tuple[str, Bbox]]) -> list[str]:
    canvas = fig.bbox
    return [
        f"{what} leaves the canvas"
        for what, b in boxes
        if b.x0 < canvas.x0 - SLACK_PX or b.y0 < canvas.y0 - SLACK_PX or b.x1 > canvas.x1 + SLACK_PX
        or b.y1 > canvas.y1 + SLACK_PX
    ]  # fmt: skip


@pytest.mark.parametrize(
    "key", [*pp_plots.PLOTS, *study_plots.STUDY_PLOTS, *calendar_plot.CALENDAR_PLOTS, *loss_plot.LOSS_PLOTS]
)
@pytest.mark.parametrize("name", SETS)
def test_no_text_overlaps_or_leaves_the_canvas(figures, name, key):
    fig = figures[(name, key)]
    boxes = text_boxes(fig)
    assert boxes, "a figure without any text"
    problems = overlaps(boxes) + outside(fig, boxes)
    assert not problems, f"{key} on the {name}: {len(problems)} problems:\n" + "\n".join(problems[:20])


@pytest.mark.parametrize(
    "key", [*pp_plots.PLOTS, *study_plots.STUDY_PLOTS, *calendar_plot.CALENDAR_PLOTS, *loss_plot.LOSS_PLOTS]
)
@pytest.mark.parametrize("name", SETS)
def test_content_fills_the_canvas(figures, name, key):
    """No wide blank band: what is drawn spans the canvas but for at most 15% or half an inch each way."""
    fig = figures[(name, key)]
    fig.canvas.draw()
    tight = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
    for drawn, size, what in ((tight.width, fig.get_size_inches()[0], "wide"), (tight.height, fig.get_size_inches()[1],
                              "high")):  # fmt: skip
        assert size - drawn <= max(0.15 * size, 0.5), f"{key}: the content is {drawn:.1f} of {size:.1f} in {what}"


@pytest.mark.parametrize("name", SETS)
def test_feasibility_heat_map_is_the_figure(figures, name):
    """The heat-map is what the figure is for: it takes a good share of the canvas, not a stamp in a corner."""
    fig = figures[(name, "feasibility")]
    fig.canvas.draw()
    (ax,) = [a for a in fig.axes if a.images]
    share = ax.get_position().width * ax.get_position().height
    assert share >= 0.3, f"the heat-map covers {share:.0%} of the canvas"


def test_crowded_cost_panel_keeps_its_labels(figures):
    """The 10k set's first panel (a Pareto front of 15 settings) is labelled, not left bare to avoid overlaps."""
    first = figures[("10k results", "cost_days")].axes[0]
    labels = [t for t in first.texts if "settings without a price" not in t.get_text()]
    assert len(labels) >= 10, [t.get_text() for t in labels]


def test_checker_sees_an_overlap():
    """The checker itself: two texts drawn on top of each other are reported, two apart are not."""
    fig = Figure(figsize=(4, 3))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.text(0.1, 0.5, "first label")
    ax.text(0.15, 0.5, "second label")
    ax.text(0.1, 0.1, "far away")
    found = overlaps(text_boxes(fig))
    assert found == ["axes 0 text 'first label' overlaps axes 0 text 'second label'"]
