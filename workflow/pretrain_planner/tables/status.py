"""Where a sweep stands, from the files alone (no scheduler contact, no torch).

A valid cell of plan.csv is, by what its folder holds:
- ok / oom / unsupported: result.json says so; `corrupt` if result.json cannot be used;
- failed: no result.json and cell.log says the job did not complete (launch.run_cell logs
  "job ... did not complete", or "... done" / "finished in-process" without a result);
- running: no result.json but a slurm_job.json or a submitit/ folder (submitted, not finished);
- pruned: no result, and the adaptive search decided it cannot be the setting's fastest (its reason);
- pending: nothing yet.
GPU-hours spent are the results' wall_time_s x world_size; GPU-hours left at most are plan.csv's
gpu_hours_max of the cells without a result.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl

from pretrain_planner.launch.rankjob import SLURM_RECORD as JOB_RECORD
from pretrain_planner.results import parse_result
from pretrain_planner.search import latest_rounds
from pretrain_planner.tables.aggregate import read_plan

STATES = ("ok", "noisy", "oom", "unsupported", "corrupt", "failed", "running", "pending", "pruned")
_DONE_WITHOUT_RESULT = re.compile(r"\] (job \S+ done: status=|finished in-process)")


def _log_says_failed(log: Path) -> str | None:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if "did not complete" in line:
            return line.split("] ", 1)[-1][:300]
    if _DONE_WITHOUT_RESULT.search(text):
        return "the job finished but wrote no result.json"
    return None


def cell_state(cell_dir: Path) -> tuple[str, dict[str, Any] | None, str | None]:
    """(state, result row or None, detail)."""
    result = cell_dir / "result.json"
    if result.is_file():
        row, problem = parse_result(result)
        if row is None:
            return "corrupt", None, problem
        return row["status"], row, row.get("reason")
    failed = _log_says_failed(cell_dir / "cell.log")
    if failed:
        return "failed", None, failed
    if (cell_dir / JOB_RECORD).is_file() or (cell_dir / "submitit").is_dir():
        return "running", None, None
    return "pending", None, None


def sweep_status(results_dir: str | Path, plan: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per GPU type summary, per cell states) for the valid cells of `plan`."""
    results_dir = Path(results_dir)
    valid = plan.filter(pl.col("valid"))
    has_max = "gpu_hours_max" in plan.columns
    rounds = latest_rounds(results_dir)
    rows = []
    for r in valid.iter_rows(named=True):
        path = r.get("path") or f"cells/{r['model']}/{r['gpu']}/{r['nodes']}x{r['gpus_per_node']}/{r['method']}"
        state, result, detail = cell_state(results_dir / path)
        folder = f"{r['model']}/{r['gpu']}/{r['nodes']}x{r['gpus_per_node']}"
        if state == "pending" and r["method"] in rounds.get(folder, {}).get("pruned", {}):
            state, detail = "pruned", rounds[folder]["pruned"][r["method"]]
        world = r["nodes"] * r["gpus_per_node"]
        spent = None
        if result is not None and result.get("wall_time_s") is not None:
            spent = result["wall_time_s"] * (result.get("world_size") or world) / 3600
        rows.append({
            "gpu": r["gpu"], "path": path, "state": state, "detail": detail, "gpu_hours_spent": spent,
            "gpu_hours_max": r["gpu_hours_max"] if has_max else None,
        })  # fmt: skip
    schema = {"gpu": pl.String, "path": pl.String, "state": pl.String, "detail": pl.String,
              "gpu_hours_spent": pl.Float64, "gpu_hours_max": pl.Float64}  # fmt: skip
    cells = pl.DataFrame(rows, schema=schema)
    unfinished = pl.col("state").is_in(["failed", "running", "pending", "corrupt"])
    summary = (
        cells.group_by("gpu")
        .agg(
            pl.len().cast(pl.Int64).alias("cells"),
            *[(pl.col("state") == s).sum().cast(pl.Int64).alias(s) for s in STATES],
            pl.col("gpu_hours_spent").sum().alias("gpu_hours_spent"),
            (pl.col("gpu_hours_max").filter(unfinished).sum() if has_max else pl.lit(None, pl.Float64)).alias(
                "gpu_hours_left_max"
            ),
        )
        .sort("gpu")
    )
    invalid = plan.group_by("gpu").agg((~pl.col("valid")).sum().cast(pl.Int64).alias("invalid"))
    summary = (
        invalid.join(summary, on="gpu", how="left")
        .with_columns(pl.col(c).fill_null(0) for c in ["cells", *STATES])
        .with_columns(pl.col("gpu_hours_spent").fill_null(0.0))
        .with_columns(pl.col("gpu_hours_left_max").fill_null(0.0) if has_max else pl.col("gpu_hours_left_max"))
        .select("gpu", "cells", *STATES, "invalid", "gpu_hours_spent", "gpu_hours_left_max")
        .sort("gpu")
    )
    return summary, cells


def format_status(summary: pl.DataFrame, cells: pl.DataFrame, results_dir: str, plan_source: str) -> str:
    cols = ["gpu", "cells", *STATES, "invalid", "gpu_hours_spent", "gpu_hours_left_max"]
    total: dict[str, Any] = {"gpu": "total"}
    for c in cols[1:]:
        vals = [v for v in summary[c].to_list() if v is not None]
        total[c] = sum(vals) if vals or c not in ("gpu_hours_left_max",) else None
    rows = [*summary.select(cols).iter_rows(named=True), total]

    def fmt(v: Any) -> str:
        if v is None:
            return "?"
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    table = [cols] + [[fmt(r[c]) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = [f"sweep status of {results_dir} (plan: {plan_source})"]
    for i, row in enumerate(table):
        lines.append(
            "  ".join(v.ljust(w) if j == 0 else v.rjust(w) for j, (v, w) in enumerate(zip(row, widths, strict=True)))
        )
        if i == 0 or i == len(table) - 2:
            lines.append("  ".join("-" * w for w in widths))
    if "gpu_hours_max" not in cells.columns or cells["gpu_hours_max"].null_count() == cells.height and cells.height:
        lines.append("(GPU-hours left unknown: this plan.csv has no gpu_hours_max column; re-plan with snakemake -n)")
    pruned = cells.filter(pl.col("state") == "pruned")
    if pruned.height or (cells.height and Path(results_dir, "search").is_dir()):
        spent = cells["gpu_hours_spent"].sum() or 0.0
        bound = cells["gpu_hours_max"].sum() if "gpu_hours_max" in cells.columns else None
        lines.append(
            f"adaptive search: {pruned.height} of {cells.height} cells pruned (cannot be their setting's fastest; "
            f"reasons in {results_dir}/search/); benchmark GPU-hours spent {spent:.2f}"
            + (f" of an exhaustive upper bound of {bound:.2f}" if bound else "")
        )
    problems = cells.filter(pl.col("state").is_in(["failed", "corrupt"]))
    if problems.height:
        lines.append("")
        lines.append("failed or corrupt cells:")
        lines += [f"  {r['path']}: {r['state']}: {r['detail']}" for r in problems.iter_rows(named=True)]
    return "\n".join(lines)


def load_plan(results_dir: str | Path) -> pl.DataFrame | None:
    path = Path(results_dir) / "plan.csv"
    return read_plan(path) if path.is_file() else None
