"""The study's views ("$100K or 100 Days", code apoorvkh/academic-pretraining scripts/plotting/) from our results.

Each table is the counterpart of one of the study's figures or tables, computed from `cells` and `time_to_train`
(aggregate.py) and the catalog: days to train pivoted model x (GPU type, count) for naive and for the optimal
setting, and the optimal settings (training_time_tables.py); GPU-days of the original run vs ours (gpu_days.py);
mean speed-ups analytic / naive / optimal (training_time_avg.py); the memory-saving gain
(optimal_memory_saving_speedups.py); worst / median / optimal / free-lunch step per setting
(mem_saving_methods.py); training FLOPs per model (model_flops.py); and the study's headline numbers through our
`suspect` check. Only cells that ran (`ok`, not suspect) count, as in time_to_train. Imports no torch.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import polars as pl

from pretrain_planner.planning import methods
from pretrain_planner.planning.catalog import Catalog
from pretrain_planner.planning.flops import mfu, suspect, train_flops_per_sample
from pretrain_planner.results import atomic_write_text
from pretrain_planner.tables.aggregate import GROUP, read_table, to_markdown

STUDY_TABLES = ("days_naive", "days_optimal", "optimal_settings", "gpu_days", "speedups", "memory_saving",
                "step_time_stats", "model_flops", "study_claims")  # fmt: skip
DASH = "—"

# The study's headline numbers (papers.md A: the paper's abstract; the repository's README for 4 x A100).
STUDY_CLAIMS = [
    {"model": "pythia-1b", "gpu": "a100", "world_size": 4, "study_days": 17.57,
     "source": "A code README (print_optimal_config: fl + ZeRO-1, micro-batch 16, 16 accumulation steps)"},
    {"model": "pythia-1b", "gpu": "h100", "world_size": 4, "study_days": 8.0, "source": "A paper (4 x H100: 8 days)"},
    {"model": "pythia-1b", "gpu": "rtx3090", "world_size": 2, "study_days": 108.0,
     "source": "A paper (2 x RTX 3090: 108 days)"},
]  # fmt: skip
# The study's analytic peaks where they differ from the datasheet (papers.md A, experiments/training_time_analytic.py)
STUDY_PEAK_TFLOPS = {("h100", "half"): 756.0, ("h100", "tf32"): 378.0}
# torch's FlopCounterMode ignores `groups` in the convolution backward (papers.md A, cross-checks)
COUNTER_QUIRK = {
    "convnext": "torch's FlopCounterMode (the study's count, and ours before issue 17) counts ConvNeXt-XL at "
    "~1.09e12 per sample, 2.98x this: every depthwise weight gradient once per channel",
    "mamba": "the study's FlopCounterMode estimate of Mamba-2.8B is ~1.8x this (its depthwise conv1d's weight "
    "gradient counted once per channel); this closed form counts the projections",
}

INTROS = {
    "days_naive": "Days to train with `naive` alone, model x (GPU type, nodes x GPUs), as the study's naive table "
    "(whole days; `<1` under a day; a dash where naive did not run or fit).",
    "days_optimal": "Days to train with the fastest method that ran, model x (GPU type, nodes x GPUs), as the "
    "study's optimal table (whole days; `<1` under a day; a dash where nothing fits).",
    "optimal_settings": "The optimal setting of each model x GPU type x count: method (free-lunch, checkpointing, "
    "sharding, offload), micro-batch (MBS) and accumulation steps (GAS), as the study's table of optimal settings.",
    "gpu_days": "GPU-days of the original training run (as its authors reported it; config/models.yaml) beside ours: "
    "the measured setting with the fewest GPU-days (GPUs x days to train).",
    "speedups": "Per setting, the speed-up over `naive` of the analytic estimate (100% of the dense peak) and of the "
    "optimal method, as the study's training_time_avg; the last row is the mean.",
    "memory_saving": "Per setting, (free-lunch - best memory-saving method) / free-lunch days: what checkpointing, "
    "sharding or offload gain over free-lunch alone; negative where they cost time.",
    "step_time_stats": "Per setting, the worst, median and best step of the memory-saving methods that ran, and the "
    "best free-lunch-only step, as the study's comparison of memory-saving methods (speed-ups over the worst).",
    "model_flops": "Training FLOPs per model of the catalog: the closed form per sample x global batch x steps "
    "(model FLOPs only: no recomputation), with what the study's counter said where it differs.",
    "study_claims": "The study's headline numbers through the `suspect` check our cells get: the MFU each implies "
    "against the datasheet's dense peak (and the study's own analytic peak), beside our measurement if any.",
}


_STRING = {"model", "gpu", "best_method", "sharding", "ours_setting", "ours_method", "original_source",
           "free_lunch_method", "memory_saving_method", "optimal_method", "family", "study_counter_note",
           "suspect_reason", "source", "status", "method", "why", "basis", "note",
           "evidence", "rests_on", "sources", "model_error"}  # fmt: skip
_BOOL = {"free_lunch", "checkpointing", "offload", "in_sweep", "suspect"}
_INT = {"nodes", "gpus_per_node", "world_size", "micro_batch_size", "grad_accum_steps", "original_gpus",
        "memory_saving_methods", "global_batch", "recipe_steps", "micro_batch"}  # fmt: skip


def read_study_table(path: str | Path) -> pl.DataFrame:
    """A study or what-if CSV with its columns' dtypes (an all-empty column would otherwise read as text)."""
    with open(path) as fh:
        header = fh.readline().rstrip("\n").split(",")
    kinds = {c: pl.String if c in _STRING else pl.Boolean if c in _BOOL else pl.Int64 if c in _INT else pl.Float64
             for c in header if c}  # fmt: skip
    return pl.read_csv(path, schema_overrides=kinds)


def table_files(folder: str) -> dict[str, str]:
    """{name}_csv / {name}_md of every study table under `folder` (layout.STUDY_TABLES)."""
    return {f"{n}_{ext}": f"{folder}/{n}.{ext}" for n in STUDY_TABLES for ext in ("csv", "md")}


# ------------------------------------------------------------------------------------------------- helpers


def _kind(slug: str) -> str:
    """naive | free-lunch (fl and its throughput parts only) | memory-saving (checkpointing, sharding or offload)."""
    try:
        m = methods.parse(slug)
    except ValueError:
        return "other"
    if m.checkpointing or m.sharding or m.offload:
        return "memory-saving"
    return "free-lunch" if m.free_lunch else "naive"


def ran(cells: pl.DataFrame) -> pl.DataFrame:
    """Cells that ran and count (ok, not suspect), with their method's kind."""
    ok = cells.filter((pl.col("status") == "ok") & ~pl.col("suspect").fill_null(False))
    kinds = {s: _kind(s) for s in ok["method"].unique().to_list()}
    return ok.with_columns(pl.col("method").replace_strict(kinds, default="other").alias("kind"))


def _setting_label(gpu: str, nodes: int, gpn: int) -> str:
    return f"{gpu} {nodes}x{gpn}"


def _round_days(v: float | None) -> str:
    """The study's rounding: whole days; `<1` under a day (the demo's), a dash where nothing fits."""
    if v is None:
        return DASH
    return "<1" if v < 0.5 else f"{v:.0f}"


def days_pivot(settings: pl.DataFrame, values: pl.DataFrame, column: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(csv, md): rows model, one column per setting (GPU type, nodes x GPUs) of `settings`; csv unrounded days
    (null: nothing), md the study's rounding."""
    cols = settings.select("gpu", "nodes", "gpus_per_node", "world_size").unique().sort("gpu", "world_size", "nodes")
    labels = [_setting_label(g, n, k) for g, n, k, _ in cols.rows()]
    models = sorted(set(settings["model"].to_list()))
    got = {(r["model"], r["gpu"], r["nodes"], r["gpus_per_node"]): r[column] for r in values.iter_rows(named=True)}
    rows = [{"model": m, **{lab: got.get((m, g, n, k)) for lab, (g, n, k, _) in zip(labels, cols.rows(), strict=True)}}
            for m in models]  # fmt: skip
    schema = {"model": pl.String, **{lab: pl.Float64 for lab in labels}}
    csv = pl.DataFrame(rows, schema=schema)
    md = pl.DataFrame([{k: (v if k == "model" else _round_days(v)) for k, v in r.items()} for r in rows],
                      schema={k: pl.String for k in schema})  # fmt: skip
    return csv, md


# -------------------------------------------------------------------------------------------------- tables


def optimal_settings(ttt: pl.DataFrame) -> pl.DataFrame:
    """The study's table of optimal settings: the best method's parts, micro-batch and accumulation."""
    best = ttt.filter(pl.col("best_method").is_not_null())
    parts = {s: methods.parse(s) for s in best["best_method"].unique().to_list()}
    return best.select(
        *GROUP, "world_size", "best_method",
        pl.col("best_method").replace_strict({s: m.free_lunch for s, m in parts.items()}, return_dtype=pl.Boolean)
        .alias("free_lunch"),
        pl.col("best_method").replace_strict({s: m.checkpointing for s, m in parts.items()}, return_dtype=pl.Boolean)
        .alias("checkpointing"),
        pl.col("best_method").replace_strict({s: m.sharding or "" for s, m in parts.items()}, return_dtype=pl.String)
        .alias("sharding"),
        pl.col("best_method").replace_strict({s: m.offload for s, m in parts.items()}, return_dtype=pl.Boolean)
        .alias("offload"),
        "micro_batch_size", "grad_accum_steps", "training_days",
    ).sort(GROUP)  # fmt: skip


def gpu_days(ttt: pl.DataFrame, catalog: Catalog | None) -> pl.DataFrame:
    """Per model of the sweep: the original run's GPUs x days beside the measured setting with the fewest."""
    timed = ttt.filter(pl.col("training_days").is_not_null()).with_columns(
        (pl.col("training_days") * pl.col("world_size")).alias("ours_gpu_days")
    )
    rows = []
    for model in sorted(set(ttt["model"].to_list())):
        spec = catalog.models.get(model) if catalog else None
        orig = (spec.original_training if spec else None) or {}
        mine = timed.filter(pl.col("model") == model).sort("ours_gpu_days")
        best = mine.row(0, named=True) if mine.height else {}
        og = orig.get("gpus", 0) * orig.get("days", 0) if orig else None
        ours = best.get("ours_gpu_days")
        rows.append({
            "model": model, "original_gpus": orig.get("gpus"), "original_days": orig.get("days"),
            "original_gpu_days": og, "ours_setting": _setting_label(best["gpu"], best["nodes"], best["gpus_per_node"])
            if best else None, "ours_method": best.get("best_method"), "ours_days": best.get("training_days"),
            "ours_gpu_days": ours, "ours_over_original": ours / og if ours is not None and og else None,
            "original_source": orig.get("source"),
        })  # fmt: skip
    schema = {"model": pl.String, "original_gpus": pl.Int64, "original_days": pl.Float64,
              "original_gpu_days": pl.Float64, "ours_setting": pl.String, "ours_method": pl.String,
              "ours_days": pl.Float64, "ours_gpu_days": pl.Float64, "ours_over_original": pl.Float64,
              "original_source": pl.String}  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def speedups(ttt: pl.DataFrame) -> pl.DataFrame:
    """Per setting with a naive time: speed-ups over naive of the analytic estimate and of the optimal method."""
    return (
        ttt.filter(pl.col("days_naive").is_not_null())
        .select(
            *GROUP, "world_size", "days_naive", "analytic_days", pl.col("training_days").alias("days_optimal"),
            (pl.col("days_naive") / pl.col("analytic_days")).alias("speedup_analytic"),
            pl.lit(1.0).alias("speedup_naive"),
            (pl.col("days_naive") / pl.col("training_days")).alias("speedup_optimal"),
        )
        .sort(GROUP)
    )  # fmt: skip


def _with_mean(df: pl.DataFrame, label_col: str, cols: list[str]) -> pl.DataFrame:
    """The table with a last row `mean` of `cols` (for the Markdown only: the CSV keeps one row per setting)."""
    if df.is_empty():
        return df
    mean = {c: None for c in df.columns} | {label_col: "mean"} | {c: df[c].drop_nulls().mean() for c in cols}
    return pl.concat([df.cast({label_col: pl.String}), pl.DataFrame([mean], schema=df.schema)], how="vertical")


def _per_setting(ok: pl.DataFrame, kind: str, value: str = "step_time_s") -> pl.DataFrame:
    return (
        ok.filter(pl.col("kind") == kind)
        .group_by(GROUP)
        .agg(
            pl.col(value).min().alias("best"),
            pl.col("method").sort_by(value).first().alias("best_method"),
            pl.col(value).median().alias("median"),
            pl.col(value).max().alias("worst"),
            pl.len().cast(pl.Int64).alias("methods"),
        )
    )


def memory_saving(cells: pl.DataFrame) -> pl.DataFrame:
    """Per setting where free-lunch or a memory-saving method ran: (free-lunch - best memory-saving) / free-lunch
    days (the study's optimal_memory_saving_speedups); null where either did not run."""
    ok = ran(cells)
    fl = _per_setting(ok, "free-lunch", "training_days").select(
        *GROUP, pl.col("best").alias("days_free_lunch"), pl.col("best_method").alias("free_lunch_method")
    )
    ms = _per_setting(ok, "memory-saving", "training_days").select(
        *GROUP, pl.col("best").alias("days_memory_saving"), pl.col("best_method").alias("memory_saving_method")
    )
    ws = ok.select(*GROUP, "world_size").unique(GROUP)
    return (
        fl.join(ms, on=GROUP, how="full", coalesce=True)
        .join(ws, on=GROUP, how="left")
        .with_columns(((pl.col("days_free_lunch") - pl.col("days_memory_saving")) / pl.col("days_free_lunch"))
                      .alias("gain"))
        .select(*GROUP, "world_size", "free_lunch_method", "days_free_lunch", "memory_saving_method",
                "days_memory_saving", "gain")
        .sort(GROUP)
    )  # fmt: skip


def step_time_stats(cells: pl.DataFrame) -> pl.DataFrame:
    """Per setting: worst / median / optimal step of its memory-saving methods and the best free-lunch-only step,
    with each one's speed-up over the worst (the study's mem_saving_methods figure)."""
    ok = ran(cells)
    ms = _per_setting(ok, "memory-saving")
    fl = _per_setting(ok, "free-lunch").select(*GROUP, pl.col("best").alias("free_lunch_s"))
    ws = ok.select(*GROUP, "world_size").unique(GROUP)
    return (
        ms.join(fl, on=GROUP, how="left")
        .join(ws, on=GROUP, how="left")
        .select(
            *GROUP, "world_size", pl.col("methods").alias("memory_saving_methods"),
            pl.col("worst").alias("worst_s"), pl.col("median").alias("median_s"), pl.col("best").alias("optimal_s"),
            pl.col("best_method").alias("optimal_method"), "free_lunch_s",
            (pl.col("worst") / pl.col("median")).alias("speedup_median"),
            (pl.col("worst") / pl.col("best")).alias("speedup_optimal"),
            (pl.col("worst") / pl.col("free_lunch_s")).alias("speedup_free_lunch"),
        )
        .sort(GROUP)
    )  # fmt: skip


def model_flops(catalog: Catalog | None, swept: set[str]) -> pl.DataFrame:
    """Per catalog model: FLOPs per sample (closed form), global batch, steps, total training FLOPs."""
    rows = []
    for name, spec in catalog.models.items() if catalog else []:
        per = train_flops_per_sample(spec.to_dict())
        steps = spec.recipe.steps
        rows.append({
            "model": name, "family": spec.family, "in_sweep": name in swept, "flops_per_sample": per,
            "global_batch": spec.recipe.global_batch, "recipe_steps": steps,
            "training_flops": per * spec.recipe.global_batch * steps if per and steps else None,
            "study_counter_note": COUNTER_QUIRK.get(spec.family, ""),
        })  # fmt: skip
    schema = {"model": pl.String, "family": pl.String, "in_sweep": pl.Boolean, "flops_per_sample": pl.Float64,
              "global_batch": pl.Int64, "recipe_steps": pl.Int64, "training_flops": pl.Float64,
              "study_counter_note": pl.String}  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def study_claims(catalog: Catalog | None, ttt: pl.DataFrame, limit: float) -> pl.DataFrame:
    """The study's headline numbers through `flops.suspect` (the check every cell gets, at benchmark.suspect_mfu)."""
    rows = []
    for claim in STUDY_CLAIMS:
        spec = catalog.models.get(claim["model"]) if catalog else None
        gpu = catalog.gpus.get(claim["gpu"]) if catalog else None
        if spec is None or gpu is None:
            continue
        per_step = (train_flops_per_sample(spec.to_dict()) or 0) * spec.recipe.global_batch
        step = claim["study_days"] * 86400 / spec.recipe.steps
        half = spec.recipe.precision != "fp32"
        peak = gpu.peak_for(spec.recipe.precision, tf32=True)
        study_peak = STUDY_PEAK_TFLOPS.get((claim["gpu"], "half" if half else "tf32"), peak)
        util = mfu(per_step, step, claim["world_size"], peak)
        flag, why = suspect(util, limit)
        ours = ttt.filter((pl.col("model") == claim["model"]) & (pl.col("gpu") == claim["gpu"])
                          & (pl.col("world_size") == claim["world_size"]))["training_days"].drop_nulls()  # fmt: skip
        rows.append({
            **{k: claim[k] for k in ("model", "gpu", "world_size", "study_days")}, "peak_tflops": peak,
            "implied_mfu": util, "study_peak_tflops": study_peak,
            "implied_mfu_study_peak": mfu(per_step, step, claim["world_size"], study_peak),
            "suspect": flag, "suspect_reason": why, "ours_days": ours.min() if ours.len() else None,
            "source": claim["source"],
        })  # fmt: skip
    schema = {"model": pl.String, "gpu": pl.String, "world_size": pl.Int64, "study_days": pl.Float64,
              "peak_tflops": pl.Float64, "implied_mfu": pl.Float64, "study_peak_tflops": pl.Float64,
              "implied_mfu_study_peak": pl.Float64, "suspect": pl.Boolean, "suspect_reason": pl.String,
              "ours_days": pl.Float64, "source": pl.String}  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def build_all(cells: pl.DataFrame, ttt: pl.DataFrame, catalog: Catalog | None, limit: float) -> dict[str, Any]:
    """Every study table in memory: name -> DataFrame, or (csv, md) where the Markdown differs."""
    settings = cells.filter(pl.col("valid")).select("model", "gpu", "nodes", "gpus_per_node", "world_size")
    naive = ran(cells).filter(pl.col("method") == "naive")
    spd = speedups(ttt)
    stats = step_time_stats(cells)
    return {
        "days_naive": days_pivot(settings, naive, "training_days"),
        "days_optimal": days_pivot(settings, ttt, "training_days"),
        "optimal_settings": optimal_settings(ttt),
        "gpu_days": gpu_days(ttt, catalog),
        "speedups": (spd, _with_mean(spd, "model", ["speedup_analytic", "speedup_naive", "speedup_optimal"])),
        "memory_saving": (ms := memory_saving(cells), _with_mean(ms, "model", ["gain"])),
        "step_time_stats": (stats, _with_mean(stats, "model", ["speedup_median", "speedup_optimal",
                                                                "speedup_free_lunch"])),
        "model_flops": model_flops(catalog, set(cells["model"].to_list())),
        "study_claims": study_claims(catalog, ttt, limit),
    }  # fmt: skip


def build_study_tables(
    cells_parquet: str,
    time_to_train_csv: str,
    out: dict[str, str],
    log_path: str,
    catalog: Catalog | None,
    suspect_mfu: float,
) -> dict[str, Any]:
    """The `study_tables` rule: every study table to CSV + Markdown (the intro, then the table)."""
    t0 = time.perf_counter()
    tables = build_all(pl.read_parquet(cells_parquet), read_table(time_to_train_csv), catalog, suspect_mfu)
    for name, value in tables.items():
        csv, md = value if isinstance(value, tuple) else (value, value)
        Path(out[f"{name}_csv"]).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out[f"{name}_csv"], csv.write_csv())
        title = name.replace("_", " ").capitalize()
        atomic_write_text(out[f"{name}_md"], f"# {title}\n\n{INTROS[name]}\n\n{to_markdown(md, max_rows=2000)}")
    sizes = {n: (v[0] if isinstance(v, tuple) else v).height for n, v in tables.items()}
    atomic_write_text(log_path, f"study tables {sizes} ({time.perf_counter() - t0:.2f} s)\n")
    return tables
