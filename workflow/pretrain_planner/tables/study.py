"""The study's views ("$100K or 100 Days", code apoorvkh/academic-pretraining scripts/plotting/) from our results.

Each table is the counterpart of one of the study's figures or tables, computed from `cells` (aggregate.py) and the
catalog by the study's own definitions (its scripts/plotting/__init__.py `process_training_time_results` and each
figure's script):

- **naive**: the method `naive` alone (the study's all_naive sweep).
- **optimal**: the fastest of the *free-lunch* methods, with or without the memory-saving parts (its all_optimized
  sweep has `free_lunch: true` only; `select_min`). Our own "fastest of every method" stays in time_to_train.
- **free-lunch only**: free-lunch without checkpointing, sharding or offload (`free_lunch_only`); **memory-saving**:
  free-lunch with at least one of them (`mem_saving_only`). A method with the `naive` base and a memory-saving part
  (e.g. `naive+ac`) is in none of the study's sets.
- **averages** over the study's Pythia models only (`study.average_families`, default GPT-NeoX): the speed-ups of
  training_time_avg.py over every GPU count, the memory-saving figures (optimal_memory_saving_speedups.py,
  mem_saving_methods.py) over more than one GPU. Every averaged table has an `in_mean` column.
- **GPU-days**: GPUs x days of the optimal setting on one node of 8 A100s (`study.gpu_days_*`; gpu_days.py).
- **order**: models in the study's order (family as the study lists them, then size), GPU types in the catalog's
  (config/gpus.yaml lists RTX 3090, A6000, A100, H100 first, the study's order).

The tables are: days to train pivoted model x (GPU type, count) for naive and for the optimal setting, and the optimal
settings (training_time_tables.py); GPU-days of the original run vs ours (gpu_days.py); speed-ups analytic / naive /
optimal (training_time_avg.py); the memory-saving gain (optimal_memory_saving_speedups.py); worst / median / optimal /
free-lunch step per setting (mem_saving_methods.py); training FLOPs per model (model_flops.py); and the study's
headline numbers through our `suspect` check. Only cells that ran (`ok`, not suspect) count, as in time_to_train.

The CSVs keep the study's column names (the plots read them); the Markdown is written as the main tables are
(tables/views.py `study_*`: the reader's headers and units, an averaged view's mean row labelled `mean`), with notes
under each table: what the mean averages and, where the optimal is slower than naive, why (on the `cpu` stand-in,
`on_stand_in`, free-lunch has little to win: the stand-in's result, not a finding about GPUs). Imports no torch.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from pretrain_planner.planning import methods
from pretrain_planner.planning.catalog import Catalog
from pretrain_planner.planning.configtypes import StudySection, require
from pretrain_planner.planning.families import DISPLAY_ORDER
from pretrain_planner.planning.flops import mfu, param_count, suspect, train_flops_per_sample
from pretrain_planner.results import atomic_write_text
from pretrain_planner.tables import columns, units, views
from pretrain_planner.tables.aggregate import GROUP, MD_ROWS
from pretrain_planner.tables.markdown import WIDTH, to_markdown

STUDY_TABLES = ("days_naive", "days_optimal", "optimal_settings", "gpu_days", "speedups", "memory_saving",
                "step_time_stats", "model_flops", "study_claims")  # fmt: skip
PIVOTS = ("days_naive", "days_optimal")  # model x setting: every column after the model a value, no view
DASH = "—"
# The GPU type whose ranks are CPU processes (trainer/rank.py `_select_device`; config/gpus.yaml): the demo's
# stand-in for a GPU, where the free-lunch methods have little to win (STAND_IN_WHY)
STAND_IN_GPU = "cpu"
STAND_IN_WHY = (
    'On the `cpu` stand-in (each "GPU" one CPU process) free-lunch has little to win: TF32 does not exist on a CPU '
    "and torch.compile and SDPA attention pay off for GPU kernels, so the optimal (the fastest fl-based method) "
)
STAND_IN_SLOWER = "is slower than naive in {slower} of its {settings} settings here: the stand-in's result, not a " \
    "finding about GPUs."  # fmt: skip
STAND_IN_NOT_SLOWER = "gains little or nothing over naive there: its speed-ups are the stand-in's, not a finding " \
    "about GPUs."  # fmt: skip
GPU_SLOWER = (
    "On GPU types the optimal is slower than naive in {slower} of {settings} settings: naive is faster there, and "
    "the study's optimal takes the fl-based methods only (time_to_train has the fastest of every method)."
)

# The study's headline numbers (the paper's abstract; its code's README for 4 x A100: docs/methods.md, Facts).
STUDY_CLAIMS = [
    {"model": "pythia-1b", "gpu": "a100", "world_size": 4, "study_days": 17.57,
     "source": "A code README (print_optimal_config: fl + ZeRO-1, micro-batch 16, 16 accumulation steps)"},
    {"model": "pythia-1b", "gpu": "h100", "world_size": 4, "study_days": 8.0, "source": "A paper (4 x H100: 8 days)"},
    {"model": "pythia-1b", "gpu": "rtx3090", "world_size": 2, "study_days": 108.0,
     "source": "A paper (2 x RTX 3090: 108 days)"},
]  # fmt: skip
# The study's analytic peaks where they differ from the datasheet (its experiments/training_time_analytic.py)
STUDY_PEAK_TFLOPS = {("h100", "half"): 756.0, ("h100", "tf32"): 378.0}
# torch's FlopCounterMode ignores `groups` in the convolution backward (docs/methods.md, Facts: FLOP counter)
COUNTER_QUIRK = {
    "convnext": "torch's FlopCounterMode (the study's count) counts ConvNeXt-XL at ~1.09e12 per sample, 2.98x "
    "this: every depthwise weight gradient once per channel",
    "mamba": "the study's FlopCounterMode estimate of Mamba-2.8B is ~1.8x this (its depthwise conv1d's weight "
    "gradient counted once per channel); this closed form counts the projections",
}

INTROS = {
    "days_naive": "Days to train with `naive` alone, model x (GPU type, nodes x GPUs), as the study's naive table "
    '(whole days from 10 on, as the study\'s; "3.2 d" below; hours or minutes under a day; a dash where naive did '
    "not run or fit).",
    "days_optimal": "Days to train with the study's optimal setting, model x (GPU type, nodes x GPUs), as its optimal "
    "table: the fastest **fl-based** (free-lunch) method that ran, with or without checkpointing, sharding or offload "
    "(naive and e.g. naive+ac are not candidates; time_to_train has the fastest of every method). Whole days from 10 "
    'on, as the study\'s; "3.2 d" below; hours or minutes under a day; a dash where nothing fits.',
    "optimal_settings": "The study's optimal setting (the fastest fl-based method) of each model x GPU type x count: "
    "the method, its parts (ac: activation checkpointing; sharding; offload), micro-batch x accumulation steps (the "
    "study's MBS and GAS), MFU and days, as the study's table of optimal settings.",
    "gpu_days": "GPU-days of the original training run (as its authors reported it; config/models.yaml; every catalog "
    "model with a record) beside ours as the study computes it: {gpus} x the days of the optimal setting on {setting} "
    "(`study.gpu_days_*`), blank where that setting was not measured or nothing fits on it.",
    "speedups": "Per setting with a naive time, the speed-up over `naive` of the analytic estimate (100% of the dense "
    "peak) and of the optimal (the fastest fl-based method), as the study's training_time_avg; the last row is the "
    "study's mean, over {families} models with all three times on every GPU count (the study averages its Pythia "
    "models).",
    "memory_saving": "Per setting, what the memory-saving methods (free-lunch with checkpointing, sharding or "
    "offload) gain over free-lunch alone: (free-lunch only - best memory-saving) / free-lunch-only days, negative "
    "where they cost time, as the study's optimal_memory_saving_speedups; the last row is the mean of its figure by "
    "model ({families} models on more than one GPU).",
    "step_time_stats": "Per setting, the worst step of the memory-saving methods (free-lunch with checkpointing, "
    "sharding or offload) that ran, and the speed-ups over it of their median and best and of free-lunch alone, as "
    "the study's comparison of memory-saving methods; the last row is the mean over {families} models on more than "
    "one GPU, as the study's figure.",
    "model_flops": "Training FLOPs per model of the catalog: the closed form per sample x global batch x steps "
    "(model FLOPs only: no recomputation), with what the study's counter said where it differs.",
    "study_claims": "The study's headline numbers through the `suspect` check our cells get: the MFU each implies "
    "against the datasheet's dense peak (and the study's own analytic peak), beside our optimal (fastest fl-based) "
    "measurement of the same setting if any.",
}


def read_study_table(path: str | Path) -> pl.DataFrame:
    """A study or what-if CSV with its columns' dtypes (an all-empty column would otherwise read as text)."""
    return columns.read_csv(path, columns.STUDY_COLUMNS)


def table_files(folder: str) -> dict[str, str]:
    """{name}_csv / {name}_md of every study table under `folder` (layout.STUDY_TABLES)."""
    return {f"{n}_{ext}": f"{folder}/{n}.{ext}" for n in STUDY_TABLES for ext in ("csv", "md")}


def typed(study: StudySection | None, where: str) -> StudySection:
    """The study section the views are computed with: the one typed where the config was loaded (a dict refused,
    naming `where`), else (None: no config, a test's tables) the study's own definitions, the schema's defaults."""
    if study is None:
        return StudySection.given()
    require(study, StudySection, where)
    return study


# ------------------------------------------------------------------------------------------------- helpers


def _kind(slug: str) -> str:
    """The study's sets: naive | free-lunch (fl and its throughput parts only) | memory-saving (free-lunch with
    checkpointing, sharding or offload) | other (a naive base with a memory-saving part: in none of the study's)."""
    try:
        m = methods.parse(slug)
    except ValueError:
        return "other"
    saving = m.checkpointing or bool(m.sharding) or m.offload
    if m.free_lunch:
        return "memory-saving" if saving else "free-lunch"
    return "other" if saving else "naive"


def on_stand_in(df: pl.DataFrame) -> pl.Expr:
    """Whether a cell ran as CPU processes, the `cpu` stand-in: its GPU type is `cpu` (the trainer's rule), its
    dense peak was measured on the host (`peak_kind`: only a CPU rank measures one), or its device was a CPU
    (`device_name`, e.g. with `benchmark.device: cpu`). What free-lunch gains there says nothing about GPUs."""
    expr = pl.col("gpu") == STAND_IN_GPU
    if "peak_kind" in df.columns:
        expr = expr | (pl.col("peak_kind") == "measured").fill_null(False)
    if "device_name" in df.columns:
        expr = expr | pl.col("device_name").str.starts_with("CPU").fill_null(False)
    return expr


def stand_in_settings(cells: pl.DataFrame) -> pl.DataFrame:
    """Per setting (GROUP): `stand_in`, whether any of its cells ran on the stand-in."""
    if cells.is_empty():
        return pl.DataFrame(schema={**{c: cells.schema[c] for c in GROUP}, "stand_in": pl.Boolean})
    return cells.group_by(GROUP).agg(on_stand_in(cells).any().alias("stand_in"))


def optimal_notes(spd: pl.DataFrame) -> list[str]:
    """What the optimal's speed-ups over naive (`speedups`) say: on the stand-in, why they say nothing about GPUs
    (and how often its optimal is slower than naive); on GPUs, where naive is the faster and why the optimal is
    still the fl-based one."""
    if spd.is_empty() or "stand_in" not in spd.columns:
        return []
    both = spd.filter(pl.col("speedup_optimal").is_not_null())
    notes = []
    for stand, in_kind in ((True, both.filter(pl.col("stand_in"))), (False, both.filter(~pl.col("stand_in")))):
        slower = in_kind.filter(pl.col("speedup_optimal") < 1).height
        if stand and in_kind.height:
            verdict = STAND_IN_SLOWER if slower else STAND_IN_NOT_SLOWER
            notes.append(STAND_IN_WHY + verdict.format(slower=slower, settings=in_kind.height))
        elif not stand and slower:
            notes.append(GPU_SLOWER.format(slower=slower, settings=in_kind.height))
    return notes


def stand_in_line(spd: pl.DataFrame) -> str | None:
    """The speed-ups plot's line under its bars where the rows it averages (`speedups` rows) ran on the `cpu`
    stand-in: why free-lunch wins little there, and that a mean optimal under 1x is the stand-in's, not the GPUs'.
    None where no row did."""
    if spd.is_empty():
        return None
    flag = pl.col("stand_in").fill_null(False) if "stand_in" in spd.columns else pl.col("gpu") == STAND_IN_GPU
    stand = spd.filter(flag)
    if stand.is_empty():
        return None
    mean = spd["speedup_optimal"].drop_nulls().mean() if "speedup_optimal" in spd.columns else None
    under = mean is not None and float(mean) < 1  # type: ignore[arg-type]
    what = "the optimal under 1x is" if under else "these speed-ups are"
    return (f'{stand.height} of {spd.height} averaged settings ran on the cpu stand-in (each "GPU" one CPU '
            f"process): free-lunch has little to win on a CPU (no TF32; compile and SDPA pay off on GPUs), so {what} "
            "the stand-in's result, not a finding about GPUs")  # fmt: skip


def ran(cells: pl.DataFrame) -> pl.DataFrame:
    """Cells that ran and count (ok, not suspect), with their method's kind (the study's sets)."""
    ok = cells.filter((pl.col("status") == "ok") & ~pl.col("suspect").fill_null(False))
    kinds = {s: _kind(s) for s in ok["method"].unique().to_list()}
    return ok.with_columns(pl.col("method").replace_strict(kinds, default="other").alias("kind"))


def optimal(cells: pl.DataFrame) -> pl.DataFrame:
    """Per setting, the study's optimal cell: the fastest free-lunch method (with or without memory saving) that ran;
    ties broken by the slug, as time_to_train breaks them."""
    return (
        ran(cells)
        .filter(pl.col("kind").is_in(["free-lunch", "memory-saving"]))
        .sort("step_time_s", "method")
        .group_by(GROUP, maintain_order=True)
        .first()
    )


def setting_label(gpu: str, nodes: int, gpn: int) -> str:
    return f"{gpu} {nodes}x{gpn}"


def _round_days(v: float | None) -> str:
    """Days as every table writes them (tables/units.py: whole days from 10 on, as the study's, "3.2 d" below, hours or
    minutes under a day), a dash where nothing fits."""
    if v is None:
        return DASH
    return units.days(v)


def model_rank(catalog: Catalog | None, models: list[str]) -> dict[str, int]:
    """Each model's place in the study's order: its family as the study lists them (families.DISPLAY_ORDER), then
    its size (parameters), then its name; models the catalog does not know come last, by name."""

    def key(name: str) -> tuple:
        spec = catalog.models.get(name) if catalog else None
        if spec is None:
            return (len(DISPLAY_ORDER) + 1, 0.0, name)
        fam = DISPLAY_ORDER.index(spec.family) if spec.family in DISPLAY_ORDER else len(DISPLAY_ORDER)
        return (fam, param_count(spec.to_dict()) or 0.0, name)

    return {m: i for i, m in enumerate(sorted(set(models), key=key))}


def gpu_rank(catalog: Catalog | None, gpus: list[str]) -> dict[str, int]:
    """Each GPU type's place: the catalog's order (config/gpus.yaml: the study's RTX 3090, A6000, A100, H100 first),
    then unknown types by name."""
    known = list(catalog.gpus) if catalog else []
    ordered = [g for g in known if g in set(gpus)] + sorted(set(gpus) - set(known))
    return {g: i for i, g in enumerate(ordered)}


def study_sort(df: pl.DataFrame, catalog: Catalog | None) -> pl.DataFrame:
    """Rows in the study's order: model, GPU type, then GPU count (world size) and nodes."""
    if df.is_empty():
        return df
    keys = []
    if "model" in df.columns:
        ranks = model_rank(catalog, df["model"].drop_nulls().to_list())
        keys.append(pl.col("model").replace_strict(ranks, default=len(ranks), return_dtype=pl.Int64))
    if "gpu" in df.columns:
        ranks = gpu_rank(catalog, df["gpu"].drop_nulls().to_list())
        keys.append(pl.col("gpu").replace_strict(ranks, default=len(ranks), return_dtype=pl.Int64))
    keys += [pl.col(c) for c in ("world_size", "nodes") if c in df.columns]
    return df.sort(keys)


def _averaged(df: pl.DataFrame, catalog: Catalog | None, families: list[str]) -> pl.Expr:
    """Whether a row's model is of the families the study averages (its Pythia models: GPT-NeoX)."""
    fams = {m: (catalog.models[m].family if catalog and m in catalog.models else "") for m in df["model"].unique()}
    return pl.col("model").replace_strict(fams, default="", return_dtype=pl.String).is_in(families)


def days_pivot(
    settings: pl.DataFrame, values: pl.DataFrame, column: str, catalog: Catalog | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(csv, md): rows model, one column per setting (GPU type, nodes x GPUs) of `settings`, both in the study's
    order; csv unrounded days (null: nothing), md the study's rounding."""
    cols = study_sort(settings.select("gpu", "nodes", "gpus_per_node", "world_size").unique(), catalog)
    labels = [setting_label(g, n, k) for g, n, k, _ in cols.rows()]
    ranks = model_rank(catalog, settings["model"].to_list())
    models = sorted(ranks, key=ranks.__getitem__)
    got = {(r["model"], r["gpu"], r["nodes"], r["gpus_per_node"]): r[column] for r in values.iter_rows(named=True)}
    rows = [{"model": m, **{lab: got.get((m, g, n, k)) for lab, (g, n, k, _) in zip(labels, cols.rows(), strict=True)}}
            for m in models]  # fmt: skip
    schema = {"model": pl.String, **{lab: pl.Float64 for lab in labels}}
    csv = pl.DataFrame(rows, schema=schema)
    md = pl.DataFrame([{k: (v if k == "model" else _round_days(v)) for k, v in r.items()} for r in rows],
                      schema={k: pl.String for k in schema})  # fmt: skip
    return csv, md


# -------------------------------------------------------------------------------------------------- tables


def optimal_settings(best: pl.DataFrame, catalog: Catalog | None = None) -> pl.DataFrame:
    """The study's table of optimal settings (from `optimal`): the method's parts, micro-batch and accumulation; its
    MFU (against a measured peak where `peak_kind` says so) and whether it ran on the stand-in."""
    parts = {s: methods.parse(s) for s in best["method"].unique().to_list()}

    def part(attr: str, dtype: type[pl.DataType], fill: Any = None) -> pl.Expr:
        vals = {s: getattr(m, attr) if fill is None else getattr(m, attr) or fill for s, m in parts.items()}
        return pl.col("best_method").replace_strict(vals, return_dtype=dtype).alias(attr)

    out = best.rename({"method": "best_method"}).select(
        *GROUP, "world_size", "best_method", part("free_lunch", pl.Boolean),
        part("checkpointing", pl.Boolean), part("sharding", pl.String, ""),
        part("offload", pl.Boolean), "micro_batch", "grad_accum_steps", "training_days",
        _col(best, "mfu", pl.Float64), _col(best, "peak_kind", pl.String), on_stand_in(best).alias("stand_in"),
    )  # fmt: skip
    return study_sort(out, catalog)


def _col(df: pl.DataFrame, name: str, dtype: type[pl.DataType]) -> pl.Expr:
    """Column `name`, null where the cells table has none (a hand-made table)."""
    return pl.col(name) if name in df.columns else pl.lit(None, dtype=dtype).alias(name)


def recorded_models(catalog: Catalog | None) -> list[str]:
    """The catalog models with an original training record (GPUs x days as their authors reported)."""
    return [name for name, spec in (catalog.models.items() if catalog else []) if spec.original_training]


def gpu_days(best: pl.DataFrame, models: list[str], catalog: Catalog | None, study: StudySection) -> pl.DataFrame:
    """Per model (of the sweep, and every catalog model with an original record): the original run's GPUs x days
    beside the study's: GPUs x days of the optimal setting on `study.gpu_days_*` (8 x A100 on one node), blank where
    that setting has no optimal (the GPU-days plot adds the what-if's prediction there)."""
    gpu, nodes, gpn = study.gpu_days_gpu, study.gpu_days_nodes, study.gpu_days_gpus_per_node
    label = setting_label(gpu, nodes, gpn)
    at = {r["model"]: r for r in best.filter((pl.col("gpu") == gpu) & (pl.col("nodes") == nodes)
                                             & (pl.col("gpus_per_node") == gpn)).iter_rows(named=True)}  # fmt: skip
    ranks = model_rank(catalog, models)
    rows = []
    for model in sorted(ranks, key=ranks.__getitem__):
        spec = catalog.models.get(model) if catalog else None
        orig = (spec.original_training if spec else None) or {}
        og = orig.get("gpus", 0) * orig.get("days", 0) if orig else None
        mine = at.get(model, {})
        days = mine.get("training_days")
        ours = days * nodes * gpn if days is not None else None
        rows.append({
            "model": model, "original_gpus": orig.get("gpus"), "original_days": orig.get("days"),
            "original_gpu_days": og, "ours_setting": label, "ours_method": mine.get("method"), "ours_days": days,
            "ours_gpu_days": ours, "ours_over_original": ours / og if ours is not None and og else None,
            "original_source": orig.get("source"),
        })  # fmt: skip
    schema = {"model": pl.String, "original_gpus": pl.Int64, "original_days": pl.Float64,
              "original_gpu_days": pl.Float64, "ours_setting": pl.String, "ours_method": pl.String,
              "ours_days": pl.Float64, "ours_gpu_days": pl.Float64, "ours_over_original": pl.Float64,
              "original_source": pl.String}  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def speedups(cells: pl.DataFrame, best: pl.DataFrame, catalog: Catalog | None, families: list[str]) -> pl.DataFrame:
    """Per setting with a naive time: the speed-ups over naive of the analytic estimate (the optimal cell's: TF32 for
    fp32 recipes, as the study's) and of the study's optimal method (which one: `optimal_method`); `stand_in`: the
    setting ran on the `cpu` stand-in, where free-lunch has nothing to win; `in_mean`: a model of `families` with all
    three times (the study's inner join of its Pythia sweeps)."""
    naive = ran(cells).filter(pl.col("method") == "naive")
    naive = naive.select(*GROUP, "world_size", pl.col("training_days").alias("days_naive"))
    opt = best.select(*GROUP, "analytic_days", pl.col("training_days").alias("days_optimal"),
                      pl.col("method").alias("optimal_method"))  # fmt: skip
    out = naive.join(opt, on=GROUP, how="left").join(stand_in_settings(cells), on=GROUP, how="left").select(
        *GROUP, "world_size", "days_naive", "analytic_days", "days_optimal",
        (pl.col("days_naive") / pl.col("analytic_days")).alias("speedup_analytic"),
        pl.lit(1.0).alias("speedup_naive"),
        (pl.col("days_naive") / pl.col("days_optimal")).alias("speedup_optimal"),
        "optimal_method", pl.col("stand_in").fill_null(False),
    )  # fmt: skip
    later = ["optimal_method", "stand_in"]  # after the columns the CSV had before them
    if out.is_empty():
        return out.with_columns(pl.lit(None, dtype=pl.Boolean).alias("in_mean")).select(pl.exclude(later), *later)
    complete = pl.col("speedup_analytic").is_not_null() & pl.col("speedup_optimal").is_not_null()
    out = out.with_columns((_averaged(out, catalog, families) & complete).alias("in_mean"))
    return study_sort(out.select(pl.exclude(later), *later), catalog)


MEAN = "mean"  # the model of an averaged view's last row


def _with_mean(df: pl.DataFrame, label_col: str, cols: list[str], what: str) -> tuple[pl.DataFrame, list[str]]:
    """(the table with a last row, the mean of `cols` over the rows with `in_mean`, labelled plainly `mean`; the
    note under the Markdown table saying how many rows it averages and which, `what`). For the Markdown only: the
    CSV keeps one row per setting."""
    if df.is_empty():
        return df, []
    used = df.filter(pl.col("in_mean").fill_null(False))
    mean = {c: None for c in df.columns} | {label_col: MEAN}
    mean |= {c: used[c].drop_nulls().mean() for c in cols}
    rows = f"{used.height} row" + ("" if used.height == 1 else "s")
    note = f"{MEAN} (last row): over the {rows} marked `in mean`, {what}."
    framed = pl.concat([df.cast({label_col: pl.String}), pl.DataFrame([mean], schema=df.schema)], how="vertical")
    return framed, [note]


def _per_setting(ok: pl.DataFrame, kind: str, value: str = "step_time_s") -> pl.DataFrame:
    return (
        ok.filter(pl.col("kind") == kind)
        .group_by(GROUP)
        .agg(
            pl.col(value).min().alias("best"),
            pl.col("method").sort_by(value, "method").first().alias("best_method"),
            pl.col(value).median().alias("median"),
            pl.col(value).max().alias("worst"),
            pl.len().cast(pl.Int64).alias("methods"),
        )
    )


def memory_saving(cells: pl.DataFrame, catalog: Catalog | None, families: list[str]) -> pl.DataFrame:
    """Per setting where free-lunch only or a memory-saving method ran: (free-lunch only - best memory-saving) /
    free-lunch-only days (the study's optimal_memory_saving_speedups); null where either did not run. `in_mean`: a
    model of `families` on more than one GPU with both (the study's figure by model), `in_count_mean`: the same on
    any count (its figure by GPU count)."""
    ok = ran(cells)
    fl = _per_setting(ok, "free-lunch", "training_days").select(
        *GROUP, pl.col("best").alias("days_free_lunch"), pl.col("best_method").alias("free_lunch_method")
    )
    ms = _per_setting(ok, "memory-saving", "training_days").select(
        *GROUP, pl.col("best").alias("days_memory_saving"), pl.col("best_method").alias("memory_saving_method")
    )
    ws = ok.select(*GROUP, "world_size").unique(GROUP)
    out = (
        fl.join(ms, on=GROUP, how="full", coalesce=True)
        .join(ws, on=GROUP, how="left")
        .with_columns(((pl.col("days_free_lunch") - pl.col("days_memory_saving")) / pl.col("days_free_lunch"))
                      .alias("gain"))
        .select(*GROUP, "world_size", "free_lunch_method", "days_free_lunch", "memory_saving_method",
                "days_memory_saving", "gain")
    )  # fmt: skip
    if out.is_empty():
        return out.with_columns(pl.lit(None, dtype=pl.Boolean).alias(c) for c in ("in_mean", "in_count_mean"))
    counted = _averaged(out, catalog, families) & pl.col("gain").is_not_null()
    return study_sort(
        out.with_columns((counted & (pl.col("world_size") > 1)).alias("in_mean"), counted.alias("in_count_mean")),
        catalog,
    )


def step_time_stats(cells: pl.DataFrame, catalog: Catalog | None, families: list[str]) -> pl.DataFrame:
    """Per setting: worst / median / optimal step of its memory-saving methods and the best free-lunch-only step,
    with each one's speed-up over the worst (the study's mem_saving_methods figure); `in_mean`: a model of `families`
    on more than one GPU (the figure's filter)."""
    ok = ran(cells)
    ms = _per_setting(ok, "memory-saving")
    fl = _per_setting(ok, "free-lunch").select(*GROUP, pl.col("best").alias("free_lunch_s"))
    ws = ok.select(*GROUP, "world_size").unique(GROUP)
    out = (
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
    )  # fmt: skip
    if out.is_empty():
        return out.with_columns(pl.lit(None, dtype=pl.Boolean).alias("in_mean"))
    in_mean = _averaged(out, catalog, families) & (pl.col("world_size") > 1)
    return study_sort(out.with_columns(in_mean.alias("in_mean")), catalog)


def model_flops(catalog: Catalog | None, swept: set[str]) -> pl.DataFrame:
    """Per catalog model: FLOPs per sample (closed form), global batch, steps, total training FLOPs."""
    rows = []
    ranks = model_rank(catalog, list(catalog.models) if catalog else [])
    for name in sorted(ranks, key=ranks.__getitem__):
        spec = catalog.models[name]  # type: ignore[union-attr]
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


def study_claims(catalog: Catalog | None, best: pl.DataFrame, limit: float) -> pl.DataFrame:
    """The study's headline numbers through `flops.suspect` (the check every cell gets, at benchmark.suspect_mfu),
    beside our optimal (free-lunch) days of the same setting (`best`: `optimal`)."""
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
        ours = best.filter((pl.col("model") == claim["model"]) & (pl.col("gpu") == claim["gpu"])
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


class StudyTable(NamedTuple):
    """One study view: `csv`, every column unrounded (what the plots read); `md`, the rows its Markdown shows (the
    CSV's, and an averaged view's mean row); `notes`, the lines under the Markdown table (what the mean averages,
    what the stand-in's speed-ups mean, where the GPU-days setting is)."""

    csv: pl.DataFrame
    md: pl.DataFrame
    notes: tuple[str, ...] = ()


def build_all(
    cells: pl.DataFrame, catalog: Catalog | None, limit: float, study: StudySection | None = None
) -> dict[str, StudyTable]:
    """Every study table in memory: name -> StudyTable (`study`: the config's section, typed; None: the study's
    own definitions)."""
    study = typed(study, "tables.study.build_all")
    families = list(study.average_families)
    what = f"{', '.join(families)} models"
    settings = cells.filter(pl.col("valid")).select("model", "gpu", "nodes", "gpus_per_node", "world_size")
    naive = ran(cells).filter(pl.col("method") == "naive")
    best = optimal(cells)
    spd = speedups(cells, best, catalog, families)
    ms = memory_saving(cells, catalog, families)
    stats = step_time_stats(cells, catalog, families)
    gd = gpu_days(best, [*settings["model"].unique().to_list(), *recorded_models(catalog)], catalog, study)
    claims = study_claims(catalog, best, limit)
    on_optimal = optimal_notes(spd)
    spd_md, spd_mean = _with_mean(spd, "model", ["speedup_analytic", "speedup_naive", "speedup_optimal"],
                                  f"{what} with all three times, every GPU count")  # fmt: skip
    ms_md, ms_mean = _with_mean(ms, "model", ["gain"], f"{what} on more than one GPU (the study's figure by model)")
    stats_md, stats_mean = _with_mean(stats, "model", ["speedup_median", "speedup_optimal", "speedup_free_lunch"],
                                      f"{what} on more than one GPU")  # fmt: skip
    fl_based = ("optimal (fl-based): the fastest fl-based method that ran, the study's optimal (free-lunch, with or "
                "without checkpointing, sharding or offload; never naive), its days and which method.")  # fmt: skip
    over_worst = ("median, best, fl only: the speed-up over the worst step of the memory-saving methods (free-lunch "
                  "with checkpointing, sharding or offload) of the median one, the best one and free-lunch alone; "
                  "methods: how many memory-saving methods ran.")  # fmt: skip
    counted = "in count mean: the rows of the study's figure by GPU count (the averaged models on every count)."
    sources = sorted(set(gd["original_source"].drop_nulls().to_list()))
    where = setting_label(study.gpu_days_gpu, study.gpu_days_nodes, study.gpu_days_gpus_per_node)
    gd_notes = [f"ours: the optimal (fastest fl-based) setting on {where} (`study.gpu_days_*`), its GPUs x days.",
                *(f"original runs: {s}." for s in sources)]  # fmt: skip
    claim_notes = [f"{r['model']} on {units.layout(1, r['world_size'])} {r['gpu']}: {r['source']}."
                   for r in claims.iter_rows(named=True)]  # fmt: skip
    days_naive = days_pivot(settings, naive, "training_days", catalog)
    days_optimal = days_pivot(settings, best, "training_days", catalog)
    return {
        "days_naive": StudyTable(*days_naive),
        "days_optimal": StudyTable(*days_optimal, tuple(on_optimal)),
        "optimal_settings": StudyTable(optimal_settings(best, catalog), optimal_settings(best, catalog)),
        "gpu_days": StudyTable(gd, gd, tuple(gd_notes)),
        "speedups": StudyTable(spd, spd_md, (fl_based, *spd_mean, *on_optimal)),
        "memory_saving": StudyTable(ms, ms_md, (*ms_mean, counted)),
        "step_time_stats": StudyTable(stats, stats_md, (over_worst, *stats_mean)),
        "model_flops": StudyTable(model_flops(catalog, set(cells["model"].to_list())),
                                  model_flops(catalog, set(cells["model"].to_list()))),
        "study_claims": StudyTable(claims, claims, tuple(claim_notes)),
    }  # fmt: skip


def intro(name: str, study: StudySection | None = None) -> str:
    """A table's paragraph, with the settings of the `study` section it depends on filled in."""
    study = typed(study, "tables.study.intro")
    gpus = study.gpu_days_nodes * study.gpu_days_gpus_per_node
    return INTROS[name].format(
        gpus=gpus, families=", ".join(study.average_families),
        setting=f"{study.gpu_days_nodes} node x {study.gpu_days_gpus_per_node} {study.gpu_days_gpu}",
    )  # fmt: skip


def markdown_body(name: str, table: StudyTable, max_rows: int = MD_ROWS) -> str:
    """Study table `name` as Markdown, as the main tables are written (tables/aggregate.markdown_body): a pivot as
    it is (a setting per column), the others through their view (tables/views.py `study_*`: the reader's columns,
    with units); then the view's footnotes and the table's notes."""
    if name in PIVOTS:
        body = to_markdown(table.md, max_rows=max_rows, keys=1)
        marks: list[str] = []
    else:
        view = name if name.startswith("study_") else f"study_{name}"
        keys = 3 if views.VIEWS[view][:3] == views.STUDY_KEY else 1
        body = to_markdown(views.view(view, table.md), max_rows=max_rows, keys=keys)
        marks = views.footnotes(view, table.md)
    notes = [
        *(textwrap.fill(n, WIDTH) for n in marks),
        *(textwrap.fill(n, WIDTH, initial_indent="- ", subsequent_indent="  ") for n in table.notes),
    ]
    return body + ("\n" + "\n".join(notes) + "\n" if notes else "")


def sweep_line(cells: pl.DataFrame) -> str:
    """One sentence on the sweep the study's views show, from its cells: how many settings (and how many of them on
    the `cpu` stand-in) and the methods of each of the study's sets that ran (report.md, after the views' caption,
    which describes no sweep)."""
    settings = cells.filter(pl.col("valid")).select(GROUP).unique().height
    ok = ran(cells)
    stand = ok.filter(on_stand_in(ok)).select(GROUP).unique().height
    kinds = {k: sorted(ok.filter(pl.col("kind") == k)["method"].unique().to_list())
             for k in ("naive", "free-lunch", "memory-saving")}  # fmt: skip
    labels = {"naive": "naive", "free-lunch": "free-lunch only", "memory-saving": "memory-saving"}
    said = "; ".join(f"{label}: {', '.join(f'`{m}`' for m in kinds[k]) or 'none'}" for k, label in labels.items())
    where = f", {stand} of them on the `cpu` stand-in" if stand else ""
    empty = " (so the memory-saving views have no rows)" if not kinds["memory-saving"] else ""
    return f"This sweep: {settings} settings{where}; the methods that ran, {said}{empty}."


TITLES = {
    "days_naive": "Days to train: naive",
    "days_optimal": "Days to train: the study's optimal (fastest fl-based)",
    "optimal_settings": "The study's optimal settings",
    "gpu_days": "GPU-days: the original run vs ours",
    "speedups": "Speed-ups over naive",
    "memory_saving": "Memory-saving gain over free-lunch",
    "step_time_stats": "Step times of the memory-saving methods",
    "model_flops": "Training FLOPs per model",
    "study_claims": "The study's headline numbers",
}


def build_study_tables(
    cells_parquet: str,
    out: dict[str, str],
    log_path: str,
    catalog: Catalog | None,
    suspect_mfu: float,
    study: StudySection | None = None,
) -> dict[str, StudyTable]:
    """The `study_tables` rule: every study table to CSV + Markdown (the intro, then the table and its notes);
    `study`: the config's section as the facade typed it (`Pipeline.study`: the rule's params hold its JSON), its
    GPU type checked against the catalog again (None: the study's own definitions)."""
    t0 = time.perf_counter()
    study = typed(study, "tables.study.build_study_tables").in_catalog(catalog)
    tables = build_all(pl.read_parquet(cells_parquet), catalog, suspect_mfu, study)
    for name, table in tables.items():
        Path(out[f"{name}_csv"]).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out[f"{name}_csv"], table.csv.write_csv())
        text = textwrap.fill(f"{intro(name, study)} Every column, unrounded: {name}.csv beside this file.", WIDTH)
        atomic_write_text(out[f"{name}_md"], f"# {TITLES[name]}\n\n{text}\n\n{markdown_body(name, table)}")
    sizes = {n: t.csv.height for n, t in tables.items()}
    atomic_write_text(log_path, f"study tables {sizes} ({time.perf_counter() - t0:.2f} s)\n")
    return tables
