"""`pretrain-planner fit`: the inverse question, what fits in --days on --count x --gpu, per catalog model
(tables/whatif.fit_table: measured, else predicted); with --by DATE, each model's fastest setting put on the
calendar (tables/calendar.py: segments, restarts, the queue asked of the scheduler), ranked by when it finishes."""

from __future__ import annotations

import argparse
import json
import textwrap
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pretrain_planner.cli.config import CliError, context, per_node
from pretrain_planner.cli.sources import calendar_site, cells_or_none, predictor_of, startup_median, time_to_train

FIT_LEGEND = (
    "yes = measured within the days, or even the pessimistic end of the prediction is; likely = the central "
    "prediction is; maybe = only the optimistic end (or the physics bound: the days at the `suspect` share of the "
    "dense peak, where nothing of its kind was measured) is; no = not even that"
)


@dataclass
class Fits:
    """What fits in `days`: the fit table (one row per model) and where its parts came from."""

    table: Any  # polars DataFrame, tables/whatif.FIT_COLUMNS
    gpu: str
    nodes: int
    count: int
    days: float
    source: str  # the cells
    measured_source: str
    config_source: str


@dataclass
class FitsBy:
    """What finishes by `by`: per model its fastest setting's finish if submitted `now`, ranked."""

    by: datetime
    now: datetime
    rows: list[dict[str, Any]]
    gpu: str
    nodes: int
    gpus_per_node: int
    sources: str
    checkpoint_rate: str  # how the checkpoint rate was known
    config_source: str


def query(args: argparse.Namespace) -> Fits | FitsBy:
    from pretrain_planner.tables import whatif

    config, results, catalog = context(args)  # unknown names: the catalog's known ones
    models = args.model or None
    for m in models or []:
        catalog.model(m)
    predictor, source = predictor_of(config, catalog, results)
    try:
        measured, measured_source = time_to_train(results, config)
    except CliError:
        measured, measured_source = None, f"nothing measured in {results}"
    by = _by_date(args.by) if args.by else None
    days = args.days if by is None else (by - by.now()).total_seconds() / 86400
    table = whatif.fit_table(predictor, args.gpu, args.nodes, per_node(args.count, args.nodes), days, models,
                             measured)  # fmt: skip
    if by is not None:
        return _fits_by(args, config, catalog, results, table, by, f"measured: {measured_source}; cells: {source}")
    return Fits(table, args.gpu, args.nodes, args.count, args.days, source, measured_source, args.answer_source)


def _by_date(text: str) -> datetime:
    """--by: a date (2027-03-01, the start of that day) or a date and time, local, in the future."""
    try:
        by = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"--by {text!r} is not a date: write it as YYYY-MM-DD (e.g. 2027-03-01) or "
                       "YYYY-MM-DDTHH:MM") from None  # fmt: skip
    if by <= datetime.now():
        raise CliError(f"--by {text}: that is not in the future (now {datetime.now().isoformat(timespec='minutes')})")
    return by


def _fits_by(args: argparse.Namespace, config: dict[str, Any], catalog, results, table, by: datetime,
             sources: str) -> FitsBy:  # fmt: skip
    """`fit --by DATE`: each model's fastest setting (measured, else predicted) put on the calendar
    (tables/calendar.py: segments, restarts, the queue asked of the scheduler), ranked by when it finishes."""
    from pretrain_planner.tables.calendar import Setting, price

    cells, _ = cells_or_none(results, catalog)
    keyed, median = startup_median(cells)
    where = calendar_site(config, [args.gpu])
    gpn = args.count // args.nodes
    out = []
    for r in table.iter_rows(named=True):
        row = {"model": r["model"], "method": r["method"], "basis": r["basis"], "compute_days": r["days"],
               "finish": None, "by": "unknown", "why": None}  # fmt: skip
        if r["days"] is None or not r["method"]:
            row["why"] = r["why"] or "no compute days"
            out.append(row)
            continue
        start = keyed.get((r["model"], args.gpu, args.nodes, gpn, r["method"]))
        basis = "measured" if start is not None else "the median of the sweep's cells"
        s = Setting(r["model"], args.gpu, args.nodes, gpn, r["method"], r["days"] * 24, r["basis"],
                    startup_s=start if start is not None else median, startup_basis=basis)  # fmt: skip
        cal = price(s, catalog, where)
        row["finish"] = cal["expected_finish"]
        left = (by - where.now).total_seconds() / 86400
        if cal["calendar_days"] is not None:
            row["by"] = "yes" if cal["calendar_days"] <= left else "no"
        elif r["days"] > left:  # the compute alone is longer: no wait or restart can make it
            row["by"] = "no"
        row["why"] = cal["note"] if cal["calendar_days"] is None else (
            f"{cal['segments']} segment(s); start {cal['expected_start']} ({cal['wait_basis']})")  # fmt: skip
        out.append(row)
    order = {"yes": 0, "unknown": 1, "no": 2}
    out.sort(
        key=lambda x: (
            order[x["by"]],
            x["finish"] if x["finish"] not in (None, "unknown") else "~",
            x["compute_days"] if x["compute_days"] is not None else float("inf"),
        )
    )
    return FitsBy(by, where.now, out, args.gpu, args.nodes, gpn, sources, where.measured_how, args.answer_source)


# ------------------------------------------------------------------------------------------------ rendering


def render_json(a: Fits | FitsBy) -> str:
    if isinstance(a, FitsBy):
        return json.dumps({"by": a.by.isoformat(), "rows": a.rows, "sources": a.sources,
                           "config_source": a.config_source}, indent=1, default=str)  # fmt: skip
    return json.dumps({"rows": a.table.to_dicts(), "cells": a.source, "measured": a.measured_source,
                       "config_source": a.config_source}, indent=1)  # fmt: skip


def render_text(a: Fits | FitsBy) -> str:
    return _text_by(a) if isinstance(a, FitsBy) else _text(a)


def _text(a: Fits) -> str:
    import polars as pl

    from pretrain_planner.tables import views
    from pretrain_planner.tables.markdown import to_markdown

    lines = [
        f"What fits in {a.days:g} days on {a.nodes}x{a.count // a.nodes} {a.gpu}: the recipe's run per model, "
        f"measured or PREDICTED (predictions are not measurements)\n",
        to_markdown(views.view("fit", a.table)),
    ]
    other = a.table.filter(pl.col("basis").is_in(["bound only", "does not fit", "invalid", "no peak"]))
    for basis, model, why in other.select("basis", "model", "why").iter_rows():
        what = "physics bound only" if basis == "bound only" else basis
        lines.append(textwrap.fill(f"{model}: {what}: {why}", 120, subsequent_indent="  ", break_on_hyphens=False))
    lines.append(textwrap.fill(f"fits: {FIT_LEGEND}", 120, subsequent_indent="  ", break_on_hyphens=False))
    lines.append(f"(measured: {a.measured_source}; cells: {a.source}; {a.config_source})")
    return "\n".join(lines)


def _text_by(a: FitsBy) -> str:
    from pretrain_planner.tables.markdown import table as md_table

    cols = ["model", "method", "basis", "compute_days", "finish", "by", "why"]
    return "\n".join([
        f"What finishes by {a.by.isoformat(timespec='minutes')} on {a.nodes}x{a.gpus_per_node} {a.gpu}, if submitted "
        f"now ({a.now.isoformat(timespec='minutes')}): compute measured or PREDICTED, then segments, restarts and "
        "the queue wait (tables/calendar.py)\n",
        md_table(cols, [[x[c] for c in cols] for x in a.rows], keys=1),
        f"({a.sources}; checkpoint rate {a.checkpoint_rate}; {a.config_source})",
    ])  # fmt: skip
