"""A setting's loss-equivalence check job, driver side (the `loss_check` rule): which runs it makes (from the
setting's cell results: planning/losscheck.plan_runs), then one job of the setting's world size through the one
stage launcher (launch/stage.py), every rank running trainer/losscheck.py by its entry. A setting with nothing to
check writes its record without starting a job. Imports no torch."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.launch import stage
from pretrain_planner.launch.rankjob import EntryJob
from pretrain_planner.launch.request import Outcome, RuleLog
from pretrain_planner.planning import losscheck
from pretrain_planner.planning.configtypes import BenchmarkSection, Launch
from pretrain_planner.planning.methods import parse_canonical
from pretrain_planner.results import atomic_write_text, parse_result

ENTRY = "pretrain_planner.trainer.losscheck:run_rank"


def cell_rows(paths: list[str]) -> dict[str, dict[str, Any]]:
    """The setting's cell results by method (unreadable ones left out: their method is not checked)."""
    rows = {}
    for p in paths:
        row, _ = parse_result(Path(p))
        if row is not None:
            rows[row["method"]] = row
    return rows


def run_check(spec: dict[str, Any], cell_results: list[str], curves: str, log_path: str, threads: int = 1,
              ) -> dict[str, Any]:  # fmt: skip
    """The rule: plan the setting's runs, launch those that an earlier check of the setting did not make already
    (layout.loss_check_run: each run kept by its key), or record why there are none; leave `curves` behind."""
    c, benchmark = spec["cell"], BenchmarkSection.of_job(spec["benchmark"], "the check's spec: benchmark")
    conf = benchmark.loss_check  # the spec's JSON, typed again here
    world = c["nodes"] * c["gpus_per_node"]
    rows = cell_rows(cell_results)
    cuda = c["gpu"] != "cpu" and benchmark.device != "cpu"
    runs, why, size = losscheck.plan_runs(rows, conf, spec["model"], spec["gpu"], world, c["nodes"], cuda)
    log = RuleLog(log_path)
    check = {"steps": conf.steps, "global_batch": size, "seed": benchmark.seed,
             "init": str(Path(layout.loss_check_init(spec["results"], c["model"], benchmark.seed)).resolve()),
             "identity": losscheck.identity(spec)}  # fmt: skip
    step_s = (rows.get("naive") or {}).get("step_time_s")
    check["gpu_hours_estimate"] = losscheck.cost_gpu_hours(len(runs), conf.steps, step_s, world)
    where = layout.setting_folder(**{k: c[k] for k in ("model", "gpu", "nodes", "gpus_per_node")})
    if not runs:
        record = {"setting": c, "check": check, "runs": [], "note": why}
        log(f"loss check of {where}: no job ({why})")
        atomic_write_text(curves, json.dumps(record, indent=1) + "\n")
        return record
    keys = {r["name"]: losscheck.run_key(r, check) for r in runs}
    kept = {}
    for r in runs:
        got = losscheck.kept_run(layout.loss_check_run(curves, keys[r["name"]]), r)
        if got is not None:
            kept[r["name"]] = got
    todo = [r for r in runs if r["name"] not in kept]
    if kept:
        log(f"loss check of {where}: {len(kept)} of {len(runs)} run(s) kept from an earlier check of the setting (the "
            f"same run of the same check): {', '.join(kept)}")  # fmt: skip
    made: dict[str, dict[str, Any]] = {}
    if todo:
        record = launch_check(spec, todo, check, curves, log_path, threads)
        made = {r["name"]: r for r in record["runs"]}
        for r in todo:
            if r["name"] in made and losscheck.keepable(made[r["name"]]):
                atomic_write_text(layout.loss_check_run(curves, keys[r["name"]]), json.dumps(made[r["name"]]) + "\n")
    else:
        log(f"loss check of {where}: no job (every run is kept from an earlier check)")
        record = {"setting": c, "check": {**check, "wall_s": 0.0}}
    if kept:
        record["runs"] = [kept.get(r["name"]) or made[r["name"]] for r in runs]
        # what the check's runs cost, the kept ones' in the earlier jobs included (each run's share of its job)
        record["check"]["gpu_hours_spent"] = sum(r.get("gpu_hours") or 0.0 for r in record["runs"])
        atomic_write_text(curves, json.dumps(record, indent=1) + "\n")
    return record


def launch_check(spec: dict[str, Any], runs: list[dict[str, Any]], check: dict[str, Any], curves: str,
                 log_path: str, threads: int = 1) -> dict[str, Any]:  # fmt: skip
    """One job of the setting's ranks running `runs` in turn (trainer/losscheck.run_rank); its record."""
    c = spec["cell"]
    world = c["nodes"] * c["gpus_per_node"]
    launch, benchmark = Launch.of_job(spec), BenchmarkSection.of_job(spec["benchmark"], "the check's spec: benchmark")
    on_gpus, per_rank = stage.placement(launch, c["gpu"], benchmark.device, world, world)
    out = Path(curves).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    job_spec = {**{k: spec[k] for k in ("cell", "model", "gpu", "benchmark")}, "threads_per_rank": per_rank,
                "init_method": next((r["method"] for r in runs if parse_canonical(r["method"]).sharding), "naive"),
                "check": check, "runs": runs, "outputs": {"curves": str(out)}}  # fmt: skip
    log = RuleLog(log_path)
    log(f"loss check {json.dumps(c)}: {len(runs)} runs x {check['steps']} steps, global batch "
        f"{check['global_batch']}: {', '.join(r['name'] for r in runs)}")  # fmt: skip
    req = stage.request(
        EntryJob(ENTRY, {"spec": job_spec}), f"pp-losscheck-{spec['name']}", launch, out.parent,
        {"loss_check": job_spec}, nodes=c["nodes"], gpus_per_node=c["gpus_per_node"], on_gpus=on_gpus,
        threads=per_rank,
    )  # fmt: skip

    def collect(outcome: Outcome) -> None:
        record = (outcome.first or {}).get("record") if isinstance(outcome.first, dict) else None
        if record and not out.is_file():
            atomic_write_text(out, json.dumps(record, indent=1) + "\n")

    t0 = time.time()
    stage.run(req, log, f"loss check {c}", log_path, [out], collect)
    record = json.loads(out.read_text())
    # what the check spent, measured: the job's wall time (start-up included) x its ranks
    record["check"]["wall_s"] = time.time() - t0
    record["check"]["gpu_hours_spent"] = record["check"]["wall_s"] * world / 3600
    for run in record["runs"]:  # each run's share, for a later check that keeps it (run_check)
        run["gpu_hours"] = record["check"]["gpu_hours_spent"] / len(record["runs"])
    atomic_write_text(out, json.dumps(record, indent=1) + "\n")
    for run in record["runs"]:
        log(f"  {run['name']}: " + (run.get("error") or run.get("skipped")
                                     or f"loss {run['loss'][0]:.4g} -> {run['loss'][-1]:.4g}"))  # fmt: skip
    return record
