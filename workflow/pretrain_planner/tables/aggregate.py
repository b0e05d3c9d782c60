"""Results -> tables (polars): cells, time_to_train, feasibility, costs, pareto, problems.

Reads each result.json into one explicit schema (results.RESULT_FIELDS), so a key that only late
files have is never dropped and types never drift. A file that cannot be read, is not JSON, has a
value of the wrong type, lacks what its status needs, or lies about its cell is named (log, `problems`
table, the cell's `reason`, status `corrupt`) and skipped; every other file still counts.
The paragraphs each table's Markdown file opens with are tables/intros.py's. Imports no torch.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl

from pretrain_planner.planning import losscheck, methods
from pretrain_planner.planning.catalog import Catalog
from pretrain_planner.planning.configtypes import CostsSection, LossCheckSection, require
from pretrain_planner.planning.flops import train_flops_per_sample
from pretrain_planner.results import (
    JSON_FIELDS,
    RAN,
    STATUSES,
    atomic_write,
    atomic_write_text,
    coords_of,
    gpu_hours,
    parse_result,
)
from pretrain_planner.tables import columns, intros, memfix, views
from pretrain_planner.tables import costs as pp_costs
from pretrain_planner.tables.columns import RESULT_SCHEMA
from pretrain_planner.tables.markdown import WIDTH, to_markdown

GROUP = ["model", "gpu", "nodes", "gpus_per_node"]
KEYS = [*GROUP, "method"]

ANALYTIC_COLUMNS = [
    "analytic_flops_per_step", "analytic_peak_tflops", "analytic_step_time_s", "analytic_days",
    "measured_over_analytic", "peak_kind",
]  # fmt: skip
TIME_TO_TRAIN_COLUMNS = [
    "model", "gpu", "nodes", "gpus_per_node", "world_size", "best_method", "micro_batch",
    "grad_accum_steps", "step_time_s", "step_time_p10_s", "step_time_p90_s", "tokens_per_s", "samples_per_s",
    "mfu", "peak_mem_gib", "training_days", "days_naive", "days_fl", "speedup_vs_naive", "speedup_vs_fl",
    "analytic_step_time_s", "analytic_days", "measured_over_analytic", "analytic_peak_tflops", "peak_kind",
    "methods_ok", "methods_oom", "methods_unsupported", "methods_suspect", "methods_noisy", "loss", "passed_over",
    "tie",
]  # fmt: skip
FEASIBILITY_COLUMNS = [
    "model", "gpu", "nodes", "gpus_per_node", "world_size", "verdict", "naive", "fl", "fits_naive", "fits_fl",
    "fits_any", "best_method", "training_days", "fitting_methods", "methods_valid", "methods_ok", "methods_oom",
    "methods_unsupported", "methods_not_measured", "loss",
]  # fmt: skip
COSTS_COLUMNS = [
    "model", "gpu", "nodes", "gpus_per_node", "world_size", "best_method", "training_days", "gpu_price_usd",
    "base_machine_usd", "hardware_usd", "amortisation_years", "amortised_usd", "cloud_usd_per_gpu_hour",
    "gpu_hours", "cloud_usd", "pareto", "cost_note",
]  # fmt: skip
PARETO_COLUMNS = [
    "model", "gpu", "nodes", "gpus_per_node", "world_size", "best_method", "training_days", "cost_kind",
    "cost_usd", "hardware_usd", "amortised_usd", "cloud_usd",
]  # fmt: skip
PROBLEMS_COLUMNS = ["path", "model", "gpu", "nodes", "gpus_per_node", "method", "problem"]

# Verdicts of the feasibility table, best first (the feasibility map's legend uses this order).
VERDICTS = {
    "naive": "naive fits",
    "free-lunch": "free-lunch fits (naive does not)",
    "other method": "only another method fits (e.g. checkpointing or sharding)",
    "out of memory": "nothing fits: out of memory",
    "unsupported": "nothing ran: unsupported",
    "not measured": "not measured yet (missing or corrupt results)",
    "invalid": "invalid setting (see plan.csv)",
}

TABLE_NAMES = ("cells", "time_to_train", "feasibility", "costs", "pareto", "problems", "benchmark_cost", "loss_check")
LOSS_CHECK_COLUMNS = [
    "model", "gpu", "nodes", "gpus_per_node", "world_size", "method", "role", "against", "loss", "quantity",
    "tail_rel", "worst_ratio", "left_at", "band_runs", "steps", "global_batch", "note", "test_fault", "curves",
]  # fmt: skip
REFERENCE = "reference"  # naive's `loss`: the curve every method is compared with
BENCHMARK_COST_COLUMNS = [
    "model", "gpu", "nodes", "gpus_per_node", "world_size", "strategy", "best_method", "methods_valid",
    "methods_run", "methods_pruned", "gpu_hours_spent", "gpu_hours_max_run", "gpu_hours_max_exhaustive",
    "loss_check_gpu_hours",
]  # fmt: skip


def table_files(folder: str) -> dict[str, str]:
    files = {"cells_parquet": f"{folder}/cells.parquet"}
    for name in TABLE_NAMES:
        files[f"{name}_csv"] = f"{folder}/{name}.csv"
        files[f"{name}_md"] = f"{folder}/{name}.md"
    return files


def read_table(path: str | Path) -> pl.DataFrame:
    """A table CSV written by `build_tables`, with its columns' declared dtypes."""
    return columns.read_csv(path)


# ----------------------------------------------------------------------------------------------- reading


def read_results(paths: Iterable[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(results, problems): every usable result in the declared schema; every unusable file, named."""
    rows, problems = [], []
    for p in paths:
        row, problem = parse_result(p)
        if row is None:
            problems.append({"path": str(p), **coords_of(str(p)), "problem": problem})
        else:
            rows.append(row)
    results = pl.DataFrame(rows, schema=RESULT_SCHEMA)
    schema = {c: columns.dtype(c) for c in PROBLEMS_COLUMNS}
    return results, pl.DataFrame(problems, schema=schema)


def plan_from_results(results: pl.DataFrame) -> pl.DataFrame:
    """A stand-in plan.csv when only cell folders are at hand (every result's cell, valid)."""
    return results.select(
        *KEYS,
        (pl.col("nodes") * pl.col("gpus_per_node")).alias("world_size"),
        pl.lit(True).alias("valid"),
        pl.lit("").alias("reason"),
    ).unique(KEYS, maintain_order=True)


def read_plan(plan_csv: str | Path) -> pl.DataFrame:
    return pl.read_csv(
        plan_csv,
        schema_overrides={"reason": pl.String, "valid": pl.Boolean, "per_rank_batch": pl.Float64},
    )


def cells_table(
    plan: str | Path | pl.DataFrame,
    result_paths: Iterable[str],
    catalog: Catalog | None = None,
    pruned: dict[tuple[str, str, int, int, str], str] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(cells, problems): the plan joined with the results. Invalid cells keep their reason (status
    `invalid`); cells without a result are `missing`, or `pruned` with the adaptive search's reason;
    cells whose file is unusable are `corrupt`."""
    results, problems = read_results(result_paths)
    plan_df = plan if isinstance(plan, pl.DataFrame) else read_plan(plan)
    results = results.drop("world_size")
    cells = plan_df.join(results, on=KEYS, how="left", suffix="_result")
    bad = (
        problems.filter(pl.col("model").is_not_null())
        .select(*KEYS, pl.col("problem").alias("_problem"))
        .unique(KEYS, keep="last")
    )
    cells = cells.join(bad, on=KEYS, how="left")
    cells = cells.with_columns(
        pl.when(~pl.col("valid"))
        .then(pl.lit("invalid"))
        .when(pl.col("_problem").is_not_null())
        .then(pl.lit("corrupt"))
        .otherwise(pl.col("status").fill_null("missing"))
        .alias("status"),
        pl.coalesce(
            pl.col("reason_result"),
            pl.concat_str(pl.lit("result.json skipped: "), pl.col("_problem")),
            pl.when(pl.col("reason") != "").then(pl.col("reason")),
        ).alias("reason"),
    ).drop("reason_result", "_problem")
    if pruned:
        why = pl.DataFrame(
            [(*k, r) for k, r in pruned.items()],
            schema={**{c: columns.dtype(c) for c in KEYS}, "_pruned": pl.String},
            orient="row",
        )
        cells = (
            cells.join(why, on=KEYS, how="left")
            .with_columns(
                pl.when((pl.col("status") == "missing") & pl.col("_pruned").is_not_null())
                .then(pl.lit("pruned"))
                .otherwise(pl.col("status"))
                .alias("status"),
                pl.when((pl.col("status") == "missing") & pl.col("_pruned").is_not_null())
                .then(pl.col("_pruned"))
                .otherwise(pl.col("reason"))
                .alias("reason"),
            )
            .drop("_pruned")
        )
    return with_analytic(with_startup(cells), catalog), problems


STARTUP_COLUMNS = {"startup_s": "total_s", "compile_s": "compile_s"}  # cells column -> result.json startup's key


def with_startup(cells: pl.DataFrame) -> pl.DataFrame:
    """What one restart of each cell's setting costs before it trains, in seconds (result.json `startup`,
    trainer/startup.py): `startup_s` (its total_s: process start -> rank up, model build, method wrapping, data,
    compile) and `compile_s` (the first step's extra time); null where a result has none (an older file, a cell
    that did not run)."""
    src = pl.col("startup") if "startup" in cells.columns else pl.lit(None, pl.String)
    return cells.with_columns(
        src.str.json_path_match(f"$.{key}").cast(pl.Float64, strict=False).alias(col)
        for col, key in STARTUP_COLUMNS.items()
    )


# ------------------------------------------------------------------------------------------ analytic


def with_analytic(cells: pl.DataFrame, catalog: Catalog | None) -> pl.DataFrame:
    """Beside each measurement: FLOPs per step / (GPUs x dense peak) -> analytic step time and days.

    FLOPs per step = flops.train_flops_per_sample (the one formula) x the recipe's global batch; for a
    family without a formula (ConvNeXt) the trainer's counted `flops_per_step`. The peak is the GPU's
    dense peak for the recipe's precision (TF32 for fp32 recipes under free-lunch where the GPU has it); a GPU type
    without one (the `cpu` stand-in) takes the peak its cell measured on the host (`peak_kind` says which).
    """
    schema = {"model": pl.String, "gpu": pl.String, "method": pl.String, "_formula_flops": pl.Float64,
              "analytic_peak_tflops": pl.Float64, "_catalog_steps": pl.Int64}  # fmt: skip
    rows = []
    for model, gpu, method in cells.select("model", "gpu", "method").unique().iter_rows():
        m = catalog.models.get(model) if catalog else None
        g = catalog.gpus.get(gpu) if catalog else None
        flops = peak = steps = None
        if m is not None:
            per_sample = train_flops_per_sample(m.to_dict())
            flops = per_sample * m.recipe.global_batch if per_sample else None
            steps = m.recipe.steps
            if g is not None:
                try:
                    fl = methods.parse(method).free_lunch
                except ValueError:
                    fl = False
                peak = g.peak_for(m.recipe.precision, tf32=fl)
        rows.append({"model": model, "gpu": gpu, "method": method, "_formula_flops": flops,
                     "analytic_peak_tflops": peak, "_catalog_steps": steps})  # fmt: skip
    facts = pl.DataFrame(rows, schema=schema)
    flops = pl.coalesce("_formula_flops", "flops_per_step")
    step = flops / (pl.col("world_size") * pl.col("analytic_peak_tflops") * 1e12)
    measured_peak = pl.col("peak_tflops") if "peak_tflops" in cells.columns else pl.lit(None, pl.Float64)
    source = pl.col("peak_source") if "peak_source" in cells.columns else pl.lit(None, pl.String)
    return (
        cells.join(facts, on=["model", "gpu", "method"], how="left")
        .with_columns(  # no datasheet peak (the `cpu` stand-in): the peak the cell measured on its host
            pl.when(pl.col("analytic_peak_tflops").is_not_null())
            .then(pl.lit("datasheet"))
            .when(measured_peak.is_not_null())
            .then(pl.lit("measured"))
            .alias("peak_kind"),
            pl.coalesce("analytic_peak_tflops", measured_peak).alias("analytic_peak_tflops"),
        )
        .with_columns(
            pl.when(pl.col("peak_kind") == "measured").then(source).otherwise(pl.col("peak_kind")).alias("peak_source")
        )
        .with_columns(flops.alias("analytic_flops_per_step"), step.alias("analytic_step_time_s"))
        .with_columns(
            (pl.coalesce("recipe_steps", "_catalog_steps") * pl.col("analytic_step_time_s") / 86400).alias(
                "analytic_days"
            ),
            pl.when(pl.col("status") == "ok")
            .then(pl.col("step_time_s") / pl.col("analytic_step_time_s"))
            .alias("measured_over_analytic"),
        )
        .drop("_formula_flops", "_catalog_steps")
    )


# -------------------------------------------------------------------------------------------- tables


def _ok(cells: pl.DataFrame) -> pl.DataFrame:
    return cells.filter((pl.col("status") == "ok") & ~pl.col("suspect").fill_null(False))


def _simplest_of_tied(allowed: pl.DataFrame, fastest: pl.DataFrame) -> pl.DataFrame:
    """Per setting, the pick: of the methods whose median step is inside the fastest's own spread (at most its p90
    step: the run-to-run noise the spread check measures, so the order among them is chance), the one with the
    fewest parts (`fl` before `fl+ac`: a part more is work or risk more for no measured gain), then the fastest; its
    `tie` names the faster method it was preferred to."""
    if allowed.is_empty():
        return fastest.with_columns(pl.lit(None, dtype=pl.String).alias("tie"))
    top = fastest.select(*GROUP, pl.col("method").alias("_fast"), pl.col("step_time_s").alias("_fast_s"),
                         pl.col("step_time_p10_s").alias("_fast_p10"),
                         pl.coalesce("step_time_p90_s", "step_time_s").alias("_fast_p90"))  # fmt: skip
    tied = allowed.join(top, on=GROUP, how="left").filter(pl.col("step_time_s") <= pl.col("_fast_p90"))
    parts = pl.col("method").str.count_matches(r"\+")
    pick = tied.sort(*GROUP, parts, "step_time_s", "method").group_by(GROUP, maintain_order=True).first()
    ms = lambda c: (pl.col(c) * 1000).round(1).cast(pl.String)  # noqa: E731
    tie = (pl.when(pl.col("method") != pl.col("_fast"))
           .then(pl.format("tie: {} {} ms vs {} {} ms, inside {}'s spread ({}-{} ms); the simpler method is kept",
                           "_fast", ms("_fast_s"), "method", ms("step_time_s"), "_fast", ms("_fast_p10"),
                           ms("_fast_p90")))
           .otherwise(None).alias("tie"))  # fmt: skip
    order = fastest.select(GROUP).with_row_index("_order")
    return (pick.with_columns(tie).join(order, on=GROUP).sort("_order")
            .drop("_order", "_fast", "_fast_s", "_fast_p10", "_fast_p90"))  # fmt: skip


def time_to_train(cells: pl.DataFrame) -> pl.DataFrame:
    """Per model x GPU x count: the fastest method that ran (ok, not suspect) and is not known to train another
    model (its loss check `same` or `not checked`; the faster ones that differ are named in `passed_over`), beside
    naive and fl alone."""
    for col in [*ANALYTIC_COLUMNS, "loss"]:
        if col not in cells.columns:
            cells = cells.with_columns(pl.lit(None, dtype=columns.dtype(col)).alias(col))
    ok = _ok(cells)
    differs = pl.col("loss").fill_null("").str.starts_with(losscheck.DIFFERS)
    ranked = ok.sort("step_time_s", "method")
    fastest = ranked.filter(~differs).group_by(GROUP, maintain_order=True).first()
    best = _simplest_of_tied(ranked.filter(~differs), fastest)
    passed = (
        ranked.join(best.select(*GROUP, pl.col("step_time_s").alias("_best_s")), on=GROUP, how="left")
        .filter(differs & (pl.col("step_time_s") < pl.col("_best_s").fill_null(float("inf"))))
        .group_by(GROUP, maintain_order=True)
        .agg(pl.format("{} ({})", "method", "loss").str.join("; ").alias("passed_over"))
    )

    def days_of(method: str) -> pl.DataFrame:
        return ok.filter(pl.col("method") == method).select(*GROUP, pl.col("training_days").alias(f"days_{method}"))

    counts = (
        cells.filter(pl.col("valid"))
        .group_by(GROUP)
        .agg(
            (pl.col("status") == "ok").sum().alias("methods_ok"),
            (pl.col("status") == "oom").sum().alias("methods_oom"),
            (pl.col("status") == "unsupported").sum().alias("methods_unsupported"),
            pl.col("suspect").fill_null(False).sum().alias("methods_suspect"),
            (pl.col("status") == "noisy").sum().alias("methods_noisy"),
        )
    )
    table = (
        best.rename({"method": "best_method"})
        .join(passed, on=GROUP, how="left")
        .join(days_of("naive"), on=GROUP, how="left")
        .join(days_of("fl"), on=GROUP, how="left")
        .join(counts, on=GROUP, how="left")
        .with_columns(
            (pl.col("days_naive") / pl.col("training_days")).alias("speedup_vs_naive"),
            (pl.col("days_fl") / pl.col("training_days")).alias("speedup_vs_fl"),
        )
    )
    counted = ["methods_ok", "methods_oom", "methods_unsupported", "methods_suspect", "methods_noisy"]
    return table.select(TIME_TO_TRAIN_COLUMNS).cast({c: pl.Int64 for c in counted}).sort(GROUP)


def _method_state(cells: pl.DataFrame, method: str) -> pl.DataFrame:
    return cells.filter(pl.col("method") == method).select(
        *GROUP,
        pl.when(pl.col("status").is_in(RAN)).then(pl.lit("fits")).otherwise(pl.col("status")).alias(method),
    )


def feasibility(cells: pl.DataFrame, ttt: pl.DataFrame) -> pl.DataFrame:
    """Per model x GPU x count: does it fit with naive, with free-lunch alone, with any method?

    `naive`/`fl` say what that method did: fits (it ran; a suspect timing still fit), oom, unsupported,
    invalid, missing, corrupt, or `not swept`. `verdict` is the best that can be said of the setting.
    """
    status = pl.col("status")
    groups = cells.group_by(GROUP).agg(
        pl.col("world_size").first(),
        status.is_in(RAN).any().alias("fits_any"),
        pl.col("method").filter(status.is_in(RAN)).sort().alias("_fitting"),
        pl.col("valid").sum().cast(pl.Int64).alias("methods_valid"),
        (status == "ok").sum().cast(pl.Int64).alias("methods_ok"),
        (status == "oom").sum().cast(pl.Int64).alias("methods_oom"),
        (status == "unsupported").sum().cast(pl.Int64).alias("methods_unsupported"),
        status.is_in(["missing", "corrupt"]).sum().cast(pl.Int64).alias("methods_not_measured"),
    )
    table = (
        groups.join(_method_state(cells, "naive"), on=GROUP, how="left")
        .join(_method_state(cells, "fl"), on=GROUP, how="left")
        .join(ttt.select(*GROUP, "best_method", "training_days", "loss"), on=GROUP, how="left")
        .with_columns(
            pl.col("naive").fill_null("not swept"),
            pl.col("fl").fill_null("not swept"),
            pl.col("_fitting").list.join(", ").alias("fitting_methods"),
        )
        .with_columns(
            (pl.col("naive") == "fits").alias("fits_naive"),
            (pl.col("fl") == "fits").alias("fits_fl"),
        )
        .with_columns(
            pl.when(pl.col("fits_naive"))
            .then(pl.lit("naive"))
            .when(pl.col("fits_fl"))
            .then(pl.lit("free-lunch"))
            .when(pl.col("fits_any"))
            .then(pl.lit("other method"))
            .when(pl.col("methods_oom") > 0)
            .then(pl.lit("out of memory"))
            .when(pl.col("methods_unsupported") > 0)
            .then(pl.lit("unsupported"))
            .when(pl.col("methods_valid") == 0)
            .then(pl.lit("invalid"))
            .otherwise(pl.lit("not measured"))
            .alias("verdict")
        )
    )
    return table.select(FEASIBILITY_COLUMNS).sort(GROUP)


def costs_table(ttt: pl.DataFrame, catalog: Catalog | None, costs: CostsSection | None = None) -> pl.DataFrame:
    """Per time_to_train row: hardware, amortised and cloud cost of its best method, with a note when a
    price is missing; `pareto` marks the rows on their model's (days, cost) front (`costs`: the config's, typed;
    None: the schema's defaults)."""
    conf = pp_costs.typed(costs, "tables.aggregate.costs_table")
    gpus = catalog.gpus if catalog else {}
    base = catalog.base_machine_usd if catalog else {}
    gpus_path = catalog.gpus_path if catalog else "config/gpus.yaml"
    rows = []
    for r in ttt.select(*GROUP, "world_size", "best_method", "training_days").iter_rows(named=True):
        p = pp_costs.price(
            gpus.get(r["gpu"]), r["gpu"], r["nodes"], r["gpus_per_node"], r["training_days"], base,
            conf.amortisation_years, gpus_path,
        )  # fmt: skip
        d = p.to_dict()
        rows.append({**r, **{k: d[k] for k in COSTS_COLUMNS if k in d and k not in r}})
    kind = conf.pareto_cost
    mask = pp_costs.pareto_by_group(
        [r["model"] for r in rows], [r["training_days"] for r in rows], [r[f"{kind}_usd"] for r in rows]
    )
    for r, on in zip(rows, mask, strict=True):
        r["pareto"] = on
    return pl.DataFrame(rows, schema={c: columns.dtype(c) for c in COSTS_COLUMNS}).select(COSTS_COLUMNS)


def pareto_table(table: pl.DataFrame, costs: CostsSection | None = None) -> pl.DataFrame:
    """Per model, the settings of the costs `table` no other setting beats in both days and cost (the configured
    kind: `costs.pareto_cost`)."""
    kind = pp_costs.typed(costs, "tables.aggregate.pareto_table").pareto_cost
    return (
        table.filter(pl.col("pareto"))
        .with_columns(pl.lit(kind).alias("cost_kind"), pl.col(f"{kind}_usd").alias("cost_usd"))
        .select(PARETO_COLUMNS)
        .sort("model", "training_days", "cost_usd")
    )


def benchmark_cost(cells: pl.DataFrame, ttt: pl.DataFrame, strategy: str,
                   check_hours: dict[tuple[Any, ...], float] | None = None) -> pl.DataFrame:  # fmt: skip
    """Per setting: GPU-hours the benchmark itself spent (wall time x GPUs of every measured cell) beside the
    time-limit bound of the cells it ran and of every valid cell (what exhaustive search could spend), and what
    its loss check spent (`check_hours`: its job's wall time x GPUs, by setting; 0 where no job was needed)."""
    measured = pl.col("status").is_in([*STATUSES, "corrupt"])
    wall = pl.col("wall_time_s") if "wall_time_s" in cells.columns else pl.lit(None, pl.Float64)
    bound = pl.col("gpu_hours_max") if "gpu_hours_max" in cells.columns else pl.lit(None, pl.Float64)
    table = (
        cells.filter(pl.col("valid"))
        .group_by(GROUP)
        .agg(
            pl.col("world_size").first(),
            pl.len().cast(pl.Int64).alias("methods_valid"),
            measured.sum().cast(pl.Int64).alias("methods_run"),
            (pl.col("status") == "pruned").sum().cast(pl.Int64).alias("methods_pruned"),
            gpu_hours(wall, pl.col("world_size")).sum().alias("gpu_hours_spent"),
            bound.filter(measured).sum().alias("gpu_hours_max_run"),
            bound.sum().alias("gpu_hours_max_exhaustive"),
        )
        .join(ttt.select(*GROUP, "best_method"), on=GROUP, how="left")
        .with_columns(pl.lit(strategy).alias("strategy"))
    )
    rows = [{**dict(zip(GROUP, k, strict=True)), "loss_check_gpu_hours": v} for k, v in (check_hours or {}).items()]
    hours = pl.DataFrame(rows, schema={**{c: columns.dtype(c) for c in GROUP}, "loss_check_gpu_hours": pl.Float64})
    table = table.join(hours, on=GROUP, how="left")
    return table.select(BENCHMARK_COST_COLUMNS).sort(GROUP)


UNCHECKED = "unchecked"  # a loss_check line's role: a setting no method was checked at, its `note` says why


def loss_check_table(paths: Iterable[str], conf: LossCheckSection | None,
                     setting_methods: dict[tuple[Any, ...], list[str]] | None = None,
                     ) -> tuple[pl.DataFrame, dict[Any, float]]:  # fmt: skip
    """Every checked method's verdict and every precision change's line (planning/losscheck.judge_records), and
    each setting's check cost in GPU-hours, from the settings' curves files; a setting of `setting_methods`
    (setting -> its valid methods) that no method was checked at has an `unchecked` line saying why (its check
    record's note, or why none was planned), so that no reader is left to guess from an empty table."""
    conf = conf or losscheck.settings()  # None: the schema's
    require(conf, LossCheckSection, "tables.aggregate.loss_check_table")
    records, hours, why = [], {}, {}
    for path in paths:
        rec = losscheck.read(path)
        if rec is None or "setting" not in rec:
            continue
        rec["curves"] = str(path)
        records.append(rec)
        s = rec["setting"]
        check = rec.get("check") or {}
        spent = check.get("gpu_hours_spent", check.get("gpu_hours_estimate"))  # measured, else steps x step time
        hours[(s["model"], s["gpu"], s["nodes"], s["gpus_per_node"])] = spent or 0.0
        if not rec.get("runs") and rec.get("note"):
            why[(s["model"], s["gpu"], s["nodes"], s["gpus_per_node"])] = rec["note"]
    rows = losscheck.judge_records(records, conf.k, conf.tail)
    for key, valid in (setting_methods or {}).items():
        reason = losscheck.unplanned(conf, valid) or why.get(key)
        if reason:
            rows.append({**dict(zip(GROUP, key, strict=True)), "method": None, "role": UNCHECKED,
                         "loss": losscheck.NOT_CHECKED, "note": reason})  # fmt: skip
    curves = {losscheck.folder_of(r): r["curves"] for r in records}
    for r in rows:
        r["world_size"] = r["nodes"] * r["gpus_per_node"]
        r["curves"] = curves.get(losscheck.folder_of({"setting": r}))
    schema = {c: columns.dtype(c) for c in LOSS_CHECK_COLUMNS}
    table = pl.DataFrame([{c: r.get(c) for c in LOSS_CHECK_COLUMNS} for r in rows], schema=schema)
    return table.sort(KEYS), hours


def with_loss(cells: pl.DataFrame, checks: pl.DataFrame, checked: bool) -> pl.DataFrame:
    """cells.csv's `loss`: each method's verdict, `reference` for naive where a check ran, else `not checked`."""
    verdicts = checks.filter(pl.col("role") == "method").select(*KEYS, "loss")
    ran = pl.col("status").is_in(RAN)
    return cells.join(verdicts, on=KEYS, how="left").with_columns(
        pl.when(pl.col("loss").is_not_null())
        .then(pl.col("loss"))
        .when(ran & (pl.col("method") == "naive") & pl.lit(checked))
        .then(pl.lit(REFERENCE))
        .when(ran)
        .then(pl.lit(losscheck.NOT_CHECKED))
        .alias("loss")
    )


# ------------------------------------------------------------------------------------------- writing


MD_ROWS = 2000  # a Markdown table shows at most this many rows (the CSV holds them all)


def markdown_body(name: str, df: pl.DataFrame, max_rows: int | None = MD_ROWS) -> str:
    """Table `name` as Markdown: its reader's columns with units (tables/views.py) and their footnotes."""
    body = to_markdown(views.view(name, df), max_rows=max_rows, keys=3 if name != "problems" else 1)
    notes = [textwrap.fill(n, WIDTH) for n in views.footnotes(name, df)]
    return body + ("\n" + "\n".join(notes) + "\n" if notes else "")


EMPTY = {"problems": "None: every result file could be read."}  # what an empty table's Markdown says instead


def _write(out: dict[str, str], name: str, df: pl.DataFrame, csv: pl.DataFrame | None = None,
           extra: str = "") -> None:  # fmt: skip
    """A table's CSV and its Markdown; an empty table's Markdown says so (a header alone reads as a failure)."""
    atomic_write_text(out[f"{name}_csv"], (df if csv is None else csv).write_csv())
    body = markdown_body(name, df) if df.height else EMPTY.get(name, "None.") + "\n"
    atomic_write_text(out[f"{name}_md"], f"{intros.opening(name)}{body}{extra}")


def oom_section(cells: pl.DataFrame) -> str:
    """feasibility.md's second table: every `oom` cell, what it needs at micro-batch 1 and the cheapest fix."""
    oom = cells.filter(pl.col("status") == "oom")
    if oom.is_empty():
        return intros.oom_opening(any_oom=False)
    return intros.oom_opening(any_oom=True) + markdown_body("oom", oom.sort(KEYS))


def build_all(
    plan: str | Path | pl.DataFrame,
    result_paths: Iterable[str],
    catalog: Catalog | None = None,
    costs: CostsSection | None = None,
    pruned: dict[tuple[str, str, int, int, str], str] | None = None,
    strategy: str = "exhaustive",
    loss_checks: Iterable[str] = (),
    loss_check: LossCheckSection | None = None,
) -> dict[str, pl.DataFrame]:
    """Every table, in memory (`loss_checks`: the settings' loss-check curves files; `loss_check`: its config)."""
    cells, problems = cells_table(plan, result_paths, catalog, pruned)
    cells = memfix.explain_cells(cells, catalog)
    loss_checks = list(loss_checks)
    valid = cells.filter(pl.col("status") != "invalid").group_by(GROUP, maintain_order=True).agg(pl.col("method"))
    setting_methods = {tuple(r[:4]): r[4] for r in valid.iter_rows()}
    checks, check_hours = loss_check_table(loss_checks, loss_check, setting_methods)
    cells = with_loss(cells, checks, bool(loss_checks))
    ttt = time_to_train(cells)
    priced = costs_table(ttt, catalog, costs)
    return {
        "cells": cells,
        "time_to_train": ttt,
        "feasibility": memfix.explain_settings(feasibility(cells, ttt), cells, catalog),
        "costs": priced,
        "pareto": pareto_table(priced, costs),
        "problems": problems,
        "benchmark_cost": benchmark_cost(cells, ttt, strategy, check_hours),
        "loss_check": checks,
    }


def aggregate_rule(inputs: Any, outputs: Any, log_path: str, catalog: Catalog, params: Any) -> dict[str, pl.DataFrame]:
    """The `aggregate` rule's call (workflow/rules/aggregate.smk): its named inputs (plan, results, search,
    loss_checks), outputs and params (costs, loss_check: their JSON, typed here) handed to `build_tables`."""
    costs = CostsSection.of(params["costs"], "the aggregate rule's params: costs")
    return build_tables(inputs["plan"], list(inputs["results"]), dict(outputs.items()), log_path, catalog,
                        costs, search=list(inputs["search"]), loss_checks=list(inputs["loss_checks"]),
                        loss_check=losscheck.settings(params["loss_check"]))  # fmt: skip


def build_tables(
    plan_csv: str,
    result_paths: list[str],
    out: dict[str, str],
    log_path: str,
    catalog: Catalog | None = None,
    costs: CostsSection | None = None,
    search: Iterable[str] = (),
    loss_checks: Iterable[str] = (),
    loss_check: LossCheckSection | None = None,
) -> dict[str, pl.DataFrame]:
    """The `aggregate` rule: every table to CSV + Markdown (cells also Parquet), a log naming problems.
    With the adaptive search, `search` lists each setting's search.json: the cells it ran and those pruned;
    `loss_checks` each setting's loss-check curves file (`loss_check`: benchmark.loss_check)."""
    from pretrain_planner.search import read_searches

    t0 = time.perf_counter()
    searched, pruned = read_searches(search)
    paths = [*result_paths, *searched]
    strategy = "adaptive" if list(search) else "exhaustive"
    tables = build_all(plan_csv, paths, catalog, costs, pruned, strategy, loss_checks, loss_check)
    cells = tables["cells"]
    atomic_write(out["cells_parquet"], cells.write_parquet)
    _write(out, "cells", cells, cells.drop(JSON_FIELDS))
    for name in TABLE_NAMES[1:]:
        _write(out, name, tables[name], extra=oom_section(cells) if name == "feasibility" else "")
    by_status = dict(cells.group_by("status").len().sort("status").rows())
    problems = tables["problems"]
    lines = [
        f"{cells.height} cells: {by_status}; {tables['time_to_train'].height} time-to-train rows; "
        f"{tables['pareto'].height} on a Pareto front; {problems.height} unusable result files "
        f"({time.perf_counter() - t0:.2f} s)",
        f"{strategy} search: {tables['benchmark_cost']['gpu_hours_spent'].sum():.3f} GPU-hours spent by the benchmark",
        f"loss check: {tables['loss_check'].height} lines, "
        f"{tables['benchmark_cost']['loss_check_gpu_hours'].fill_null(0).sum():.4f} GPU-hours",
    ]
    lines += [f"SKIPPED {p}: {why}" for p, why in problems.select("path", "problem").iter_rows()]
    atomic_write_text(log_path, "\n".join(lines) + "\n")
    return tables
