"""`pretrain-planner` (also `python -m pretrain_planner`): price a setting, look up the best measured one,
see where a sweep stands. Reads config files and results only; imports no torch.

  pretrain-planner cost --gpu a100 --count 4 --days 17.57
  pretrain-planner best --model pythia-1b --gpu a100 --count 4 [--results results]
  pretrain-planner predict --model pythia-1b --gpu h100 --count 4
  pretrain-planner fit --gpu a100 --count 4 --days 14
  pretrain-planner status [--results results] [--watch [--every 2]]
  pretrain-planner train --plan results/optimal/tiny-gptneox/cpu/1x1 [--launcher local|slurm|debug] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.results import throughput_text
from pretrain_planner.tables import units
from pretrain_planner.tables.units import days as _days
from pretrain_planner.tables.units import usd

REPO = Path(__file__).resolve().parents[2]  # the checkout (config/ lives there); unused when installed elsewhere
DEFAULT_CONFIG = "config/config.yaml"


class CliError(Exception):
    pass


def _resolve(path: str) -> Path:
    """Relative to the working directory, else to the checkout (like the Snakefile's paths)."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    return REPO / p


def load_config(args: argparse.Namespace) -> dict[str, Any]:
    """--config alone (as Snakemake's --configfile: the demo sweep is not merged under it), else the demo
    sweep config/config.yaml; validated, defaults in."""
    from pretrain_planner.schema import load_yaml, validate

    path = _resolve(args.config) if args.config else _resolve(DEFAULT_CONFIG)
    config = (load_yaml(path) if args.config or path.is_file() else {}) or {}
    source = args.config or str(path)
    if "sweep" not in config:  # no sweep at hand: only the keys the CLI needs
        config["sweep"] = {"models": ["-"], "gpus": ["-"]}
    validate(config, "config", source)
    if args.models:
        config["catalog"]["models"] = args.models
    if args.gpus:
        config["catalog"]["gpus"] = args.gpus
    if getattr(args, "results", None):
        config["results"] = args.results
    return config


def _catalog(config: dict[str, Any], models: bool = True):
    from pretrain_planner.planning.catalog import Catalog, load_catalog, load_gpus

    gpus_path = _resolve(config["catalog"]["gpus"])
    prices = (config.get("costs") or {}).get("prices")  # the sweep's own prices over the catalog's (the demo's cpu)
    if models:
        return load_catalog(_resolve(config["catalog"]["models"]), gpus_path).with_prices(prices)
    gpus, base = load_gpus(gpus_path)
    return Catalog({}, gpus, base, config["catalog"]["models"], str(gpus_path)).with_prices(prices)


def _results_dir(config: dict[str, Any]) -> Path:
    return Path(config["results"])


def _positive(kind: type):
    """An argparse type: a number of `kind` above zero (a count, days, years), else a clear error."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text} must be a positive {'integer' if kind is int else 'number'}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _split(count: int, nodes: int) -> int:
    if count < 1 or nodes < 1 or count % nodes:
        raise CliError(f"--count {count} GPUs cannot be spread evenly over --nodes {nodes}")
    return count // nodes


# ------------------------------------------------------------------------------------------- commands


def cmd_cost(args: argparse.Namespace) -> int:
    from pretrain_planner.tables import costs

    config = load_config(args)
    catalog = _catalog(config, models=False)
    if args.gpu not in catalog.gpus:
        raise CliError(f"{catalog.gpus_path}: no GPU type {args.gpu!r}; known: {', '.join(catalog.gpus)}")
    gpn = _split(args.count, args.nodes)
    years = args.years or costs.settings(config.get("costs"))["amortisation_years"]
    p = costs.price(catalog.gpus[args.gpu], args.gpu, args.nodes, gpn, args.days, catalog.base_machine_usd, years,
                    catalog.gpus_path)  # fmt: skip
    if args.json:
        print(json.dumps(p.to_dict(), indent=1))
        return 0
    g = catalog.gpus[args.gpu]
    days = f", {args.days:g} days" if args.days is not None else ""
    print(f"{args.count} x {g.label} ({args.gpu}) on {args.nodes} node(s){days}")
    hw_how = (
        f"{args.nodes} x base machine for {gpn} GPUs {usd(p.base_machine_usd)} + {args.count} x {usd(p.gpu_price_usd)}"
    )
    print(f"  hardware   {usd(p.hardware_usd):>12}   {hw_how if p.hardware_usd is not None else ''}".rstrip())
    if args.days is not None:
        print(f"  amortised  {usd(p.amortised_usd):>12}   hardware x {args.days:g} days / ({years:g} years x 365)")
        rate = f"{usd(p.cloud_usd_per_gpu_hour)}/GPU-hour x {p.gpu_hours:,.1f} GPU-hours"
        print(f"  cloud      {usd(p.cloud_usd):>12}   {rate if p.cloud_usd is not None else ''}".rstrip())
    for note in p.notes:
        print(f"  note: {note}")
    return 0


def _time_to_train(results: Path, config: dict[str, Any]):
    """tables/time_to_train.csv if the pipeline wrote it, else the cell results aggregated here."""
    from pretrain_planner.tables import aggregate

    table = layout.table(results, "time_to_train.csv")
    if table.is_file():
        return aggregate.read_table(table), str(table)
    try:
        catalog = _catalog(config)
    except Exception:
        catalog = None
    cells, source = _cells_here(results, catalog, "tables/time_to_train.csv")
    return aggregate.time_to_train(cells), source


def _cells_here(results: Path, catalog, table: str):
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


def cmd_best(args: argparse.Namespace) -> int:
    import polars as pl

    from pretrain_planner.tables import costs

    config = load_config(args)
    results = _results_dir(config)
    ttt, source = _time_to_train(results, config)
    sel = ttt.filter((pl.col("model") == args.model) & (pl.col("gpu") == args.gpu))
    if args.count is not None:
        sel = sel.filter(pl.col("world_size") == args.count)
    if args.nodes is not None:
        sel = sel.filter(pl.col("nodes") == args.nodes)
    sel = sel.filter(pl.col("training_days").is_not_null() | pl.col("step_time_s").is_not_null())
    if sel.is_empty():
        have = ttt.filter(pl.col("model") == args.model).select("gpu", "nodes", "gpus_per_node").rows()
        known = ", ".join(f"{g} {n}x{k}" for g, n, k in have) or "none"
        if _explain_no_fit(results, config, args):
            print(f"  measured settings of {args.model}: {known} (from {source})")
            return 1
        raise CliError(
            f"no measured setting for {args.model} on {args.count or 'any number of'} {args.gpu} GPUs in {source}; "
            f"measured settings of {args.model}: {known}"
        )
    sel = sel.sort(pl.col("training_days").fill_null(float("inf")), "step_time_s")
    r = sel.row(0, named=True)
    try:
        catalog = _catalog(config, models=False)
        conf = costs.settings(config.get("costs"))
        p = costs.price(catalog.gpus.get(r["gpu"]), r["gpu"], r["nodes"], r["gpus_per_node"], r["training_days"],
                        catalog.base_machine_usd, conf["amortisation_years"], catalog.gpus_path)  # fmt: skip
    except Exception as exc:  # a broken price file must not hide the measurement
        p, price_error = None, str(exc)
    folder = layout.optimal_dir(results, r["model"], r["gpu"], r["nodes"], r["gpus_per_node"])
    if args.json:
        print(json.dumps({**r, "price": p.to_dict() if p else None, "plan": str(folder) if folder.is_dir() else None,
                          "source": source}, indent=1, default=str))  # fmt: skip
        return 0
    days = _days(r["training_days"]) if r["training_days"] is not None else "days unknown (no step count)"
    print(f"{r['model']} on {r['nodes']}x{r['gpus_per_node']} {r['gpu']}: best method {r['best_method']}, {days}")
    print(
        f"  micro-batch {r['micro_batch_size']} x {r['grad_accum_steps']} accumulation steps per GPU; step "
        f"{units.step(r['step_time_s'])} (p10 {units.step(r['step_time_p10_s'])}, "
        f"p90 {units.step(r['step_time_p90_s'])})"
    )
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
        print("  " + "; ".join(extra))
    if p is not None:
        print(
            f"  cost: hardware {usd(p.hardware_usd)}, amortised {usd(p.amortised_usd)} "
            f"({p.amortisation_years:g} years), cloud {usd(p.cloud_usd)}"
        )
        for note in p.notes:
            print(f"  note: {note}")
    else:
        print(f"  cost: unknown ({price_error})")
    if sel.height > 1:
        others = ", ".join(
            f"{o['nodes']}x{o['gpus_per_node']} {o['best_method']}" for o in sel.tail(-1).iter_rows(named=True)
        )
        print(f"  other layouts measured: {others}")
    for o in _oom_cells(results, config, r).iter_rows(named=True):
        print(f"  out of memory here: needs {_need_text(o, o['method'])}; fix: {o['cheapest_fix']}")
    if folder.is_dir():
        print(f"  plan: {folder}/ (training_arguments.json, launch.sh)")
    print(f"  (from {source})")
    return 0


def _need_text(r: dict[str, Any], method: str) -> str:
    """'> 24 GiB per GPU at micro-batch 1 with fl (out of memory measured on ...); the GPU has 24 GiB'"""
    from pretrain_planner.tables.memfix import need_text

    if r.get("need_gib") is None:
        return f"an unknown amount at micro-batch 1 with {method}"
    mem = f"; the GPU has {units.gib(r['gpu_memory_gib'])}" if r.get("gpu_memory_gib") else ""
    need = need_text(r["need_gib"], r["need_source"])
    return f"{need} per GPU at micro-batch 1 with {method} ({r['need_source']}){mem}"


def _cells_explained(results: Path, config: dict[str, Any]):
    """The cells with their memory fixes (tables/cells.parquet, else aggregated here) and the catalog."""
    import polars as pl

    from pretrain_planner.tables import memfix

    try:
        catalog = _catalog(config)
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
        cells, _ = _cells_here(results, catalog, "tables/cells.parquet")
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


def _explain_no_fit(results: Path, config: dict[str, Any], args: argparse.Namespace) -> bool:
    """Nothing measured fits: print, per layout of --count, why (the need at micro-batch 1 against the GPU's memory)
    and the cheapest fix (tables/memfix.py). False when there is no such setting (nothing was measured there)."""
    import polars as pl

    from pretrain_planner.tables import aggregate, memfix

    cells, catalog = _cells_explained(results, config)
    if cells is None:
        return False
    here = (pl.col("model") == args.model) & (pl.col("gpu") == args.gpu)
    if args.count is not None:
        here &= pl.col("world_size") == args.count
    if args.nodes is not None:
        here &= pl.col("nodes") == args.nodes
    mine = cells.filter(here)
    if mine.is_empty() or not (mine["status"] == "oom").any():
        return False
    feas = memfix.explain_settings(aggregate.feasibility(mine, aggregate.time_to_train(mine)), mine, catalog)
    for f in feas.sort("world_size", "nodes").iter_rows(named=True):
        print(f"{args.model} on {f['nodes']}x{f['gpus_per_node']} {args.gpu}: nothing fits ({f['verdict']})")
        if f.get("cheapest_fix"):
            print(f"  needs {_need_text(f, f['need_method'])}")
            print(f"  cheapest fix: {f['cheapest_fix']}")
            if f.get("other_fixes"):
                print(f"  other fixes: {f['other_fixes']}")
    return True


def _cells_or_none(results: Path, catalog):
    """The cells measured here (tables/cells.parquet, else the cell results), or an empty table and why: a fresh
    install predicts from the public evidence alone."""
    import polars as pl

    from pretrain_planner.tables import whatif

    parquet = layout.table(results, "cells.parquet")
    if parquet.is_file():
        return pl.read_parquet(parquet), str(parquet)
    if layout.all_results(results):
        return _cells_here(results, catalog, "tables/cells.parquet")
    return whatif.empty_cells(), f"no cells measured in {results}: public evidence only"


def _predictor(config: dict[str, Any], catalog, results: Path):
    from pretrain_planner.schema import section
    from pretrain_planner.tables import whatif

    cells, source = _cells_or_none(results, catalog)
    limit = section("config", "benchmark", config.get("benchmark"))["suspect_mfu"]
    return whatif.Predictor(cells, catalog, limit, config.get("costs")), source


def _band(opt: float | None, central: float | None, pess: float | None) -> str:
    band = f"{_days(opt)} (optimistic)" if opt is not None else "?"
    if central is not None:
        band += f" / {_days(central)} (central)"
    return band + (f" / {_days(pess)} (pessimistic)" if pess is not None else " / no pessimistic end")


def cmd_predict(args: argparse.Namespace) -> int:
    """Days and cost on a GPU type you may not own, predicted from measurements on others (tables/whatif.py): your
    cells where there are some, else the public evidence shipped with the planner."""
    from pretrain_planner.planning.evidence import SOURCES_MD
    from pretrain_planner.tables import whatif

    config = load_config(args)
    results = _results_dir(config)
    catalog = _catalog(config)
    catalog.model(args.model), catalog.gpu(args.gpu)  # unknown names: a clear error
    predictor, source = _predictor(config, catalog, results)
    p = predictor.predict(args.model, args.gpu, args.nodes, _split(args.count, args.nodes))
    if args.json:
        print(json.dumps({**p.to_dict(), "source": source}, indent=1))
        return 0
    kind = f" from {p.evidence}" if p.evidence else ""
    print(f"PREDICTION (not a measurement): {args.model} on {args.nodes}x{p.gpus_per_node} {args.gpu}: "
          f"{p.status}{kind}")  # fmt: skip
    if p.days_optimistic is not None:
        print(f"  days to train: {_band(p.days_optimistic, p.days_central, p.days_pessimistic)}")
    if p.method:
        print(f"  assumes {p.method}: {p.why}")
        print(f"  compute MFU {units.percent(p.mfu_low)} .. {units.percent(p.mfu_high)} (central "
              f"{units.percent(p.mfu_central)})")  # fmt: skip
        print(f"  rests on: {p.rests_on}")
        if p.evidence == whatif.PUBLIC:
            print(f"  sources: {p.sources} (each described in {SOURCES_MD})")
        print(f"  kind of transfer: {p.transfer}")
        print(f"  measured error of that kind (out of sample): {p.model_error}")
    elif p.why:
        print(f"  {p.why}")
    if p.amortised_usd_optimistic is not None or p.hardware_usd is not None:
        print(f"  cost: hardware {usd(p.hardware_usd)}, amortised {usd(p.amortised_usd_optimistic)} .. "
              f"{usd(p.amortised_usd_pessimistic)}")  # fmt: skip
    if p.measured_days is not None:
        print(f"  measured here: {_days(p.measured_days)} (not used for the prediction)")
    if p.note:
        print(f"  note: {p.note}")
    print(f"  (cells: {source})")
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    """The inverse question: what fits in --days on --count x --gpu, per catalog model (tables/whatif.fit_table)."""
    from pretrain_planner.tables import whatif

    config = load_config(args)
    results = _results_dir(config)
    catalog = _catalog(config)
    catalog.gpu(args.gpu)
    models = args.model or None
    for m in models or []:
        catalog.model(m)
    predictor, source = _predictor(config, catalog, results)
    try:
        measured, measured_source = _time_to_train(results, config)
    except CliError:
        measured, measured_source = None, f"nothing measured in {results}"
    table = whatif.fit_table(predictor, args.gpu, args.nodes, _split(args.count, args.nodes), args.days, models,
                             measured)  # fmt: skip
    if args.json:
        print(json.dumps({"rows": table.to_dicts(), "cells": source, "measured": measured_source}, indent=1))
        return 0
    print(f"What fits in {args.days:g} days on {args.nodes}x{args.count // args.nodes} {args.gpu} (the recipe's run; "
          f"predictions are not measurements):")  # fmt: skip
    for r in table.iter_rows(named=True):
        if r["days"] is None:
            print(f"  {r['model']:<20} {r['fits']:<10} {r['why']}")
            continue
        days = _days(r["days"]) + (
            "" if r["basis"] == "measured" else f" [{_days(r['days_optimistic'])} - {_days(r['days_pessimistic'])}]"
        )
        reach = f"{units.number(r['tokens_in_time'] / 1e9)}B {r['unit']}, {units.percent(r['share_of_run'])} of the run"
        print(f"  {r['model']:<20} {r['fits']:<10} {r['method'] or '-':<13} {days} ({r['basis']}); in "
              f"{args.days:g} days {reach}")  # fmt: skip
    print(f"  measured: {measured_source}; cells: {source}")
    print(
        "  fits: yes = even the pessimistic end is within the days (or measured so); likely = the central value is; "
        "maybe = only the optimistic end is; no = not even that"
    )
    return 0


def _status_snapshot(args: argparse.Namespace, config: dict[str, Any], results: Path):
    """(summary, cells, plan source): plan.csv when the pipeline wrote it, else the config's plan."""
    from pretrain_planner.tables import status

    plan = status.load_plan(results)
    plan_source = str(results / layout.PLAN)
    if plan is None:
        import polars as pl

        from pretrain_planner.planning.pipeline import load

        pipe = load(config, REPO, args.config or DEFAULT_CONFIG)
        plan = pl.DataFrame(pipe.rows())
        plan_source = f"{args.config or DEFAULT_CONFIG} (no {results}/plan.csv yet)"
    summary, cells = status.sweep_status(results, plan)
    return summary, cells, plan_source


def _driver_note(results: Path) -> str:
    from pretrain_planner.launch import driver

    rec = driver.other_driver(results)
    if rec is None:
        return "no driver is working on this folder now (cells already submitted to SLURM may still finish)"
    return f"driver: pid {rec.get('pid')} on {rec.get('host')}, started {rec.get('started_at')}"


def cmd_status(args: argparse.Namespace) -> int:
    from pretrain_planner.tables import status

    config = load_config(args)
    results = _results_dir(config)
    if args.watch:
        if args.json:
            raise CliError("--watch shows a refreshing table; --json prints the status once: use one of them")

        def frame() -> tuple[str, bool]:
            _, cells, plan_source = _status_snapshot(args, config, results)
            text = status.watch_frame(cells, str(results), plan_source, args.every, _driver_note(results))
            return text, status.live(cells)

        return status.watch(frame, args.every)
    summary, cells, plan_source = _status_snapshot(args, config, results)
    if args.json:
        print(json.dumps({"summary": summary.to_dicts(), "cells": cells.to_dicts()}, indent=1))
    else:
        print(status.format_status(summary, cells, str(results), plan_source))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Run an exported plan for real through the config's launcher (or --launcher): train/jobs.py."""
    from pretrain_planner.train import jobs

    config = load_config(args)
    rec = jobs.read_plan(args.plan)
    launcher = {**config["launcher"], **({"kind": args.launcher} if args.launcher else {})}
    if args.site:
        launcher["site"] = args.site
    if args.timeout_min:
        launcher["timeout_min"] = args.timeout_min
    launch = jobs.launch_settings(launcher, rec, REPO)
    out = Path(args.out) if args.out else layout.train_dir_of_plan(rec, _results_dir(config))
    log_path = args.log or str(out / "launch.log")
    t = config["train"]  # the config's train section, as the train rule reads it; a flag given wins
    if args.steps or args.time_budget_h:
        steps, hours = args.steps, args.time_budget_h
    else:
        steps, hours = t["steps"], t["time_budget_hours"]
    device = args.device or ("cpu" if t["device"] == "cpu" or config["benchmark"].get("device") == "cpu" else "auto")
    res = jobs.run_plan(args.plan, launch, out, log_path, threads=args.threads, device=device, steps=steps,
                        time_budget_h=hours, data=args.data or t["data"], tokenizer=args.tokenizer or t["tokenizer"],
                        checkpoint_every_min=t["checkpoint_every_min"])  # fmt: skip
    if args.json:
        print(json.dumps(res, indent=1, default=str))
    else:
        t, ratio = res["throughput"], (res["throughput"].get("ratio") or {})
        print(f"{res['model']} on {res['nodes']}x{res['gpus_per_node']} {res['gpu']} ({res['method']}): {res['steps']} "
              f"steps ({res['stop_reason']}), sustained step {t.get('step_time_s')} s, train / prediction "
              f"{ratio.get('step_time_s')}; {out / layout.RESULT}, {out / layout.THROUGHPUT_MD}")  # fmt: skip
    return 0


# ---------------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help=f"a sweep config used instead of {DEFAULT_CONFIG}, as snakemake --configfile: "
                        "not merged over it; what it leaves out takes the schema's defaults")  # fmt: skip
    common.add_argument("--models", help="models catalog (default: the config's catalog.models)")
    common.add_argument("--gpus", help="GPU catalog with prices (default: the config's catalog.gpus)")
    common.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser = argparse.ArgumentParser(
        prog="pretrain-planner", description="Price, look up and follow pre-training benchmark sweeps."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("cost", parents=[common], help="price a hypothetical: hardware, amortised, cloud")
    p.add_argument("--gpu", required=True, help="GPU type (a name in config/gpus.yaml)")
    p.add_argument("--count", type=_positive(int), required=True, help="number of GPUs in all")
    p.add_argument("--nodes", type=_positive(int), default=1, help="machines the GPUs are spread over (default 1)")
    p.add_argument("--days", type=_positive(float), help="days of training (for the amortised and cloud cost)")
    p.add_argument("--years", type=_positive(float),
                   help="amortisation years (default: the config's costs.amortisation_years)")  # fmt: skip
    p.set_defaults(func=cmd_cost)

    p = sub.add_parser("best", parents=[common], help="the best measured setting and its days")
    p.add_argument("--model", required=True)
    p.add_argument("--gpu", required=True)
    p.add_argument("--count", type=_positive(int), help="number of GPUs in all (default: any)")
    p.add_argument("--nodes", type=_positive(int), help="only this many nodes (default: any)")
    p.add_argument("--results", help="results folder (default: the config's `results`)")
    p.set_defaults(func=cmd_best)

    p = sub.add_parser("predict", parents=[common],
                       help="PREDICT days and cost on a GPU type from measurements on others (yours, else "
                            "public ones)")  # fmt: skip
    p.add_argument("--model", required=True)
    p.add_argument("--gpu", required=True, help="the target GPU type (a name in config/gpus.yaml)")
    p.add_argument("--count", type=_positive(int), required=True, help="number of GPUs in all")
    p.add_argument("--nodes", type=_positive(int), default=1, help="machines the GPUs are spread over (default 1)")
    p.add_argument("--results", help="results folder (default: the config's `results`)")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("fit", parents=[common],
                       help="what fits in --days on --count x --gpu: per model the fastest setting measured or "
                            "predicted, the tokens it reaches, whether the recipe's run fits")  # fmt: skip
    p.add_argument("--gpu", required=True, help="the GPU type (a name in config/gpus.yaml)")
    p.add_argument("--count", type=_positive(int), required=True, help="number of GPUs in all")
    p.add_argument("--nodes", type=_positive(int), default=1, help="machines the GPUs are spread over (default 1)")
    p.add_argument("--days", type=_positive(float), required=True, help="the time you have, days")
    p.add_argument("--model", action="append", help="only this model (repeatable; default: every catalog model "
                                                    "with a step count)")  # fmt: skip
    p.add_argument("--results", help="results folder (default: the config's `results`)")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("status", parents=[common], help="where the sweep stands, per GPU type")
    p.add_argument("--results", help="results folder (default: the config's `results`)")
    p.add_argument("--watch", action="store_true",
                   help="refresh a table of done / running / pending cells per GPU type and the live cells' progress "
                        "until nothing runs or waits (Ctrl-C to leave)")  # fmt: skip
    p.add_argument("--every", type=_positive(float), default=2.0, help="seconds between refreshes (default 2)")
    p.set_defaults(func=cmd_status)

    train_help = (
        "run an exported plan for real (local / SLURM / debug); the config's `train:` section gives the "
        "defaults of --steps, --time-budget-h, --data, --tokenizer, --device"
    )
    p = sub.add_parser("train", parents=[common], help=train_help, description=train_help)
    p.add_argument("--plan", required=True, help="results/optimal/{model}/{gpu}/{N}x{G}/ (or its plan.json)")
    p.add_argument("--launcher", choices=["local", "slurm", "debug"], help="default: the config's launcher.kind")
    p.add_argument("--site", help="the SLURM site file (default: the config's launcher.site)")
    p.add_argument("--timeout-min", type=_positive(int), help="the local launcher's limit (default: the config's)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=_positive(int),
                        help="optimizer steps (default: the config's train.steps, else the recipe's)")  # fmt: skip
    budget.add_argument(
        "--time-budget-h",
        type=_positive(float),
        help="hours of training time instead of steps (default: the config's train.time_budget_hours)",
    )
    p.add_argument("--out", help="output folder (default: <results>/train/{model}/{gpu}/{N}x{G})")
    p.add_argument("--log", help="the launcher's log (default: <out>/launch.log)")
    p.add_argument("--data", help="text files or an image folder (default: the config's train.data, else a generated "
                                  "corpus / synthetic images)")  # fmt: skip
    p.add_argument("--tokenizer", help="a local tokenizers JSON file (default: the config's train.tokenizer, else "
                                       "trained on the corpus)")  # fmt: skip
    p.add_argument("--device", choices=["auto", "cpu"],
                   help="cpu: a GPU plan on CPU processes (default: the config's train.device)")  # fmt: skip
    p.add_argument("--threads", type=_positive(int), default=1, help="cores for the run's ranks on this host")
    p.add_argument("--results", help="results folder (default: the config's `results`)")
    p.set_defaults(func=cmd_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from pretrain_planner.schema import ConfigError

    try:
        return args.func(args)
    except (CliError, ConfigError, FileNotFoundError) as exc:  # a failed train job raises (see its log)
        print(f"pretrain-planner {args.command}: {exc}", file=sys.stderr)
        return 1
