"""`pretrain-planner status [--watch]`: where the sweep stands, per GPU type (done / running / failed cells and
GPU-hours; tables/status.py); --watch refreshes a table of the live cells until nothing runs or waits."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.cli.config import DEFAULT_CONFIG, REPO, CliError, load_config, results_dir


@dataclass
class Status:
    summary: Any  # polars DataFrame: one row per GPU type (tables/status.sweep_status)
    cells: Any  # polars DataFrame: one row per cell of the plan, its state
    results: Path
    plan_source: str
    config_source: str


def snapshot(args: argparse.Namespace, config: dict[str, Any], results: Path) -> Status:
    """The sweep's state now: plan.csv when the pipeline wrote it, else the config's plan."""
    from pretrain_planner.tables import status

    plan = status.load_plan(results)
    plan_source = str(results / layout.PLAN)
    if plan is None:
        import polars as pl

        from pretrain_planner.facade.pipeline import load

        pipe = load(config, REPO, args.config or DEFAULT_CONFIG)
        plan = pl.DataFrame(pipe.rows())
        plan_source = f"the config's plan, no {results}/plan.csv yet"
    summary, cells = status.sweep_status(results, plan)
    return Status(summary, cells, results, plan_source, args.answer_source)


def driver_note(results: Path) -> str:
    """Which driver works on the folder now, if any."""
    from pretrain_planner.launch import driver

    rec = driver.other_driver(results)
    if rec is None:
        return "no driver is working on this folder now (cells already submitted to SLURM may still finish)"
    return f"driver: pid {rec.get('pid')} on {rec.get('host')}, started {rec.get('started_at')}"


def render_json(a: Status) -> str:
    return json.dumps({"summary": a.summary.to_dicts(), "cells": a.cells.to_dicts(),
                       "config_source": a.config_source}, indent=1)  # fmt: skip


def render_text(a: Status) -> str:
    from pretrain_planner.tables import status

    return f"{status.format_status(a.summary, a.cells, str(a.results), a.plan_source)}\n({a.config_source})"


def run(args: argparse.Namespace) -> int:
    from pretrain_planner.tables import status

    if args.results and not Path(args.results).is_dir():  # a typo must not read as a sweep not run yet
        raise CliError(f"--results {args.results}: no such folder (a sweep writes it when it runs: run one, or name "
                       "the folder a sweep wrote)")  # fmt: skip
    config = load_config(args)
    results = results_dir(config)
    if args.watch:
        if args.json:
            raise CliError("--watch shows a refreshing table; --json prints the status once: use one of them")

        def frame() -> tuple[str, bool]:
            now = snapshot(args, config, results)
            text = status.watch_frame(now.cells, str(results), now.plan_source, args.every, driver_note(results))
            return text, status.live(now.cells)

        return status.watch(frame, args.every)
    a = snapshot(args, config, results)
    print(render_json(a) if args.json else render_text(a))
    return 0
