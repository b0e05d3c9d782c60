"""Where the commands' answers come from: the sweep's tables (or its cell results aggregated here when the pipeline
has not written them yet), the what-if's predictor over them, and the calendar's site. Querying only: nothing here
prints an answer (a result file that cannot be read is named on stderr)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.cli.config import REPO, CliError, config_catalog, costs_of, evidence_folder, results_dir


def time_to_train(results: Path, config: dict[str, Any], allow_differs: bool = False):
    """tables/time_to_train.csv if the pipeline wrote it, else the cell results aggregated here. `allow_differs`:
    the fastest method whatever its loss check said (from tables/cells.csv, each pick's verdict kept)."""
    import polars as pl

    from pretrain_planner.tables import aggregate

    table = layout.table(results, "time_to_train.csv")
    cells_csv = layout.table(results, "cells.csv")
    if allow_differs and cells_csv.is_file():
        cells = aggregate.read_table(cells_csv)
        verdicts = cells.select(*aggregate.GROUP, pl.col("method").alias("best_method"), "loss")
        ttt = aggregate.time_to_train(cells.drop("loss")).drop("loss", "passed_over")
        return ttt.join(verdicts, on=[*aggregate.GROUP, "best_method"], how="left"), f"{cells_csv} (--allow-differs)"
    if table.is_file():
        return aggregate.read_table(table), str(table)
    try:
        catalog = config_catalog(config)
    except Exception:
        catalog = None
    cells, source = cells_here(results, catalog, "tables/time_to_train.csv")
    return aggregate.time_to_train(cells), source


def cells_here(results: Path, catalog, table: str):
    """The cells table aggregated here from the cell results (the pipeline's table `table` is not there yet),
    with results/plan.csv when it exists; files that cannot be read are named on stderr."""
    from pretrain_planner.tables import aggregate

    paths = [str(p) for p in layout.all_results(results)]
    if not paths:
        raise CliError(f"no results in {results}: neither {table} nor cells/*/.../result.json")
    results_df, _ = aggregate.read_results(paths)
    plan = results / layout.PLAN
    plan_df = aggregate.read_plan(plan) if plan.is_file() else aggregate.plan_from_results(results_df)
    cells, problems = aggregate.cells_table(plan_df, paths, catalog)
    for p, why in problems.select("path", "problem").iter_rows():
        print(f"skipped {p}: {why}", file=sys.stderr)
    return cells, f"{len(paths)} result files in {results}/cells"


def cells_or_none(results: Path, catalog):
    """The cells measured here (tables/cells.parquet, else the cell results), or an empty table and why: a fresh
    install predicts from the public evidence alone."""
    import polars as pl

    from pretrain_planner.tables import predictor

    parquet = layout.table(results, "cells.parquet")
    if parquet.is_file():
        return pl.read_parquet(parquet), str(parquet)
    if layout.all_results(results):
        return cells_here(results, catalog, "tables/cells.parquet")
    return predictor.empty_cells(), f"no cells measured in {results}: public evidence only"


def predictor_of(config: dict[str, Any], catalog, results: Path):
    """(the what-if's Predictor over the cells measured here, the shipped and the imported evidence; where the
    cells came from)."""
    from pretrain_planner.schema import section
    from pretrain_planner.tables import predictor

    cells, source = cells_or_none(results, catalog)
    limit = section("config", "benchmark", config.get("benchmark"))["suspect_mfu"]
    folder = evidence_folder(config)
    return predictor.Predictor(cells, catalog, limit, costs_of(config), evidence_folder=folder), source


def calendar_site(config: dict[str, Any], gpus: list[str]):
    """(tables.calendar.Site of the config's launcher, how the answer's parts were known): on SLURM the site file's
    settings of `gpus` and the scheduler asked; locally no queue. The checkpoint rate is measured on the results
    folder's file system unless the site file gives it."""
    from datetime import datetime

    from pretrain_planner.planning.calendar import disk_write_rate
    from pretrain_planner.planning.configtypes import LauncherSection
    from pretrain_planner.planning.queue import run_sbatch
    from pretrain_planner.planning.site import load_site
    from pretrain_planner.schema import resolve_path
    from pretrain_planner.tables.calendar import Site

    launcher = LauncherSection.of(config["launcher"])  # the answered config's, typed here at the CLI's entrance
    site = None
    if launcher.kind == "slurm" and launcher.site:
        site = load_site(resolve_path(launcher.site, REPO), gpus, "the config", "launcher.site")
    rate, how = disk_write_rate(str(results_dir(config)))
    return Site(site, rate, how, run_sbatch if site else None, datetime.now())


def startup_median(cells):
    """(each measured setting's start-up, their median) of the cells, or nothing measured."""
    from pretrain_planner.tables.calendar import startup_of

    return startup_of(cells) if cells is not None else ({}, None)
