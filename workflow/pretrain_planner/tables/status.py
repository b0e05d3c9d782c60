"""Where a sweep stands, from the files alone (no scheduler contact, no torch).

A valid cell of plan.csv is, by what its folder holds:
- ok / noisy / oom / unsupported: result.json says so; `corrupt` if result.json cannot be used;
- otherwise what its state record (launch.state, `state.json`, written by the driver) says: `failed` (with
  the error), `submitted` (handed to its launcher: waiting for devices, queued), `running` (rank 0 reports
  progress; its latest progress line is shown), or `failed` when the record says done but result.json is gone;
- without a state record (results of an older version): `running` if a job record (slurm_job.json,
  local_job.json) or a submitit/ folder is there, else `pruned` when the adaptive search decided the cell
  cannot be its setting's fastest (its reason), else `pending`.
GPU-hours spent are the results' wall_time_s x world_size; GPU-hours left at most are plan.csv's
gpu_hours_max of the cells without a result. `watch_frame` and `watch` are `status --watch`.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import polars as pl

from pretrain_planner import layout
from pretrain_planner.launch import progress
from pretrain_planner.launch.rankjob import LOCAL_RECORD, SLURM_RECORD
from pretrain_planner.launch.state import driver_gone, read_state
from pretrain_planner.results import gpu_hours, parse_result
from pretrain_planner.search import latest_rounds
from pretrain_planner.tables.aggregate import read_plan

RESULT_STATES = ("ok", "noisy", "oom", "unsupported")
STATES = (*RESULT_STATES, "corrupt", "failed", "submitted", "running", "pending", "pruned")
LIVE_STATES = ("submitted", "running", "pending")  # a sweep with none of these has nothing left to do
NO_RESULT = "the job finished but wrote no result.json"


class CellState(NamedTuple):
    state: str
    result: dict[str, Any] | None  # the parsed result.json row
    detail: str | None  # why (failed, oom, unsupported, pruned) or where it is (submitted, running)
    job_id: str | None = None
    progress: str | None = None  # rank 0's latest progress line (a live cell)
    waiting: str | None = None  # what a submitted cell waits for before its job is queued (a queue slot)


def _live_detail(record: dict[str, Any], last: dict[str, Any] | None) -> str:
    job = f"job {record['job_id']}" if record.get("job_id") else "no job id yet"
    since = record.get("running_at") if record["state"] == "running" else record.get("submitted_at")
    parts = [f"{job} ({record.get('launcher')}), attempt {record.get('attempt')}, since {since}"]
    if record["state"] == "submitted" and record.get("waiting"):
        parts.insert(0, f"waiting for {record['waiting']}")
    if last is not None:
        parts.append(progress.describe(last))
    if driver_gone(record):
        d = record.get("driver") or {}
        parts.append(f"its driver (pid {d.get('pid')}) has ended: the next run of the sweep takes the cell up again")
    elif record.get("note"):
        parts.append(record["note"])
    return "; ".join(parts)


def cell_state(cell_dir: Path) -> CellState:
    """The cell's state, its result row and the detail, from its folder (see the module docstring)."""
    result = cell_dir / layout.RESULT
    if result.is_file():
        row, problem = parse_result(result)
        if row is None:
            return CellState("corrupt", None, problem)
        return CellState(row["status"], row, row.get("reason"))
    record = read_state(cell_dir)
    if record is not None:
        state = record["state"]
        if state == "done":
            return CellState("failed", None, NO_RESULT, record.get("job_id"))
        if state == "failed":
            return CellState("failed", None, record.get("error") or "failed", record.get("job_id"))
        last = progress.last_line(cell_dir / progress.PROGRESS_FILE)
        what = progress.describe(last) if last else None
        waiting = record.get("waiting") if state == "submitted" else None
        return CellState(state, None, _live_detail(record, last), record.get("job_id"), what, waiting)
    records = (cell_dir / SLURM_RECORD, cell_dir / LOCAL_RECORD)
    if any(r.is_file() for r in records) or (cell_dir / layout.SUBMITIT).is_dir():
        return CellState("running", None, None)
    return CellState("pending", None, None)


def sweep_status(results_dir: str | Path, plan: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per GPU type summary, per cell states) for the valid cells of `plan`."""
    results_dir = Path(results_dir)
    valid = plan.filter(pl.col("valid"))
    has_max = "gpu_hours_max" in plan.columns
    rounds = latest_rounds(results_dir)
    rows = []
    for r in valid.iter_rows(named=True):
        path = r.get("path") or layout.cell_path(r["model"], r["gpu"], r["nodes"], r["gpus_per_node"], r["method"])
        state, result, detail, job_id, last, waiting = cell_state(results_dir / path)
        folder = layout.setting_folder(r["model"], r["gpu"], r["nodes"], r["gpus_per_node"])
        if state == "pending" and r["method"] in rounds.get(folder, {}).get("pruned", {}):
            state, detail = "pruned", rounds[folder]["pruned"][r["method"]]
        world = r["nodes"] * r["gpus_per_node"]
        spent = None
        if result is not None and result.get("wall_time_s") is not None:
            spent = gpu_hours(result["wall_time_s"], result.get("world_size") or world)
        rows.append({
            "gpu": r["gpu"], "path": path, "state": state, "detail": detail, "gpu_hours_spent": spent,
            "gpu_hours_max": r["gpu_hours_max"] if has_max else None, "job_id": job_id, "progress": last,
            "waiting": waiting,
        })  # fmt: skip
    schema = {"gpu": pl.String, "path": pl.String, "state": pl.String, "detail": pl.String,
              "gpu_hours_spent": pl.Float64, "gpu_hours_max": pl.Float64, "job_id": pl.String,
              "progress": pl.String, "waiting": pl.String}  # fmt: skip
    cells = pl.DataFrame(rows, schema=schema)
    unfinished = pl.col("state").is_in(["failed", "submitted", "running", "pending", "corrupt"])
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


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Aligned columns (the first left, the others right), a rule under the header and above the last row."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = []
    for i, row in enumerate(table):
        cells = zip(row, widths, strict=True)
        lines.append("  ".join(v.ljust(w) if j == 0 else v.rjust(w) for j, (v, w) in enumerate(cells)))
        if i == 0 or i == len(table) - 2:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _waiting_lines(cells: pl.DataFrame) -> list[str]:
    """How many submitted cells wait for a queue slot (the site's cap of queued jobs: launch/slots.py)."""
    if "waiting" not in cells.columns:
        return []
    n = cells.filter(pl.col("waiting").is_not_null()).height
    if not n:
        return []
    return [
        f"{n} submitted cell(s) wait for a queue slot: the site caps the jobs you may have queued "
        "(max_queued_jobs, or the scheduler's submit limit); each is submitted when one of yours ends"
    ]


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

    lines = [f"sweep status of {results_dir} (plan: {plan_source})"]
    lines += _table(cols, [[fmt(r[c]) for c in cols] for r in rows])
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
    lines += _waiting_lines(cells)
    problems = cells.filter(pl.col("state").is_in(["failed", "corrupt"]))
    if problems.height:
        lines.append("")
        lines.append("failed or corrupt cells:")
        lines += [f"  {r['path']}: {r['state']}: {r['detail']}" for r in problems.iter_rows(named=True)]
    return "\n".join(lines)


def load_plan(results_dir: str | Path) -> pl.DataFrame | None:
    path = Path(results_dir) / layout.PLAN
    return read_plan(path) if path.is_file() else None


# ------------------------------------------------------------------------------------------- status --watch

LIST_MAX = 12  # live or failed cells listed under the table


def live(cells: pl.DataFrame) -> bool:
    """Whether anything is still to happen: a cell submitted, running or pending."""
    return bool(cells.filter(pl.col("state").is_in(LIVE_STATES)).height)


def _hours(v: float | None) -> str:
    return "?" if v is None else f"{v:.2f}"


def watch_frame(cells: pl.DataFrame, results_dir: str, plan_source: str, every: float, driver_note: str,
                stamp: str | None = None) -> str:  # fmt: skip
    """One frame of `status --watch`: per GPU type the cells done / running / submitted / pending / failed /
    pruned and the GPU-hours spent against the plan's bound, then the live cells with their latest progress and
    the failed ones with their reason."""
    stamp = stamp or dt.datetime.now().isoformat(sep=" ", timespec="seconds")
    lines = [f"sweep status of {results_dir} at {stamp} (plan: {plan_source}); every {every:g} s, Ctrl-C to leave",
             driver_note]  # fmt: skip
    groups = {
        "done": pl.col("state").is_in(RESULT_STATES),
        **{s: pl.col("state") == s for s in ("running", "submitted", "pending")},
        "failed": pl.col("state").is_in(["failed", "corrupt"]),
        "pruned": pl.col("state") == "pruned",
    }
    per_gpu = (
        cells.group_by("gpu")
        .agg(
            pl.len().alias("cells"),
            *[c.sum().alias(k) for k, c in groups.items()],
            pl.col("gpu_hours_spent").sum().alias("spent"),
            pl.col("gpu_hours_max").sum().alias("bound"),
        )
        .sort("gpu")
    )
    sums = {k: per_gpu[k].sum() for k in ("cells", *groups, "spent", "bound")}
    if cells["gpu_hours_max"].null_count() == cells.height:  # a plan.csv without the bound
        per_gpu, sums["bound"] = per_gpu.with_columns(pl.lit(None, pl.Float64).alias("bound")), None
    rows = [
        [r["gpu"], *(str(r[k]) for k in ("cells", *groups)), f"{_hours(r['spent'])} / {_hours(r['bound'])}"]
        for r in [*per_gpu.iter_rows(named=True), {"gpu": "total", **sums}]
    ]
    lines += _table(["gpu", "cells", *groups, "GPU-hours spent / bound"], rows)
    done = cells.filter(pl.col("state").is_in(RESULT_STATES))
    if done.height:
        counts = dict(done.group_by("state").len().iter_rows())
        lines.append("done: " + ", ".join(f"{counts[s]} {s}" for s in RESULT_STATES if counts.get(s)))
    for title, states in (("running / submitted", ["running", "submitted"]), ("failed", ["failed", "corrupt"])):
        some = cells.filter(pl.col("state").is_in(states)).sort("state", "path")
        if not some.height:
            continue
        lines += ["", f"{title}:"]
        for r in some.head(LIST_MAX).iter_rows(named=True):
            lines.append(f"  {r['path'].removeprefix(layout.CELLS + '/')}: {r['state']}: {r['detail'] or ''}"[:220])
        if some.height > LIST_MAX:
            lines.append(f"  ... and {some.height - LIST_MAX} more")
    lines += _waiting_lines(cells)
    if not live(cells):
        lines += ["", "nothing is running or waiting: the sweep has done what it can"]
    return "\n".join(lines)


CLEAR = "\033[H\033[2J"  # ANSI: cursor home, clear the screen


def watch(render: Callable[[], tuple[str, bool]], every: float, out: TextIO | None = None,
          max_frames: int | None = None) -> int:  # fmt: skip
    """Show `render()`'s frame every `every` seconds (the screen cleared first on a terminal, else frames one
    after another) until it says nothing is live, Ctrl-C, or `max_frames`."""
    out = out or sys.stdout
    tty = out.isatty()
    frames = 0
    try:
        while True:
            text, still = render()
            out.write((CLEAR if tty else ("\n" if frames else "")) + text + "\n")
            out.flush()
            frames += 1
            if not still or (max_frames is not None and frames >= max_frames):
                return 0
            time.sleep(every)
    except KeyboardInterrupt:
        out.write("\n")
        return 0
