"""`pretrain-planner` (also `python -m pretrain_planner`): price a setting, look up the best measured one,
see where a sweep stands. Reads config files and results only; imports no torch.

  pretrain-planner cost --gpu a100 --count 4 --days 17.57
  pretrain-planner best --model pythia-1b --gpu a100 --count 4 [--results results]
  pretrain-planner predict --model pythia-1b --gpu h100 --count 4
  pretrain-planner fit --gpu a100 --count 4 --days 14   (or --by 2027-03-01)
  pretrain-planner when --model pythia-1b --gpu a100 --count 8
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
    from pretrain_planner.schema import resolve_path

    return resolve_path(path, REPO)


def _load_file_config(path: Path, source: str) -> dict[str, Any]:
    """A config file as --config gives it: validated, the schema's defaults in (a file without `sweep:` is given a
    placeholder: the CLI needs only the other sections of it)."""
    from pretrain_planner.schema import load_yaml, validate

    config = (load_yaml(path) if path.is_file() or source != DEFAULT_CONFIG else {}) or {}
    if "sweep" not in config:  # no sweep at hand: only the keys the CLI needs
        config["sweep"] = {"models": ["-"], "gpus": ["-"]}
    return validate(config, "config", source)


# config keys that hold paths, resolved as the sweep resolved them (relative to its working directory)
PATH_KEYS = (("catalog", "models"), ("catalog", "gpus"), ("launcher", "site"), ("budget",), ("train", "tokenizer"))


def _anchored(config: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
    """The recorded config with its relative paths made absolute where they exist under the sweep's working
    directory (else under its Snakefile's folder), as the pipeline resolved them (schema.resolve_path)."""
    import copy

    config = copy.deepcopy(config)
    for keys in PATH_KEYS:
        holder = config
        for k in keys[:-1]:
            holder = holder.get(k) or {}
        value = holder.get(keys[-1]) if isinstance(holder, dict) else None
        if not isinstance(value, str) or Path(value).is_absolute():
            continue
        for base in (rec.get("workdir"), rec.get("basedir")):
            if base and (Path(base) / value).exists():
                holder[keys[-1]] = str(Path(base) / value)
                break
    return config


def load_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config to answer with, and (in args.answer_source) where it came from: the config the results folder was
    made from (sweeprecord.py), so an answer follows the sweep the user ran.

    The results folder: --results, else --config's `results`, else the last sweep run in this working directory
    (.pretrain-planner/last-sweep.json), else config/config.yaml's. Its recorded config is used; a --config that
    disagrees with it is an error naming both. A folder with no record (made before records, or not run yet) is
    answered with --config, else the demo config/config.yaml, and the answer says so."""
    from pretrain_planner import sweeprecord

    given = _load_file_config(_resolve(args.config), args.config) if args.config else None
    flag = getattr(args, "results", None)
    pointer = None if flag or given else sweeprecord.last_sweep()
    demo = None
    if flag:
        results = Path(flag)
    elif given is not None:
        results = Path(given["results"])
    elif pointer is not None:
        results = pointer
    else:
        demo = _load_file_config(_resolve(DEFAULT_CONFIG), DEFAULT_CONFIG)
        results = Path(demo["results"])
    try:
        rec = sweeprecord.read(results)
    except sweeprecord.RecordError as exc:
        raise CliError(str(exc)) from None
    if rec is not None:
        if given is not None:
            diff = sweeprecord.differences(given, rec["config"])
            if diff:
                shown = ", ".join(diff[:6]) + (f" and {len(diff) - 6} more" if len(diff) > 6 else "")
                raise CliError(
                    f"--config {args.config} is not the config {results} was made from: {results} was made from "
                    f"{sweeprecord.describe(rec)}; they differ in {shown}. Leave out --config to answer with the "
                    f"recorded one, pass --results for another results folder, or rerun the sweep with {args.config}"
                )
        config = _anchored(_load_recorded(rec), rec)
        how = "; the last sweep run here" if pointer is not None else ""
        args.answer_source = f"config of {results}/: {sweeprecord.describe(rec)}{how}"
    else:
        config = given if given is not None else demo or _load_file_config(_resolve(DEFAULT_CONFIG), DEFAULT_CONFIG)
        used = args.config or DEFAULT_CONFIG
        args.answer_source = (f"config: {used} ({results}/ has no record of its own: {results}/"
                              f"{layout.SWEEP_CONFIG} is written when a sweep runs)")  # fmt: skip
    config["results"] = str(results)
    for flag_name, value, example, single in (("--models", args.models, "config/models.yaml", "--model"),
                                              ("--gpus", args.gpus, "config/gpus.yaml", "--gpu")):  # fmt: skip
        if value and not _resolve(value).is_file():
            raise CliError(f"{flag_name} takes a catalog file (e.g. {example}); {value!r} is not a file"
                           f"{f': for one name use {single} {value}' if '/' not in value else ''}")  # fmt: skip
    if args.models:
        config["catalog"]["models"] = args.models
    if args.gpus:
        config["catalog"]["gpus"] = args.gpus
    return config


def _load_recorded(rec: dict[str, Any]) -> dict[str, Any]:
    """The recorded config validated again (a key the schema added since takes its default)."""
    from pretrain_planner.schema import validate

    return validate(rec["config"], "config", rec["path"])


def _catalog(config: dict[str, Any], models: bool = True):
    from pretrain_planner.planning.catalog import Catalog, load_catalog, load_gpus

    gpus_path = _resolve(config["catalog"]["gpus"])
    prices = (config.get("costs") or {}).get("prices")  # the sweep's own prices over the catalog's (the demo's cpu)
    if models:
        catalog = load_catalog(_resolve(config["catalog"]["models"]), gpus_path).with_prices(prices)
    else:
        gpus, base = load_gpus(gpus_path)
        catalog = Catalog({}, gpus, base, config["catalog"]["models"], str(gpus_path)).with_prices(prices)
    launcher = config.get("launcher") or {}
    if launcher.get("kind") == "slurm" and launcher.get("site"):  # the site's network, as the sweep's plan had it
        from pretrain_planner.planning.site import read_site

        catalog = catalog.with_network(read_site(_resolve(launcher["site"])))
    return catalog


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
        print(json.dumps({**p.to_dict(), "config_source": args.answer_source}, indent=1))
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
    print(f"  (prices: {catalog.gpus_path} and the config's costs; {args.answer_source})")
    return 0


def _time_to_train(results: Path, config: dict[str, Any], allow_differs: bool = False):
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
        catalog = _catalog(config)
    except Exception:
        catalog = None
    cells, source = _cells_here(results, catalog, "tables/time_to_train.csv")
    return aggregate.time_to_train(cells), source


def _loss_line(r: dict[str, Any], allow_differs: bool) -> str:
    """What the loss check said of the pick, and the faster methods passed over because they train another model."""
    verdict = r.get("loss") or "not checked"
    if verdict.startswith("differs"):
        verdict += " -- picked anyway (--allow-differs): it does not train the same model as naive"
    elif verdict == "not checked":
        verdict += " (benchmark.loss_check: off, or only each setting's pick is checked)"
    passed = r.get("passed_over")
    if passed:
        verdict += f"; passed over, faster but training another model: {passed} (--allow-differs takes them)"
    return verdict


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
    catalog = _catalog(config)
    catalog.model(args.model), catalog.gpu(args.gpu)  # unknown names: the catalog's known ones
    ttt, source = _time_to_train(results, config, args.allow_differs)
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
                          "source": source, "config_source": args.answer_source}, indent=1, default=str))  # fmt: skip
        return 0
    days = _days(r["training_days"]) if r["training_days"] is not None else "days unknown (no step count)"
    print(f"{r['model']} on {r['nodes']}x{r['gpus_per_node']} {r['gpu']}: best method {r['best_method']}, {days}")
    print(f"  loss check: {_loss_line(r, args.allow_differs)}")
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
    print(f"  (from {source}; {args.answer_source})")
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
    from pretrain_planner.planning.evidence_exchange import evidence_folder
    from pretrain_planner.schema import section
    from pretrain_planner.tables import whatif

    cells, source = _cells_or_none(results, catalog)
    limit = section("config", "benchmark", config.get("benchmark"))["suspect_mfu"]
    folder = evidence_folder(config)
    return whatif.Predictor(cells, catalog, limit, config.get("costs"), evidence_folder=folder), source


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
        print(json.dumps({**p.to_dict(), "source": source, "config_source": args.answer_source}, indent=1))
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
            from pretrain_planner.planning.evidence_exchange import SITE_PREFIX, evidence_folder

            imported = f"; {SITE_PREFIX}<name>: a site's cells imported into {evidence_folder(config)}"
            print(f"  sources: {p.sources} (each shipped one described in {SOURCES_MD}"
                  f"{imported if SITE_PREFIX in p.sources else ''})")  # fmt: skip
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
    print(f"  (cells: {source}; {args.answer_source})")
    return 0


FIT_LEGEND = (
    "yes = measured within the days, or even the pessimistic end of the prediction is; likely = the central "
    "prediction is; maybe = only the optimistic end (or the physics bound: the days at the `suspect` share of the "
    "dense peak, where nothing of its kind was measured) is; no = not even that"
)


def cmd_fit(args: argparse.Namespace) -> int:
    """The inverse question: what fits in --days on --count x --gpu, per catalog model (tables/whatif.fit_table)."""
    import textwrap

    import polars as pl

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
    by = _by_date(args.by) if args.by else None
    days = args.days if by is None else (by - by.now()).total_seconds() / 86400
    table = whatif.fit_table(predictor, args.gpu, args.nodes, _split(args.count, args.nodes), days, models,
                             measured)  # fmt: skip
    if by is not None:
        return _fit_by(args, config, catalog, results, table, by, f"measured: {measured_source}; cells: {source}")
    if args.json:
        print(json.dumps({"rows": table.to_dicts(), "cells": source, "measured": measured_source,
                          "config_source": args.answer_source}, indent=1))  # fmt: skip
        return 0
    from pretrain_planner.tables import views
    from pretrain_planner.tables.markdown import to_markdown

    print(f"What fits in {args.days:g} days on {args.nodes}x{args.count // args.nodes} {args.gpu}: the recipe's run "
          f"per model, measured or PREDICTED (predictions are not measurements)\n")  # fmt: skip
    print(to_markdown(views.view("fit", table)))
    other = table.filter(pl.col("basis").is_in(["bound only", "does not fit", "invalid", "no peak"]))
    for basis, model, why in other.select("basis", "model", "why").iter_rows():
        what = "physics bound only" if basis == "bound only" else basis
        print(textwrap.fill(f"{model}: {what}: {why}", 120, subsequent_indent="  ", break_on_hyphens=False))
    print(textwrap.fill(f"fits: {FIT_LEGEND}", 120, subsequent_indent="  ", break_on_hyphens=False))
    print(f"(measured: {measured_source}; cells: {source}; {args.answer_source})")
    return 0


def _calendar_site(config: dict[str, Any], gpus: list[str]):
    """(tables.calendar.Site of the config's launcher, how the answer's parts were known): on SLURM the site file's
    settings of `gpus` and the scheduler asked; locally no queue. The checkpoint rate is measured on the results
    folder's file system unless the site file gives it."""
    from datetime import datetime

    from pretrain_planner.planning.calendar import disk_write_rate
    from pretrain_planner.planning.queue import run_sbatch
    from pretrain_planner.planning.site import load_site
    from pretrain_planner.schema import resolve_path
    from pretrain_planner.tables.calendar import Site

    launcher = config["launcher"]
    site = None
    if launcher["kind"] == "slurm":
        site = load_site(resolve_path(launcher["site"], REPO), gpus, "the config", "launcher.site")
    rate, how = disk_write_rate(str(_results_dir(config)))
    return Site(site, rate, how, run_sbatch if site else None, datetime.now())


def _when_settings(args: argparse.Namespace, config: dict[str, Any], catalog, results: Path):
    """The settings `when` prices: those measured for --model / --gpu / --count (and --nodes), else the what-if's
    prediction for --nodes (default 1) x the rest; and where the compute days came from."""
    import polars as pl

    from pretrain_planner.tables.calendar import Setting, settings_of

    try:
        ttt, source = _time_to_train(results, config)
        cells, _ = _cells_or_none(results, catalog)
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
    predictor, cells_source = _predictor(config, catalog, results)
    p = predictor.predict(args.model, args.gpu, nodes, _split(args.count, nodes))
    if p.days_central is None:
        raise CliError(f"{args.model} on {nodes}x{args.count // nodes} {args.gpu}: not measured here ({source}) and "
                       f"no prediction: {p.status}: {p.why or p.note or ''}")  # fmt: skip
    _, median = _startup_median(cells)
    basis = (f"PREDICTED (not measured): {p.days_optimistic:.3g} .. {p.days_pessimistic or float('nan'):.3g} days, "
             f"central {p.days_central:.3g}; measured error of that kind {p.model_error}")  # fmt: skip
    start_basis = "the median of the sweep's cells" if median is not None else "not measured"
    return [Setting(args.model, args.gpu, nodes, p.gpus_per_node, p.method or "?", p.days_central * 24, basis,
                    startup_s=median, startup_basis=start_basis)], f"predicted: cells {cells_source}"  # fmt: skip


def _startup_median(cells):
    from pretrain_planner.tables.calendar import startup_of

    return startup_of(cells) if cells is not None else ({}, None)


def cmd_when(args: argparse.Namespace) -> int:
    """If submitted now, when does it finish (tables/calendar.py): compute, segments, restarts, queue waits."""
    from pretrain_planner.tables.calendar import price, rank

    config = load_config(args)
    results = _results_dir(config)
    catalog = _catalog(config)
    catalog.model(args.model), catalog.gpu(args.gpu)
    _split(args.count, args.nodes or 1)
    settings, source = _when_settings(args, config, catalog, results)
    where = _calendar_site(config, [args.gpu])
    rows = rank([price(s, catalog, where) for s in settings])
    if args.json:
        print(json.dumps({"rows": rows, "source": source, "checkpoint_rate": where.measured_how,
                          "config_source": args.answer_source}, indent=1, default=str))  # fmt: skip
        return 0
    now = where.now.isoformat(timespec="minutes")
    for r in rows:
        print(f"{r['model']} on {r['nodes']}x{r['gpus_per_node']} {r['gpu']} ({r['method']}), if submitted now "
              f"({now}):")  # fmt: skip
        print(f"  compute: {_days(r['compute_days'])} - {r['compute_basis']}")
        if r["segments"] is None:
            print(f"  finish: unknown - {r['note']}")
            continue
        limit = f"jobs of at most {r['job_limit_h'] * 60:g} min" if r["job_limit_h"] else "one job, no time limit"
        print(f"  segments: {r['segments']} ({limit}), {units.duration_s(r['restart_loss_h'] * 3600)} lost to "
              f"restarts - restart {units.duration_s(r['restart_s'])}: {r['restart_basis']}")  # fmt: skip
        start = r["expected_start"].replace("T", " ")
        print(f"  start: {start} - {r['wait_basis']}")
        if r["requeue_wait_h"] is not None:
            print(f"  each requeued job waits {units.duration_s(r['requeue_wait_h'] * 3600)}")
        finish = r["expected_finish"].replace("T", " ")
        print(f"  finish: {finish}" + (f" ({_days(r['calendar_days'])} of calendar time)" if r["calendar_days"]
                                       is not None else " (a wait it needs is unknown)"))  # fmt: skip
        if r["note"]:
            print(f"  note: {r['note']}")
    print(f"  (compute {source}; {args.answer_source})")
    return 0


def _by_date(text: str):
    """--by: a date (2027-03-01, the start of that day) or a date and time, local, in the future."""
    from datetime import datetime

    try:
        by = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"--by {text!r} is not a date: write it as YYYY-MM-DD (e.g. 2027-03-01) or "
                       "YYYY-MM-DDTHH:MM") from None  # fmt: skip
    if by <= datetime.now():
        raise CliError(f"--by {text}: that is not in the future (now {datetime.now().isoformat(timespec='minutes')})")
    return by


def _fit_by(args: argparse.Namespace, config: dict[str, Any], catalog, results: Path, table, by, sources: str) -> int:
    """`fit --by DATE`: each model's fastest setting (measured, else predicted) put on the calendar
    (tables/calendar.py: segments, restarts, the queue asked of the scheduler), ranked by when it finishes."""
    from pretrain_planner.tables.calendar import Setting, price

    cells, _ = _cells_or_none(results, catalog)
    keyed, median = _startup_median(cells)
    where = _calendar_site(config, [args.gpu])
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
    if args.json:
        print(json.dumps({"by": by.isoformat(), "rows": out, "sources": sources,
                          "config_source": args.answer_source}, indent=1, default=str))  # fmt: skip
        return 0
    from pretrain_planner.tables.markdown import table as md_table

    print(f"What finishes by {by.isoformat(timespec='minutes')} on {args.nodes}x{gpn} {args.gpu}, if submitted now "
          f"({where.now.isoformat(timespec='minutes')}): compute measured or PREDICTED, then segments, restarts and "
          "the queue wait (tables/calendar.py)\n")  # fmt: skip
    cols = ["model", "method", "basis", "compute_days", "finish", "by", "why"]
    print(md_table(cols, [[x[c] for c in cols] for x in out], keys=1))
    print(f"({sources}; checkpoint rate {where.measured_how}; {args.answer_source})")
    return 0


def _status_snapshot(args: argparse.Namespace, config: dict[str, Any], results: Path):
    """(summary, cells, plan source): plan.csv when the pipeline wrote it, else the config's plan."""
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
        out = {"summary": summary.to_dicts(), "cells": cells.to_dicts(), "config_source": args.answer_source}
        print(json.dumps(out, indent=1))
    else:
        print(status.format_status(summary, cells, str(results), plan_source))
        print(f"({args.answer_source})")
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


def cmd_evidence(args: argparse.Namespace) -> int:
    """`evidence export`: the sweep's ok cells as evidence rows with their provenance (planning/evidence_exchange);
    `evidence import`: other sites' exported rows into the config's evidence folder, all or nothing."""
    import socket

    from pretrain_planner.planning import evidence_exchange as ex

    config = load_config(args)
    catalog = _catalog(config)
    try:
        if args.action == "export":
            results = _results_dir(config)
            cells, source = _cells_or_none(results, catalog)
            site = args.site or (config.get("evidence") or {}).get("site") or socket.gethostname()
            rows, left = ex.export_rows(cells, catalog, site, interconnect=args.interconnect or "")
            if not rows:
                raise CliError(f"no cell to export from {source}: none ran ok on a GPU type"
                               + "".join(f"\n  {f}: {why}" for f, why in left))  # fmt: skip
            text = ex.csv_text(rows)
            if args.out:
                from pretrain_planner.results import atomic_write_text

                atomic_write_text(args.out, text)
            else:
                sys.stdout.write(text)
            where = args.out or "stdout"
            print(f"exported {len(rows)} cell(s) of site {site!r} from {source} to {where}"
                  + "".join(f"\n  left out {f}: {why}" for f, why in left), file=sys.stderr)  # fmt: skip
            return 0
        folder = ex.evidence_folder(config)
        added, repeated, target = ex.import_files(args.files, catalog, folder)
    except ex.EvidenceError as exc:
        raise CliError(str(exc)) from None
    print(f"imported {added} row(s) into {target}" + (f"; {repeated} already there (kept once)" if repeated else "")
          + f"; {_origins(config, catalog)}")  # fmt: skip
    return 0


def _origins(config: dict[str, Any], catalog) -> str:
    """What the what-if now rests on besides the sweep's cells."""
    from pretrain_planner.planning.evidence import origins_text
    from pretrain_planner.planning.evidence_exchange import evidence_folder, loaded_evidence
    from pretrain_planner.schema import section

    limit = section("config", "benchmark", config.get("benchmark"))["suspect_mfu"]
    loaded = loaded_evidence(catalog, limit, evidence_folder(config))
    return f"the what-if's evidence: {origins_text(loaded.origins())} ({len(loaded.skipped)} rows not usable)"


# ---------------------------------------------------------------------------------------------- parser


def _command(sub: Any, name: str, common: argparse.ArgumentParser, text: str) -> argparse.ArgumentParser:
    """A sub-command whose one-line help (in `pretrain-planner --help`) is also its --help's description."""
    return sub.add_parser(name, parents=[common], help=text, description=text)


def _setting(p: argparse.ArgumentParser, model: bool, count_required: bool) -> None:
    """The setting asked about: --model (where one is), --gpu, --count and --nodes. With --count optional (`best`),
    leaving out --count or --nodes means any; else --nodes defaults to one machine."""
    if model:
        p.add_argument("--model", required=True, help="the model (a name in the config's catalog.models)")
    p.add_argument("--gpu", required=True, help="the GPU type (a name in the config's catalog.gpus)")
    if count_required:
        p.add_argument("--count", type=_positive(int), required=True, help="number of GPUs in all")
        p.add_argument("--nodes", type=_positive(int), default=1, help="machines the GPUs are spread over (default 1)")
    else:
        p.add_argument("--count", type=_positive(int), help="number of GPUs in all (default: any)")
        p.add_argument("--nodes", type=_positive(int), help="only this many nodes (default: any)")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="a sweep config, as snakemake --configfile: not merged over "
                        f"{DEFAULT_CONFIG}; what it leaves out takes the schema's defaults (default: the config the "
                        "results folder was made from, recorded in its config.json; a --config that differs from "
                        "that record is an error)")  # fmt: skip
    common.add_argument("--results", help="results folder (default: --config's `results`, else the folder of the last "
                        "sweep run in this directory, else results/)")  # fmt: skip
    common.add_argument("--models", help="a models catalog FILE (default: the config's catalog.models); one model's "
                        "name goes to --model")  # fmt: skip
    common.add_argument("--gpus", help="a GPU catalog FILE with prices (default: the config's catalog.gpus); one GPU "
                        "type's name goes to --gpu")  # fmt: skip
    common.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser = argparse.ArgumentParser(
        prog="pretrain-planner", description="Price, look up and follow pre-training benchmark sweeps."
    )
    from pretrain_planner import __version__

    parser.add_argument("--version", action="version", version=f"pretrain-planner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = _command(sub, "cost", common, "price a hypothetical: hardware, amortised and cloud cost of --count GPUs of "
                 "--gpu (for --days)")  # fmt: skip
    _setting(p, model=False, count_required=True)
    p.add_argument("--days", type=_positive(float), help="days of training (for the amortised and cloud cost)")
    p.add_argument("--years", type=_positive(float),
                   help="amortisation years (default: the config's costs.amortisation_years)")  # fmt: skip
    p.set_defaults(func=cmd_cost)

    p = _command(sub, "best", common, "the best measured setting of --model on --gpu: its method, days, cost, and "
                 "why nothing fits where nothing does")  # fmt: skip
    _setting(p, model=True, count_required=False)
    p.add_argument("--allow-differs", action="store_true",
                   help="pick the fastest method even if its loss check says it trains another model than "
                        "naive")  # fmt: skip
    p.set_defaults(func=cmd_best)

    p = _command(sub, "predict", common, "PREDICT days and cost on a GPU type from measurements on others (yours, "
                 "else public ones), with the measured error of that kind of prediction")  # fmt: skip
    _setting(p, model=True, count_required=True)
    p.set_defaults(func=cmd_predict)

    p = _command(sub, "fit", common, "what fits in --days on --count x --gpu: per model the fastest setting "
                 "measured or predicted, the tokens it reaches, whether the recipe's run fits")  # fmt: skip
    _setting(p, model=False, count_required=True)
    until = p.add_mutually_exclusive_group(required=True)
    until.add_argument("--days", type=_positive(float), help="the time you have, days of compute")
    until.add_argument("--by", help="a date (YYYY-MM-DD): what finishes by then in calendar time, if submitted now "
                                    "(segments, restarts, the queue wait asked of the scheduler)")  # fmt: skip
    p.add_argument("--model", action="append", help="only this model (repeatable; default: every catalog model "
                                                    "with a step count)")  # fmt: skip
    p.set_defaults(func=cmd_fit)

    p = _command(sub, "when", common, "if submitted now, when does training --model on --count x --gpu finish: "
                 "compute days (measured, else PREDICTED), segments under the site's time limit, restarts, the queue "
                 "wait asked of the scheduler (sbatch --test-only, nothing submitted)")  # fmt: skip
    p.add_argument("--model", required=True, help="the model (a name in the config's catalog.models)")
    p.add_argument("--gpu", required=True, help="the GPU type (a name in the config's catalog.gpus)")
    p.add_argument("--count", type=_positive(int), required=True, help="number of GPUs in all")
    p.add_argument("--nodes", type=_positive(int),
                   help="machines the GPUs are spread over (default: every layout measured, else 1)")  # fmt: skip
    p.set_defaults(func=cmd_when)

    p = _command(
        sub, "status", common, "where the sweep stands, per GPU type: done / running / failed cells and GPU-hours"
    )
    p.add_argument("--watch", action="store_true",
                   help="refresh a table of done / running / pending cells per GPU type and the live cells' progress "
                        "until nothing runs or waits (Ctrl-C to leave)")  # fmt: skip
    p.add_argument("--every", type=_positive(float), default=2.0, help="seconds between refreshes (default 2)")
    p.set_defaults(func=cmd_status)

    p = _command(sub, "evidence", common, "exchange measured cells as evidence for the cross-GPU what-if: export this "
                 "sweep's ok cells with their provenance, or import other sites' exported rows")  # fmt: skip
    actions = p.add_subparsers(dest="action", required=True, help="export: this sweep's cells; import: other sites'")
    text = "the sweep's ok cells (not suspect, not noisy) as evidence rows: the shipped evidence's columns, provenance"
    e = actions.add_parser("export", parents=[common], help=text, description=text)
    e.add_argument("--out", help="the CSV file to write (default: stdout)")
    e.add_argument("--site", help="your site's name, written into each row (default: the config's evidence.site, else "
                                  "this host's name)")  # fmt: skip
    e.add_argument("--interconnect", help="the nodes' interconnect, if known (e.g. 'NVLink 4, 8 x 400 Gb/s IB')")
    text = (
        "add exported rows to the evidence folder (the config's evidence.folder, default <results>/evidence): all "
        "or nothing, each refused row named"
    )
    i = actions.add_parser("import", parents=[common], help=text, description=text)
    i.add_argument("files", nargs="+", metavar="FILE", help="CSV files written by `evidence export`")
    p.set_defaults(func=cmd_evidence)

    train_help = (
        "run an exported plan for real (local / SLURM / debug); the config's `train:` section gives the "
        "defaults of --steps, --time-budget-h, --data, --tokenizer, --device"
    )
    p = _command(sub, "train", common, train_help)
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
    except BrokenPipeError:  # `pretrain-planner fit ... | head`: the reader has what it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 0
