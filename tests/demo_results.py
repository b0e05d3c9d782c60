"""The default sweep's results as the pipeline leaves them (config/config.yaml's plan, cells written as a `cpu` cell
writes them), and what a plot draws: shared by the report, README and plot-layout tests."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import yaml
from matplotlib.figure import Figure
from pretrain_planner import sweeprecord
from pretrain_planner.facade.pipeline import load, write_plan
from pretrain_planner.planning.flops import train_flops_per_sample
from pretrain_planner.report import calendar_plot, document, loss_plot, study_plots
from pretrain_planner.report import plots as pp_plots
from pretrain_planner.results import write_result, write_steps
from pretrain_planner.tables import aggregate, calendar, study, whatif

from .conftest import REPO, cell_result

HOST_PEAK_TFLOPS = 0.05  # what hostpeak.py measures on one core of a laptop-class CPU, about


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
    phases = {
        "process_to_rank_s": 2.9,
        "model_build_s": 1.9,
        "method_wrap_s": 0.02 if method == "naive" else 0.9,
        "data_ready_s": 0.001,
        "compile_s": 0.1 if method == "naive" else 2.9,
    }  # as measured on a 2-core host
    r["startup"] = {**phases, "total_s": sum(phases.values()), "process_start": "proc"}
    return r


def build_demo_results(root: Path, with_plots: bool = False) -> tuple[dict[str, str], dict[str, str], dict]:
    """results/ of the default sweep under `root` as the pipeline leaves it (plan, cells with their steps.jsonl, tables,
    study views, what-if, report.md, and `with_plots` the plots): (table files, plot files, the validated config)."""
    pipe = load(demo_config(), REPO, "config/config.yaml")
    write_plan(pipe, str(root / "plan.csv"))
    sweeprecord.write(root, pipe.config, [REPO / "config/config.yaml"], REPO, workdir=root.parent)  # as the driver does
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
                           pipe.costs)  # fmt: skip
    extra = {**study.table_files(str(root / "tables/study")), **whatif.table_files(str(root / "tables"))}
    study.build_study_tables(tables["cells_parquet"], extra, str(root / "study.log"), catalog,
                             config["benchmark"]["suspect_mfu"], pipe.study)  # fmt: skip
    whatif.build_whatif(tables["cells_parquet"], extra, str(root / "whatif.log"), catalog, config["sweep"]["models"],
                        whatif.counts_of(pipe.sweep, pipe.study), config["benchmark"]["suspect_mfu"],
                        pipe.costs.to_json(), named=pipe.whatif.named_in(catalog))  # fmt: skip
    cal = calendar.table_files(str(root / "tables"))
    calendar.build_calendar({"time_to_train": tables["time_to_train_csv"], "cells": tables["cells_parquet"]}, cal,
                            str(root / "calendar.log"), pipe.site, pipe.catalog, pipe.train)  # fmt: skip
    tables = {**tables, **extra, **cal}
    plots = {**pp_plots.plot_files(str(root / "plots")), **study_plots.plot_files(str(root / "plots/study")),
             **calendar_plot.plot_files(str(root / "plots")), **loss_plot.plot_files(str(root / "plots"))}  # fmt: skip
    if with_plots:
        pp_plots.make_plots(tables, plots, str(root / "plots.log"), pipe.costs)
        study_plots.make_plots(tables, plots, str(root / "study_plots.log"))
        calendar_plot.make_plot(cal["calendar_csv"], plots, str(root / "calendar_plot.log"))
        loss_plot.make_plot(tables["loss_check_csv"], plots, str(root / "loss_plot.log"))
    document.write_report(tables, plots, None, str(root / "report.md"), str(root / "report.log"), pipe.costs)
    return tables, plots, config


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


def md_tables(text: str) -> list[list[str]]:
    """The Markdown tables of a document, each as its lines."""
    out, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            out.append(current)
            current = []
    return [*out, current] if current else out


def md_cells(line: str) -> list[str]:
    """The cells of a Markdown table's line (an escaped `\\|` stays in its cell)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
