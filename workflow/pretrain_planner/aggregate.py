"""Results -> tables (polars): every cell, and the fastest feasible method per model x GPU x count.

Reads each result.json into one explicit schema (results.RESULT_FIELDS), so a key that only late
files have is never dropped and types never drift. Imports no torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from .results import RESULT_FIELDS, atomic_write_text, read_result

_PL_TYPES = {"str": pl.String, "int": pl.Int64, "float": pl.Float64, "bool": pl.Boolean, "json": pl.String}
RESULT_SCHEMA = {name: _PL_TYPES[kind] for name, kind in RESULT_FIELDS.items()}
GROUP = ["model", "gpu", "nodes", "gpus_per_node"]

TIME_TO_TRAIN_COLUMNS = [
    "model", "gpu", "nodes", "gpus_per_node", "world_size", "best_method", "micro_batch_size",
    "grad_accum_steps", "step_time_s", "step_time_p10_s", "step_time_p90_s", "tokens_per_s", "samples_per_s",
    "mfu", "peak_mem_gib", "training_days", "days_naive", "days_fl", "speedup_vs_naive", "speedup_vs_fl",
    "methods_ok", "methods_oom", "methods_unsupported", "methods_suspect",
]  # fmt: skip


def table_files(folder: str) -> dict[str, str]:
    return {
        "cells_parquet": f"{folder}/cells.parquet",
        "cells_csv": f"{folder}/cells.csv",
        "time_to_train_csv": f"{folder}/time_to_train.csv",
        "time_to_train_md": f"{folder}/time_to_train.md",
    }


def _row(path: str) -> dict[str, Any]:
    row = read_result(path)
    for name, kind in RESULT_FIELDS.items():
        if kind == "json" and row[name] is not None:
            row[name] = json.dumps(row[name], sort_keys=True)
    return row


def read_results(paths: list[str]) -> pl.DataFrame:
    return pl.DataFrame([_row(p) for p in paths], schema=RESULT_SCHEMA)


def cells_table(plan_csv: str, result_paths: list[str]) -> pl.DataFrame:
    """The plan joined with the results: invalid cells keep their reason, status `invalid`."""
    plan = pl.read_csv(
        plan_csv,
        schema_overrides={"reason": pl.String, "valid": pl.Boolean, "per_rank_batch": pl.Float64},
    )
    results = read_results(result_paths).drop("world_size")
    keys = [*GROUP, "method"]
    cells = plan.join(results, on=keys, how="left", suffix="_result")
    return cells.with_columns(
        pl.when(~pl.col("valid"))
        .then(pl.lit("invalid"))
        .otherwise(pl.col("status").fill_null("missing"))
        .alias("status"),
        pl.coalesce(pl.col("reason_result"), pl.when(pl.col("reason") != "").then(pl.col("reason"))).alias("reason"),
    ).drop("reason_result")


def time_to_train(cells: pl.DataFrame) -> pl.DataFrame:
    """Per model x GPU x count: the fastest method that ran (ok, not suspect) beside naive and fl alone."""
    ok = cells.filter((pl.col("status") == "ok") & ~pl.col("suspect").fill_null(False))
    best = ok.sort("step_time_s").group_by(GROUP, maintain_order=True).first()

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
        )
    )
    table = (
        best.rename({"method": "best_method"})
        .join(days_of("naive"), on=GROUP, how="left")
        .join(days_of("fl"), on=GROUP, how="left")
        .join(counts, on=GROUP, how="left")
        .with_columns(
            (pl.col("days_naive") / pl.col("training_days")).alias("speedup_vs_naive"),
            (pl.col("days_fl") / pl.col("training_days")).alias("speedup_vs_fl"),
        )
    )
    return table.select(TIME_TO_TRAIN_COLUMNS).sort(GROUP)


def to_markdown(df: pl.DataFrame, float_digits: int = 4) -> str:
    """A GitHub-flavoured Markdown table (polars' own formatter, all rows and columns)."""
    rounded = df.with_columns(pl.col(pl.Float64).round_sig_figs(float_digits))
    with pl.Config(
        tbl_formatting="MARKDOWN",
        tbl_hide_column_data_types=True,
        tbl_hide_dataframe_shape=True,
        tbl_rows=-1,
        tbl_cols=-1,
        tbl_width_chars=10_000,
        fmt_str_lengths=200,
    ):
        return str(rounded) + "\n"


def build_tables(plan_csv: str, result_paths: list[str], out: dict[str, str], log_path: str) -> None:
    cells = cells_table(plan_csv, list(result_paths))
    ttt = time_to_train(cells)
    for key in out:
        Path(out[key]).parent.mkdir(parents=True, exist_ok=True)
    cells.write_parquet(out["cells_parquet"])
    atomic_write_text(out["cells_csv"], cells.drop("method_settings", "micro_batch_trials", "versions").write_csv())
    atomic_write_text(out["time_to_train_csv"], ttt.write_csv())
    atomic_write_text(
        out["time_to_train_md"],
        "# Time to train\n\nFastest method that ran per model x GPU type x count (suspect timings excluded).\n\n"
        + to_markdown(ttt),
    )
    by_status = cells.group_by("status").len().sort("status").rows()
    atomic_write_text(log_path, f"{cells.height} cells: {dict(by_status)}; {ttt.height} time-to-train rows\n")
