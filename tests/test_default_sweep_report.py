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

import numpy as np
import polars as pl
import pytest
import yaml
from matplotlib.figure import Figure
from pretrain_planner.planning.flops import train_flops_per_sample
from pretrain_planner.planning.pipeline import load, write_plan
from pretrain_planner.report import document, study_plots
from pretrain_planner.report import plots as pp_plots
from pretrain_planner.results import write_result, write_steps
from pretrain_planner.tables import aggregate, study, whatif

from .conftest import REPO
from .test_aggregate import cell_result

HOST_PEAK_TFLOPS = 0.05  # what hostpeak.py measures on one core of a laptop-class CPU, about
WIDTH = 120
MAX_COLUMNS = 12


def demo_config() -> dict:
    return yaml.safe_load((REPO / "config/config.yaml").read_text())


def measured(model: str, nodes: int, gpn: int, method: str, catalog) -> dict:
    """A cell's result as the trainer writes it on a `cpu` rank: step time, its MFU against the host's peak."""
    spec = catalog.models[model]
    world = nodes * gpn
    base = {"naive": 0.012, "fl": 0.009, "fl+ac": 0.011}[method]  # days on one rank: fl fastest, checkpointing slower
    r = cell_result(model, "cpu", nodes, gpn, method, "ok", base / world**0.8, mb=4)
    flops = train_flops_per_sample(spec.to_dict()) * spec.recipe.global_batch
    r.update(peak_tflops=HOST_PEAK_TFLOPS, peak_mem_gib=0.5, peak_source="measured on this host, not a datasheet: "
             "best of 10 1024x1024 fp32 torch.matmul on 1 thread(s) per rank (trainer/hostpeak.py)",
             tokens_per_s=spec.recipe.global_batch * spec.recipe.sequence_length / r["step_time_s"],
             mfu=flops / (r["step_time_s"] * world * HOST_PEAK_TFLOPS * 1e12))  # fmt: skip
    assert r["mfu"] < 0.85, r["mfu"]  # plausible: not `suspect`
    return r


def build_demo_results(root: Path, with_plots: bool = False) -> tuple[dict[str, str], dict[str, str], dict]:
    """results/ of the default sweep under `root` as the pipeline leaves it (plan, cells with their steps.jsonl, tables,
    study views, what-if, report.md, and `with_plots` the plots): (table files, plot files, the validated config)."""
    pipe = load(demo_config(), REPO, "config/config.yaml")
    write_plan(pipe, str(root / "plan.csv"))
    paths = []
    for c in pipe.planned:
        if c.valid:
            path = root / f"cells/{c.cell.model}/cpu/{c.cell.nodes}x{c.cell.gpus_per_node}/{c.cell.method}/result.json"
            r = measured(c.cell.model, c.cell.nodes, c.cell.gpus_per_node, c.cell.method, pipe.catalog)
            write_result(path, r)
            write_steps(path.with_name("steps.jsonl"), [{"step": i, "time_s": r["step_time_s"], "loss": 6.0}
                                                        for i in range(r["timed_steps"])])  # fmt: skip
            paths.append(str(path))
    config, catalog = pipe.config, pipe.catalog
    tables = aggregate.table_files(str(root / "tables"))
    aggregate.build_tables(str(root / "plan.csv"), paths, tables, str(root / "aggregate.log"), catalog,
                           config["costs"])  # fmt: skip
    extra = {**study.table_files(str(root / "tables/study")), **whatif.table_files(str(root / "tables"))}
    settings = study.study_settings(config.get("study"), catalog)
    study.build_study_tables(tables["cells_parquet"], extra, str(root / "study.log"), catalog,
                             config["benchmark"]["suspect_mfu"], settings)  # fmt: skip
    whatif.build_whatif(tables["cells_parquet"], extra, str(root / "whatif.log"), catalog, config["sweep"]["models"],
                        whatif.counts_of(config), config["benchmark"]["suspect_mfu"], config["costs"])  # fmt: skip
    tables = {**tables, **extra}
    plots = {**pp_plots.plot_files(str(root / "plots")), **study_plots.plot_files(str(root / "plots/study"))}
    if with_plots:
        pp_plots.make_plots(tables, plots, str(root / "plots.log"), config["costs"])
        study_plots.make_plots(tables, plots, str(root / "study_plots.log"))
    document.write_report(tables, plots, None, str(root / "report.md"), str(root / "report.log"), config["costs"])
    return tables, plots, config


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, dict[str, str], dict[str, str], dict]:
    root = tmp_path_factory.mktemp("demo") / "results"
    return (root, *build_demo_results(root))


def data_marks(ax) -> int:
    """The data an axes draws: bars of some size, points, lines, heat-map cells that are not masked."""
    n = sum(1 for p in ax.patches if hasattr(p, "get_width") and p.get_width() * p.get_height() != 0)
    n += sum(1 for c in ax.collections if len(c.get_offsets()) or (hasattr(c, "get_array") and c.get_array() is not
                                                                    None and np.size(c.get_array())))  # fmt: skip
    n += sum(1 for im in ax.images if not np.ma.getmaskarray(im.get_array()).all())
    n += sum(1 for line in ax.lines if line.get_visible() and len(line.get_xdata()))
    return n


def empty_panels(fig: Figure) -> list[str]:
    """The visible axes of a figure that draw no data (an empty frame, or a panel with only a note)."""
    return [ax.get_title() or "(untitled)" for ax in fig.axes if ax.get_visible() and ax.axison and not data_marks(ax)]


def test_the_empty_frame_check_sees_an_empty_frame():
    fig = pp_plots._empty_figure("t", "nothing to draw", "x", "y")
    assert empty_panels(fig) == ["t"]


def test_every_plot_of_the_default_sweep_shows_data(report):
    _, tables, _, config = report
    figs = {**pp_plots.figures(tables, config["costs"]), **study_plots.figures(tables)}
    assert set(figs) == set(pp_plots.PLOTS) | set(study_plots.STUDY_PLOTS)
    empty = {key: panels for key, fig in figs.items() if (panels := empty_panels(fig))}
    assert not empty, f"plots with an empty frame on the default sweep: {empty}"


def _md_tables(text: str) -> list[list[str]]:
    """The Markdown tables of a document: each as its lines."""
    out, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            out.append(current)
            current = []
    return [*out, current] if current else out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_every_table_reads_in_a_terminal(report):
    root, tables, _, _ = report
    docs = {p.relative_to(root): p.read_text() for p in sorted(root.rglob("*.md"))}
    assert Path("report.md") in docs and Path("tables/time_to_train.md") in docs and Path("tables/whatif.md") in docs
    for name, text in docs.items():
        for table in _md_tables(text):
            header = _cells(table[0])
            assert len(header) <= MAX_COLUMNS, (name, header)
            wide = [line for line in table if len(line) > WIDTH]
            assert not wide, (name, wide[0])
            rows = [_cells(line) for line in table[2:]]
            blank = [h for i, h in enumerate(header) if rows and not any(r[i] for r in rows)]
            assert not blank, f"{name}: columns blank in every row: {blank}"


def test_numbers_carry_units_and_one_rounding(report):
    root, tables, _, _ = report
    ttt = aggregate.read_table(tables["time_to_train_csv"])
    md = (root / "tables/time_to_train.md").read_text()
    row = ttt.filter((pl.col("model") == "tiny-gptneox") & (pl.col("gpus_per_node") == 2)).row(0, named=True)
    days = aggregate.to_markdown(pl.DataFrame({"training_days": [row["training_days"]]})).splitlines()[2]
    shown = _cells(days)[0]
    assert re.fullmatch(r"[\d.,]+ (d|h|min|s|ms)", shown), shown
    line = next(ln for ln in md.splitlines() if ln.startswith("| tiny-gptneox") and "| 1x2 " in ln)
    assert f" {shown} " in line and "%*" in line  # the same rounding; MFU marked as against a measured peak
    report_md = (root / "report.md").read_text()
    assert line in report_md  # report.md shows the same table, rounded alike
    costs = (root / "tables/costs.md").read_text()
    assert re.search(r"\| \$\d{1,3}(,\d{3})* ", costs) and "NOMINAL" in costs  # the demo's price, said to be nominal
