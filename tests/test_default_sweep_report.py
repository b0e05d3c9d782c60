"""What a newcomer reads after the default sweep (config/config.yaml, exactly as the README's first command plans
it): every plot shows data (no empty frame, no panel with only a note), every Markdown table fits a 120-column
terminal with at most 12 columns and no column blank in every row, and numbers carry units.

The cells are written as a `cpu` cell writes them (a dense peak measured on the host, its MFU) for the plan the
config makes; the tables, the study's views, the what-if, the plots and report.md are the pipeline's own functions
with the config's sections. tests/test_host_peak.py runs a real cell for the peak; tests/test_report_browser.py opens
the HTML report of a real sweep."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from pretrain_planner.planning.configtypes import CostsSection
from pretrain_planner.report import plots as pp_plots
from pretrain_planner.report import study_plots
from pretrain_planner.tables import aggregate

from .demo_results import build_demo_results, empty_panels, md_cells, md_tables

WIDTH = 120
MAX_COLUMNS = 12


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, dict[str, str], dict[str, str], dict]:
    root = tmp_path_factory.mktemp("demo") / "results"
    return (root, *build_demo_results(root))


def test_the_empty_frame_check_sees_an_empty_frame():
    fig = pp_plots._empty_figure("t", "nothing to draw", "x", "y")
    assert empty_panels(fig) == ["t"]


def test_every_plot_of_the_default_sweep_shows_data(report):
    _, tables, _, config = report
    figs = {**pp_plots.figures(tables, CostsSection.of(config["costs"])), **study_plots.figures(tables)}
    assert set(figs) == set(pp_plots.PLOTS) | set(study_plots.STUDY_PLOTS)
    empty = {key: panels for key, fig in figs.items() if (panels := empty_panels(fig))}
    assert not empty, f"plots with an empty frame on the default sweep: {empty}"


def test_every_table_reads_in_a_terminal(report):
    root, tables, _, _ = report
    docs = {p.relative_to(root): p.read_text() for p in sorted(root.rglob("*.md"))}
    assert Path("report.md") in docs and Path("tables/time_to_train.md") in docs and Path("tables/whatif.md") in docs
    for name, text in docs.items():
        for table in md_tables(text):
            header = md_cells(table[0])
            assert len(header) <= MAX_COLUMNS, (name, header)
            wide = [line for line in table if len(line) > WIDTH]
            assert not wide, (name, wide[0])
            rows = [md_cells(line) for line in table[2:]]
            blank = [h for i, h in enumerate(header) if rows and not any(r[i] for r in rows)]
            assert not blank, f"{name}: columns blank in every row: {blank}"


def test_numbers_carry_units_and_one_rounding(report):
    root, tables, _, _ = report
    ttt = aggregate.read_table(tables["time_to_train_csv"])
    md = (root / "tables/time_to_train.md").read_text()
    row = ttt.filter((pl.col("model") == "tiny-gptneox") & (pl.col("gpus_per_node") == 2)).row(0, named=True)
    days = aggregate.to_markdown(pl.DataFrame({"training_days": [row["training_days"]]})).splitlines()[2]
    shown = md_cells(days)[0]
    assert re.fullmatch(r"[\d.,]+ (d|h|min|s|ms)", shown), shown
    line = next(ln for ln in md.splitlines() if ln.startswith("| tiny-gptneox") and "| 1x2 " in ln)
    assert f" {shown} " in line and "%*" in line  # the same rounding; MFU marked as against a measured peak
    report_md = (root / "report.md").read_text()
    assert line in report_md  # report.md shows the same table, rounded alike
    costs = (root / "tables/costs.md").read_text()
    assert re.search(r"\| \$\d{1,3}(,\d{3})* ", costs) and "NOMINAL" in costs  # the demo's price, said to be nominal
