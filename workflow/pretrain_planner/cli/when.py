"""`pretrain-planner when`: if submitted now, when does training --model on --count x --gpu finish
(tables/calendar.py): the compute days (measured, else PREDICTED), segments under the site's time limit, restarts,
the queue wait asked of the scheduler (sbatch --test-only, nothing submitted)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pretrain_planner.cli.config import CliError, context, per_node
from pretrain_planner.cli.sources import calendar_site, cells_or_none, predictor_of, startup_median, time_to_train
from pretrain_planner.tables import units
from pretrain_planner.tables.units import days as _days


@dataclass
class When:
    """Each setting priced on the calendar (tables.calendar.price rows, ranked) and where its compute came from."""

    rows: list[dict[str, Any]]
    now: datetime
    source: str
    checkpoint_rate: str  # how the checkpoint rate was known
    config_source: str


def query(args: argparse.Namespace) -> When:
    from pretrain_planner.tables.calendar import price, rank

    config, results, catalog = context(args)  # unknown names: the catalog's known ones
    per_node(args.count, args.nodes or 1)
    settings, source = _settings(args, config, catalog, results)
    where = calendar_site(config, [args.gpu])
    rows = rank([price(s, catalog, where) for s in settings])
    return When(rows, where.now, source, where.measured_how, args.answer_source)


def _settings(args: argparse.Namespace, config: dict[str, Any], catalog, results: Path):
    """The settings `when` prices: those measured for --model / --gpu / --count (and --nodes), else the what-if's
    prediction for --nodes (default 1) x the rest; and where the compute days came from."""
    import polars as pl

    from pretrain_planner.tables.calendar import Setting, settings_of

    try:
        ttt, source = time_to_train(results, config)
        cells, _ = cells_or_none(results, catalog)
    except CliError:
        ttt, source, cells = None, f"nothing measured in {results}", None
    if ttt is not None:
        mine = ttt.filter((pl.col("model") == args.model) & (pl.col("gpu") == args.gpu)
                          & (pl.col("nodes") * pl.col("gpus_per_node") == args.count)
                          & pl.col("training_days").is_not_null())  # fmt: skip
        if args.nodes:
            mine = mine.filter(pl.col("nodes") == args.nodes)
        if mine.height:
            return [s for s in settings_of(mine, cells) if s.run == "recipe"], f"measured: {source}"
    nodes = args.nodes or 1
    predictor, cells_source = predictor_of(config, catalog, results)
    p = predictor.predict(args.model, args.gpu, nodes, per_node(args.count, nodes))
    if p.days_central is None:
        raise CliError(f"{args.model} on {nodes}x{args.count // nodes} {args.gpu}: not measured here ({source}) and "
                       f"no prediction: {p.status}: {p.why or p.note or ''}")  # fmt: skip
    _, median = startup_median(cells)
    basis = (f"PREDICTED (not measured): {p.days_optimistic:.3g} .. {p.days_pessimistic or float('nan'):.3g} days, "
             f"central {p.days_central:.3g}; measured error of that kind {p.model_error}")  # fmt: skip
    start_basis = "the median of the sweep's cells" if median is not None else "not measured"
    return [Setting(args.model, args.gpu, nodes, p.gpus_per_node, p.method or "?", p.days_central * 24, basis,
                    startup_s=median, startup_basis=start_basis)], f"predicted: cells {cells_source}"  # fmt: skip


def render_json(a: When) -> str:
    return json.dumps({"rows": a.rows, "source": a.source, "checkpoint_rate": a.checkpoint_rate,
                       "config_source": a.config_source}, indent=1, default=str)  # fmt: skip


def segments_line(r: dict[str, Any]) -> str:
    """The segments and what they lose: one job loses its start-up, not a restart (there is none)."""
    limit = f"jobs of at most {r['job_limit_h'] * 60:g} min" if r["job_limit_h"] else "one job, no time limit"
    lost, each = units.duration_s(r["restart_loss_h"] * 3600), units.duration_s(r["restart_s"])
    if r["segments"] == 1:
        return f"  segments: 1 ({limit}), {lost} of start-up - start-up {each}: {r['restart_basis']}"
    return (f"  segments: {r['segments']} ({limit}), {lost} lost to start-ups and restarts - restart {each}: "
            f"{r['restart_basis']}")  # fmt: skip


def render_text(a: When) -> str:
    now = a.now.isoformat(timespec="minutes")
    lines = []
    for r in a.rows:
        lines.append(f"{r['model']} on {r['nodes']}x{r['gpus_per_node']} {r['gpu']} ({r['method']}), if submitted "
                     f"now ({now}):")  # fmt: skip
        lines.append(f"  compute: {_days(r['compute_days'])} - {r['compute_basis']}")
        if r["segments"] is None:
            lines.append(f"  finish: unknown - {r['note']}")
            continue
        lines.append(segments_line(r))
        start = r["expected_start"].replace("T", " ")
        lines.append(f"  start: {start} - {r['wait_basis']}")
        if r["requeue_wait_h"] is not None:
            lines.append(f"  each requeued job waits {units.duration_s(r['requeue_wait_h'] * 3600)}")
        finish = r["expected_finish"].replace("T", " ")
        lines.append(f"  finish: {finish}" + (f" ({_days(r['calendar_days'])} of calendar time)"
                                              if r["calendar_days"] is not None
                                              else " (a wait it needs is unknown)"))  # fmt: skip
        if r["note"]:
            lines.append(f"  note: {r['note']}")
    lines.append(f"  (compute {a.source}; {a.config_source})")
    return "\n".join(lines)
