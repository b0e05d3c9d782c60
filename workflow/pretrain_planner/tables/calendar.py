"""tables/calendar.{csv,md} and the answers of `pretrain-planner when` / `fit --by` (issue 38): if a training is
submitted now, when does it finish, and which setting finishes first?

Per setting (time_to_train's rows: model x GPU type x nodes x GPUs per node, its fastest method), from
- the compute: the recipe's training days measured (time_to_train), or predicted (the what-if, for `when` on a
  setting not run), or a train stage's own budget (`train.time_budget_hours`, or `train.steps` x the measured
  step);
- a restart: the setting's start-up measured by its cell (result.json `startup`: process start to rank up, model
  build, method wrapping, data, compile), else the median of the sweep's cells (said so); the checkpoint's bytes
  from the memory model's state (planning/calendar.checkpoint_bytes) at the site's `checkpoint_gb_s`, else the
  rate measured on the results folder (a write made durable), read back at that rate too;
- the site: each job asks `time_limit_min` and is warned `signal_delay_s` before it (the train stage's jobs do),
  so the training is cut into segments (planning/calendar.segments);
- the queue: on a SLURM site the wait the scheduler expects for exactly that request (`sbatch --test-only`,
  planning/queue.py, nothing submitted), and for each requeued job `requeue_wait_h` or the same wait again;
  "wait unknown" where the scheduler gives no estimate, and the finish is then unknown too, never a date that
  left the wait out. Local processes: compute + one start-up, no queue, said as such.

The setting that finishes first is marked per model and run; where it is not the one with the fewest compute days,
the note says why (its queue wait, its restarts). Imports no torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from pretrain_planner.planning import methods
from pretrain_planner.planning.calendar import (
    Calendar,
    Wait,
    checkpoint_bytes,
    disk_write_rate,
    requeue_hold_s,
    training_calendar,
)
from pretrain_planner.planning.catalog import Catalog
from pretrain_planner.planning.configtypes import SiteFile, TrainSection, require
from pretrain_planner.planning.flops import param_count
from pretrain_planner.planning.queue import Asker, ask_start, cred_expire, run_sbatch
from pretrain_planner.planning.site import gpu_settings
from pretrain_planner.results import atomic_write_text
from pretrain_planner.schema import ConfigError
from pretrain_planner.tables import units, views
from pretrain_planner.tables.markdown import to_markdown

COLUMNS = [
    "model", "gpu", "nodes", "gpus_per_node", "method", "run", "compute_days", "compute_basis", "segments",
    "job_limit_h", "restart_s", "restart_basis", "checkpoint_gib", "checkpoint_s", "restart_loss_h", "first_wait_h",
    "wait_basis", "requeue_wait_h", "calendar_days", "expected_start", "expected_finish", "finishes_first", "note",
]  # fmt: skip
SCHEMA = {c: pl.String for c in COLUMNS} | {
    "nodes": pl.Int64, "gpus_per_node": pl.Int64, "compute_days": pl.Float64, "segments": pl.Int64,
    "job_limit_h": pl.Float64, "restart_s": pl.Float64, "checkpoint_gib": pl.Float64, "checkpoint_s": pl.Float64,
    "restart_loss_h": pl.Float64, "first_wait_h": pl.Float64, "requeue_wait_h": pl.Float64,
    "calendar_days": pl.Float64, "finishes_first": pl.Boolean,
}  # fmt: skip
RECIPE, TRAIN_STAGE = "recipe", "train stage"


def table_files(folder: str) -> dict[str, str]:
    return {"calendar_csv": f"{folder}/calendar.csv", "calendar_md": f"{folder}/calendar.md"}


@dataclass(frozen=True)
class Setting:
    """One training to put on the calendar: where it runs, how many compute hours, and what says so."""

    model: str
    gpu: str
    nodes: int
    gpus_per_node: int
    method: str
    compute_h: float
    compute_basis: str
    run: str = RECIPE
    startup_s: float | None = None
    startup_basis: str = "not measured"


@dataclass(frozen=True)
class Site:
    """How jobs run: `site` (planning/site.py's, narrowed and resolved) under SLURM, None for local processes;
    the checkpoint rate measured on the results folder and how (a GPU type's `checkpoint_gb_s` in the site file
    overrides it); the scheduler to ask (None: not asked); the clock."""

    site: SiteFile | None
    measured_gb_s: float | None
    measured_how: str
    ask: Asker | None = None
    now: datetime | None = None
    hold: list = field(default_factory=list)  # (seconds, how) of SLURM's requeue hold, asked once

    def requeue_hold(self) -> tuple[float | None, str]:
        """SLURM's hold of a requeued job: cred_expire asked of the controller (once) where the scheduler is asked,
        else SLURM's default."""
        if not self.hold:
            if self.ask is None:
                self.hold.append((None, ""))
            else:
                expire, how = cred_expire(self.ask)
                self.hold.append((requeue_hold_s(expire), how) if expire is not None else (None, ""))
        return self.hold[0]

    def checkpoint_rate(self, gpu: str) -> tuple[float | None, str]:
        """(GB/s, how) a checkpoint of a job on `gpu` is written and read at."""
        given = self.site.gpus.get(gpu, {}).get("checkpoint_gb_s") if self.site else None
        if given and self.site:
            return float(given), f"{self.site.path}: gpus.{gpu}.checkpoint_gb_s"
        return self.measured_gb_s, self.measured_how


def startup_of(cells: pl.DataFrame) -> tuple[dict[tuple, float], float | None]:
    """(each measured cell's start-up seconds by (model, gpu, nodes, gpus_per_node, method), their median)."""
    if "startup_s" not in cells.columns:
        return {}, None
    ran = cells.filter(pl.col("startup_s").is_not_null())
    keyed = {
        (r["model"], r["gpu"], r["nodes"], r["gpus_per_node"], r["method"]): float(r["startup_s"])
        for r in ran.iter_rows(named=True)
    }
    return keyed, (statistics.median(keyed.values()) if keyed else None)


def settings_of(ttt: pl.DataFrame, cells: pl.DataFrame, train: TrainSection | None = None) -> list[Setting]:
    """The settings of time_to_train (their recipe's training days, measured), and with a `train` section that
    sets a budget, each one's train-stage run of that budget too."""
    if train is not None:
        require(train, TrainSection, "tables.calendar.settings_of")
    keyed, median = startup_of(cells)
    out = []
    for r in ttt.iter_rows(named=True):
        key = (r["model"], r["gpu"], r["nodes"], r["gpus_per_node"], r["best_method"])
        start, basis = keyed.get(key), "measured (the cell's result.json startup)"
        if start is None and median is not None:
            start, basis = median, "not measured for this cell: the median of the sweep's cells"
        common = dict(model=r["model"], gpu=r["gpu"], nodes=int(r["nodes"]), gpus_per_node=int(r["gpus_per_node"]),
                      method=r["best_method"], startup_s=start, startup_basis=basis if start is not None else
                      "not measured (results older than the start-up record)")  # fmt: skip
        if r.get("training_days") is not None:
            out.append(Setting(compute_h=r["training_days"] * 24, compute_basis="measured (time_to_train)", **common))
        hours = train_hours(train, r.get("step_time_s"))
        if hours is not None:
            out.append(Setting(compute_h=hours[0], compute_basis=hours[1], run=TRAIN_STAGE, **common))
    return out


def train_hours(train: TrainSection | None, step_time_s: float | None) -> tuple[float, str] | None:
    """(hours, how) of the train stage's budget: `time_budget_hours`, or `steps` x the measured step time."""
    if train is None:
        return None
    if train.time_budget_hours:
        return float(train.time_budget_hours), "the config's train.time_budget_hours (training time)"
    if train.steps and step_time_s:
        hours = train.steps * step_time_s / 3600
        return hours, f"the config's train.steps x the measured step ({step_time_s:.3g} s)"
    return None


def price(s: Setting, catalog: Catalog, where: Site) -> dict[str, Any]:
    """One calendar row of `s` (COLUMNS)."""
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(model=s.model, gpu=s.gpu, nodes=s.nodes, gpus_per_node=s.gpus_per_node, method=s.method, run=s.run,
               compute_days=s.compute_h / 24, compute_basis=s.compute_basis, restart_basis=s.startup_basis)  # fmt: skip
    params = param_count(catalog.model(s.model).to_dict())
    zero = methods.parse(s.method).sharding in methods.ZERO_STAGE if s.method else False
    nbytes = checkpoint_bytes(params, zero) if params else None
    rate, rate_how = where.checkpoint_rate(s.gpu)
    write_s = nbytes / (rate * 1e9) if nbytes and rate else None
    row.update(checkpoint_gib=nbytes / 2**30 if nbytes else None, checkpoint_s=write_s)
    at = f"{rate:.3g} GB/s" if rate else "an unknown rate"
    row["restart_basis"] = f"start-up {s.startup_basis}; checkpoint written and read at {at} ({rate_how})"
    settings = gpu_settings(where.site, s.gpu) if where.site else None
    if settings is not None:  # the driver's poll bounds how soon it resubmits where the site refuses requeue
        settings["poll_s"] = where.site.poll_max_s
    notes = []
    if s.startup_s is None or write_s is None:
        why = "no start-up measured" if s.startup_s is None else "no parameter count for this family"
        if s.startup_s is not None and nbytes:
            why = f"the checkpoint rate is unknown ({rate_how}; the site file's checkpoint_gb_s gives it)"
        row["note"] = f"restart not priced: {why}; the calendar is unknown"
        return row
    first = Wait(0.0, "local processes: no queue")
    if settings is not None:
        first = Wait(None, "the scheduler was not asked")
        if where.ask is not None:
            name = f"pp-train-{s.model}-{s.gpu}-{units.layout(s.nodes, s.gpus_per_node)}"  # the train stage's job
            first, _ = ask_start(settings, s.nodes, s.gpus_per_node, name, where.ask, where.now)
    try:
        hold = where.requeue_hold() if settings is not None else (None, "")
        cal = training_calendar(s.compute_h, settings, s.startup_s, write_s, write_s, first, *hold)
    except ConfigError as exc:
        row["note"] = str(exc)
        return row
    seg = cal.segments
    row.update(segments=seg.count, job_limit_h=seg.limit_h, restart_s=s.startup_s + write_s,
               restart_loss_h=seg.lost_h, first_wait_h=first.hours, wait_basis=first.how,
               requeue_wait_h=cal.requeue_wait.hours if seg.count > 1 else None)  # fmt: skip
    notes.append(seg.text())
    if settings is None:
        notes.append("local processes: no queue, no time limit (calendar = compute + start-up)")
    elif settings["time_limit_min"] < 60 * (settings.get("limits", {}).get("max_time_h") or 0):
        notes.append(f"jobs ask time_limit_min {settings['time_limit_min']} of the partition's "
                     f"{settings['limits']['max_time_h']:g} h: a longer limit needs fewer segments")  # fmt: skip
    if seg.count > 1:
        notes.append(f"requeue wait {cal.requeue_wait.text()} ({cal.requeue_wait.how})")
    _dates(row, cal, where.now or datetime.now())
    row["note"] = "; ".join(notes)
    return row


def _dates(row: dict[str, Any], cal: Calendar, now: datetime) -> None:
    hours = cal.hours
    row["calendar_days"] = hours / 24 if hours is not None else None
    if cal.first_wait.hours is not None:
        row["expected_start"] = (now + timedelta(hours=cal.first_wait.hours)).isoformat(timespec="minutes")
    else:
        row["expected_start"] = "wait unknown"
    finish = cal.finish(now)
    row["expected_finish"] = finish.isoformat(timespec="minutes") if finish else "unknown"


def rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mark per model and run the setting that finishes first; where the fastest to compute is another, say why."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["run"]), []).append(r)
    for group in groups.values():
        known = [r for r in group if r["calendar_days"] is not None]
        for r in group:
            r["finishes_first"] = False
        if not known:
            continue
        first = min(known, key=lambda r: (r["calendar_days"], r["compute_days"]))
        first["finishes_first"] = True
        fastest = min(group, key=lambda r: r["compute_days"])
        unknown = [r for r in group if r["calendar_days"] is None]
        if fastest is not first:
            why = []
            if fastest["calendar_days"] is None:
                why.append("its finish is unknown (" + (fastest["wait_basis"] or fastest["note"] or "?") + ")")
            else:
                if (fastest["first_wait_h"] or 0) > (first["first_wait_h"] or 0):
                    why.append(f"it waits {fastest['first_wait_h']:.3g} h to start, this {first['first_wait_h']:.3g} h")
                if (fastest["restart_loss_h"] or 0) > (first["restart_loss_h"] or 0):
                    why.append(f"its {fastest['segments']} segment(s) lose {fastest['restart_loss_h']:.3g} h to "
                               f"restarts, this {first['restart_loss_h']:.3g} h")  # fmt: skip
            first["note"] = (f"finishes first although {_where(fastest)} computes faster "
                             f"({fastest['compute_days']:.3g} vs {first['compute_days']:.3g} days): "
                             f"{'; '.join(why) or 'its requeue waits'}; " + (first["note"] or ""))  # fmt: skip
        elif unknown:
            first["note"] = (f"finishes first of those with a known finish ({len(unknown)} unknown); "
                             + (first["note"] or ""))  # fmt: skip
    return rows


def _where(r: dict[str, Any]) -> str:
    return f"{units.layout(r['nodes'], r['gpus_per_node'])} {r['gpu']} ({r['method']})"


def calendar_table(settings: list[Setting], catalog: Catalog, where: Site) -> pl.DataFrame:
    rows = rank([price(s, catalog, where) for s in settings])
    return pl.DataFrame(rows, schema=SCHEMA).select(COLUMNS).sort("model", "run", "calendar_days",
                                                                    nulls_last=True)  # fmt: skip


def calendar_markdown(table: pl.DataFrame, where: Site) -> str:
    now = (where.now or datetime.now()).isoformat(timespec="minutes")
    how = ("local processes: no queue" if where.site is None else
           "SLURM: each setting's wait asked of the scheduler (sbatch --test-only, nothing submitted)"
           if where.ask else "SLURM: the scheduler not asked")  # fmt: skip
    lines = [
        f"# When will it finish? (if submitted at {now})\n",
        f"Queue: {how}. Checkpoint rate (where the site file gives none): "
        f"{f'{where.measured_gb_s:.3g} GB/s' if where.measured_gb_s else 'unknown'} "
        f"({where.measured_how}). A wait the scheduler gives no estimate for is `wait unknown`, and its finish "
        "`unknown`: never a date without it.\n",
    ]
    if table.is_empty():
        return "\n".join([*lines, "No setting with a measured training time yet.\n"])
    lines.append(to_markdown(views.view("calendar", table), keys=3))
    lines.append("Where each part comes from (the CSV has it per row):\n")
    for column, what in (("compute_basis", "compute"), ("restart_basis", "restart"), ("wait_basis", "first wait")):
        for value, count in table.group_by(column, maintain_order=True).len().iter_rows():
            lines.append(f"- {what} ({count} setting(s)): {value or 'not priced'}")
    lines.append("\nPer setting:\n")
    for r in table.iter_rows(named=True):
        lines.append(f"- {r['model']} ({r['run']}) on {_where(r)}: {r['note'] or ''}")
    return "\n".join(lines) + "\n"


def build_calendar(
    inputs: Mapping[str, str],
    out: Mapping[str, str],
    log_path: str,
    site: SiteFile | None,
    catalog: Catalog,
    train: TrainSection,
) -> pl.DataFrame:
    """The `calendar` rule: calendar.{csv,md} of every measured setting (`inputs`: time_to_train's CSV, the cells'
    Parquet) and its train-stage run where the config's `train` (typed by the facade; the rule's params hold its
    JSON) gives the train stage a budget; on a SLURM site (the pipeline's, its limits resolved; None: local
    processes) the scheduler is asked."""
    require(train, TrainSection, "tables.calendar.build_calendar")
    from pretrain_planner.tables.aggregate import read_table

    rate, how = disk_write_rate(str(Path(out["calendar_csv"]).parent))  # the results folder's file system
    where = Site(site, rate, how, run_sbatch if site else None, datetime.now())
    settings = settings_of(read_table(inputs["time_to_train"]), pl.read_parquet(inputs["cells"]), train)
    table = calendar_table(settings, catalog, where)
    Path(out["calendar_csv"]).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out["calendar_csv"], table.write_csv())
    atomic_write_text(out["calendar_md"], calendar_markdown(table, where))
    unknown = table.filter(pl.col("calendar_days").is_null()).height
    atomic_write_text(log_path, f"calendar: {table.height} rows ({unknown} unknown); checkpoint rate {how}\n")
    return table


def read_calendar(path: str | Path) -> pl.DataFrame:
    """calendar.csv with its columns' types."""
    return pl.read_csv(path, schema=SCHEMA)
