"""`pretrain-planner best`: the best measured setting of --model on --gpu (its method, days, loss check, cost, the
layouts measured beside it, the methods that ran out of memory there with their fixes), or, where nothing measured
fits, why and the cheapest fix (tables/memfix.py)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.cli.config import CliError, config_catalog, context, costs_of
from pretrain_planner.cli.sources import cells_here, time_to_train
from pretrain_planner.planning import losscheck
from pretrain_planner.results import throughput_text
from pretrain_planner.tables import units
from pretrain_planner.tables.units import days as _days
from pretrain_planner.tables.units import usd


@dataclass
class Best:
    """The fastest measured setting (`pick`, a time_to_train row) and what is said beside it."""

    pick: dict[str, Any]
    price: Any  # tables.costs.Price, or None (then `price_error` says why)
    price_error: str
    plan: Path | None  # the exported plan's folder, where there is one
    others: list[dict[str, Any]]  # the other layouts measured (the same count, or any)
    oom: list[dict[str, Any]]  # the cells of the pick's setting that ran out of memory, with their fixes
    source: str
    allow_differs: bool
    config_source: str


@dataclass
class NoFit:
    """Nothing measured fits: per layout of --count, the need against the GPU's memory and the cheapest fix."""

    model: str
    gpu: str
    settings: list[dict[str, Any]]  # feasibility rows explained (tables/memfix.explain_settings)
    known: str  # the settings of the model measured
    source: str


def query(args: argparse.Namespace) -> Best | NoFit:
    import polars as pl

    from pretrain_planner.tables import costs

    config, results, catalog = context(args)  # unknown names: the catalog's known ones
    ttt, source = time_to_train(results, config, args.allow_differs)
    sel = ttt.filter((pl.col("model") == args.model) & (pl.col("gpu") == args.gpu))
    if args.count is not None:
        sel = sel.filter(pl.col("world_size") == args.count)
    if args.nodes is not None:
        sel = sel.filter(pl.col("nodes") == args.nodes)
    sel = sel.filter(pl.col("training_days").is_not_null() | pl.col("step_time_s").is_not_null())
    if sel.is_empty():
        have = ttt.filter(pl.col("model") == args.model).select("gpu", "nodes", "gpus_per_node").rows()
        known = ", ".join(f"{g} {n}x{k}" for g, n, k in have) or "none"
        settings = _no_fit(results, config, args)
        if settings is not None:
            return NoFit(args.model, args.gpu, settings, known, source)
        raise CliError(
            f"no measured setting for {args.model} on {args.count or 'any number of'} {args.gpu} GPUs in {source}; "
            f"measured settings of {args.model}: {known}"
        )
    sel = sel.sort(pl.col("training_days").fill_null(float("inf")), "step_time_s")
    r = sel.row(0, named=True)
    price_error = ""
    try:
        catalog = config_catalog(config, models=False)
        years = costs_of(config).amortisation_years
        p = costs.price(catalog.gpus.get(r["gpu"]), r["gpu"], r["nodes"], r["gpus_per_node"], r["training_days"],
                        catalog.base_machine_usd, years, catalog.gpus_path)  # fmt: skip
    except Exception as exc:  # a broken price file must not hide the measurement
        p, price_error = None, str(exc)
    folder = layout.optimal_dir(results, r["model"], r["gpu"], r["nodes"], r["gpus_per_node"])
    others = list(sel.tail(-1).iter_rows(named=True)) if sel.height > 1 else []
    oom = [] if args.json else list(_oom_cells(results, config, r).iter_rows(named=True))  # the text says them
    if (r.get("loss") or losscheck.NOT_CHECKED) == losscheck.NOT_CHECKED:
        r = {**r, "loss_note": _why_unchecked(results, config, r)}
    return Best(r, p, price_error, folder if folder.is_dir() else None, others, oom, source, args.allow_differs,
                args.answer_source)  # fmt: skip


def _why_unchecked(results: Path, config: dict[str, Any], r: dict[str, Any]) -> str:
    """Why the pick has no loss verdict: the plan's reason (mode off, naive not swept), else its setting's check
    record's (planning/losscheck.why_unchecked)."""
    import polars as pl

    from pretrain_planner.tables import aggregate

    table = layout.table(results, "loss_check.csv")
    if table.is_file():  # the pipeline's: the setting's `unchecked` line, or the pick's own line, says why
        mine = aggregate.read_table(table).filter(*[pl.col(k) == r[k] for k in aggregate.GROUP])
        said = mine.filter((pl.col("role") == aggregate.UNCHECKED) | (pl.col("method") == r["best_method"]))
        notes = said["note"].drop_nulls().to_list()
        if notes:
            return str(notes[0])
    conf = losscheck.settings((config.get("benchmark") or {}).get("loss_check"))
    folder = layout.setting_folder(r["model"], r["gpu"], r["nodes"], r["gpus_per_node"])
    record = losscheck.read(Path(layout.loss_check_dir(results, folder)) / layout.LOSS_CURVES)
    methods = (config.get("sweep") or {}).get("methods") or []
    return losscheck.why_unchecked(r["best_method"], record, conf, methods)


def _cells_explained(results: Path, config: dict[str, Any]):
    """The cells with their memory fixes (tables/cells.parquet, else aggregated here) and the catalog."""
    import polars as pl

    from pretrain_planner.tables import memfix

    try:
        catalog = config_catalog(config)
    except Exception:
        catalog = None
    parquet = layout.table(results, "cells.parquet")
    if parquet.is_file():
        cells = pl.read_parquet(parquet)
        if "cheapest_fix" in cells.columns:
            return cells, catalog
    elif not layout.all_results(results):
        return None, catalog
    else:
        cells, _ = cells_here(results, catalog, "tables/cells.parquet")
    for col in memfix.FIX_COLUMNS:  # an older table: explain it here
        if col in cells.columns:
            cells = cells.drop(col)
    return memfix.explain_cells(cells, catalog), catalog


def _oom_cells(results: Path, config: dict[str, Any], r: dict[str, Any]):
    """The `oom` cells of the best setting's model, GPU type and layout, with their fixes."""
    import polars as pl

    cells, _ = _cells_explained(results, config)
    if cells is None or "cheapest_fix" not in cells.columns:
        return pl.DataFrame()
    same = [pl.col(k) == r[k] for k in ("model", "gpu", "nodes", "gpus_per_node")]
    return cells.filter(pl.col("status") == "oom", *same)


def _no_fit(results: Path, config: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """Nothing measured fits: per layout of --count, the feasibility row with why (the need at micro-batch 1
    against the GPU's memory) and the cheapest fix (tables/memfix.py). None when there is no such setting (nothing
    was measured there)."""
    import polars as pl

    from pretrain_planner.tables import aggregate, memfix

    cells, catalog = _cells_explained(results, config)
    if cells is None:
        return None
    here = (pl.col("model") == args.model) & (pl.col("gpu") == args.gpu)
    if args.count is not None:
        here &= pl.col("world_size") == args.count
    if args.nodes is not None:
        here &= pl.col("nodes") == args.nodes
    mine = cells.filter(here)
    if mine.is_empty() or not (mine["status"] == "oom").any():
        return None
    feas = memfix.explain_settings(aggregate.feasibility(mine, aggregate.time_to_train(mine)), mine, catalog)
    return list(feas.sort("world_size", "nodes").iter_rows(named=True))


# ------------------------------------------------------------------------------------------------ rendering


def _need_text(r: dict[str, Any], method: str) -> str:
    """'> 24 GiB per GPU at micro-batch 1 with fl (out of memory measured on ...); the GPU has 24 GiB'"""
    from pretrain_planner.tables.memfix import need_text

    if r.get("need_gib") is None:
        return f"an unknown amount at micro-batch 1 with {method}"
    mem = f"; the GPU has {units.gib(r['gpu_memory_gib'])}" if r.get("gpu_memory_gib") else ""
    need = need_text(r["need_gib"], r["need_source"])
    return f"{need} per GPU at micro-batch 1 with {method} ({r['need_source']}){mem}"


def _loss_line(r: dict[str, Any], allow_differs: bool) -> str:
    """What the loss check said of the pick, and the faster methods passed over because they train another model."""
    verdict = r.get("loss") or "not checked"
    if verdict.startswith("differs"):
        verdict += " -- picked anyway (--allow-differs): it does not train the same model as naive"
    elif verdict == losscheck.NOT_CHECKED:
        verdict += f" ({r.get('loss_note') or 'no check record'})"
    passed = r.get("passed_over")
    if passed:
        verdict += f"; passed over, faster but training another model: {passed} (--allow-differs takes them)"
    return verdict


def render_no_fit(a: NoFit) -> str:
    lines = []
    for f in a.settings:
        lines.append(f"{a.model} on {f['nodes']}x{f['gpus_per_node']} {a.gpu}: nothing fits ({f['verdict']})")
        if f.get("cheapest_fix"):
            lines.append(f"  needs {_need_text(f, f['need_method'])}")
            lines.append(f"  cheapest fix: {f['cheapest_fix']}")
            if f.get("other_fixes"):
                lines.append(f"  other fixes: {f['other_fixes']}")
    lines.append(f"  measured settings of {a.model}: {a.known} (from {a.source})")
    return "\n".join(lines)


def render_json(a: Best) -> str:
    return json.dumps({**a.pick, "price": a.price.to_dict() if a.price else None,
                       "plan": str(a.plan) if a.plan else None, "source": a.source,
                       "config_source": a.config_source}, indent=1, default=str)  # fmt: skip


def render_text(a: Best) -> str:
    r, p = a.pick, a.price
    days = _days(r["training_days"]) if r["training_days"] is not None else "days unknown (no step count)"
    lines = [f"{r['model']} on {r['nodes']}x{r['gpus_per_node']} {r['gpu']}: best method {r['best_method']}, {days}",
             f"  loss check: {_loss_line(r, a.allow_differs)}",
             *([f"  {r['tie']}"] if r.get("tie") else []),
             f"  micro-batch {r['micro_batch']} x {r['grad_accum_steps']} accumulation steps per GPU; step "
             f"{units.step(r['step_time_s'])} (p10 {units.step(r['step_time_p10_s'])}, "
             f"p90 {units.step(r['step_time_p90_s'])})"]  # fmt: skip
    extra = []
    if r.get("mfu") is not None:
        measured = " of a peak measured on the host, not a datasheet" if r.get("peak_kind") == "measured" else ""
        extra.append(f"MFU {units.percent(r['mfu'])}{measured}")
    if throughput_text(r):
        extra.append(throughput_text(r))
    for m in ("naive", "fl"):
        if r.get(f"days_{m}") is not None:
            extra.append(f"{m} alone {_days(r[f'days_{m}'])} ({units.times(r[f'speedup_vs_{m}'])})")
    if extra:
        lines.append("  " + "; ".join(extra))
    if p is not None:
        lines.append(f"  cost: hardware {usd(p.hardware_usd)}, amortised {usd(p.amortised_usd)} "
                     f"({p.amortisation_years:g} years), cloud {usd(p.cloud_usd)}")  # fmt: skip
        lines += [f"  note: {note}" for note in p.notes]
    else:
        lines.append(f"  cost: unknown ({a.price_error})")
    if a.others:
        others = ", ".join(f"{o['nodes']}x{o['gpus_per_node']} {o['best_method']}" for o in a.others)
        lines.append(f"  other layouts measured: {others}")
    for o in a.oom:
        lines.append(f"  out of memory here: needs {_need_text(o, o['method'])}; fix: {o['cheapest_fix']}")
    if a.plan is not None:
        lines.append(f"  plan: {a.plan}/ (training_arguments.json, launch.sh)")
    lines.append(f"  (from {a.source}; {a.config_source})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    a = query(args)
    if isinstance(a, NoFit):
        print(render_no_fit(a))
        return 1
    print(render_json(a) if args.json else render_text(a))
    return 0
