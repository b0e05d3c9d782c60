"""The train stage through the pipeline's launchers, like the benchmark cells and the budget stage. Imports no
torch.

`local` (submitit LocalExecutor: one process per rank on this host), `slurm` (one job on the partition the site
file maps the plan's GPU type to, one task per GPU; re-attached after a driver restart through slurm_job.json; a
pre-empted or timed-out run checkpoints, is requeued and resumes) and `debug` (in the caller's process, one rank).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.launch.executor import run_job
from pretrain_planner.launch.request import JobRequest, RuleLog, holds_gpus, threads_per_rank
from pretrain_planner.planning.pipeline import resolve
from pretrain_planner.planning.site import load_site
from pretrain_planner.results import atomic_write_text
from pretrain_planner.schema import ConfigError
from pretrain_planner.train.job import TrainJob


def plan_file(plan: str | Path, setting: str | None = None) -> Path:
    """plan.json: the file itself, the folder holding it, or (the optimal/ folder of the export) its setting's."""
    p = Path(plan)
    if p.is_dir() and setting is not None and not (p / layout.PLAN_FILE).is_file():
        p = p / setting
    return p / layout.PLAN_FILE if p.is_dir() else p


def read_plan(plan: str | Path) -> dict[str, Any]:
    p = plan_file(plan)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no plan (the export_plan rule writes results/optimal/{{model}}/{{gpu}}/"
                                "{N}x{G}/plan.json)")  # fmt: skip
    return json.loads(p.read_text())


def launch_settings(launcher: dict[str, Any], plan: dict[str, Any], basedir: str | Path = ".") -> dict[str, Any]:
    """How the run is launched: the config's launcher, and on SLURM the site's settings for the plan's GPU type."""
    gpu, nodes, world = plan["gpu"]["name"], int(plan["nodes"]), int(plan["nodes"]) * int(plan["gpus_per_node"])
    out: dict[str, Any] = {**{k: v for k, v in launcher.items() if k != "site"}, "slurm": None}
    if launcher["kind"] == "debug" and world > 1:
        raise ConfigError(f"the plan has {world} ranks, but launcher.kind debug runs one rank in this process: "
                          "use local or slurm")  # fmt: skip
    if launcher["kind"] == "local" and nodes > 1:
        raise ConfigError(f"the plan spans {nodes} nodes: the local launcher runs on one node (use slurm)")
    if launcher["kind"] == "slurm":
        site = load_site(resolve(launcher["site"], basedir), [gpu], launcher["site"], key="plan gpu")
        out["slurm"] = {**site["gpus"][gpu], "poll_max_s": site["poll_max_s"], "gpu_type": gpu, "site": site["path"]}
    return out


def run_plan(
    plan: str | Path,
    launch: dict[str, Any],
    out_dir: str | Path,
    log_path: str | Path,
    *,
    threads: int = 1,
    device: str = "auto",
    **options: Any,
) -> dict[str, Any]:
    """Run plan.json through the launcher into `out_dir` (result.json, throughput.{md,csv}, run/ to resume from).
    `options`: train.run.train_plan's (steps, time_budget_h, data, tokenizer, checkpoint_every_min, ...)."""
    p = plan_file(plan).resolve()
    rec = read_plan(p)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    gpu, nodes, gpn = rec["gpu"]["name"], int(rec["nodes"]), int(rec["gpus_per_node"])
    world = nodes * gpn
    on_gpus = holds_gpus(gpu, device, launch.get("local_gpus"))
    per_rank = threads_per_rank(launch["kind"], launch["slurm"], threads, world, on_gpus, launch.get("local_gpus"))
    kwargs = {"out": str(out), "device": device, "threads": per_rank,
              **{k: v for k, v in options.items() if v is not None}}  # fmt: skip
    log = RuleLog(log_path)
    log(f"train: plan {p} ({rec['model']['name']}, {nodes}x{gpn} {gpu}, method {rec['method']}), launcher "
        f"{launch['kind']}, {per_rank} thread(s) per rank, options {json.dumps(options, default=str)}")  # fmt: skip
    if launch["kind"] == "debug":
        from pretrain_planner.train.run import train_plan

        return train_plan(str(p), **kwargs)
    if launch["kind"] == "slurm" and launch["slurm"] is None:
        raise RuntimeError(f"train: no site settings for GPU type {gpu!r}")
    hours = options.get("time_budget_h") or 0
    limit = max(launch["timeout_min"], math.ceil(hours * 60 * 1.5) + 30)
    requeues = 3
    if launch["slurm"]:
        usable = max(1.0, launch["slurm"]["time_limit_min"] - launch["slurm"]["signal_delay_s"] / 60)
        requeues = math.ceil(limit / usable) + 3  # a run longer than the time limit: several requeued pieces
    req = JobRequest(
        fn=TrainJob(str(p), kwargs), name=f"pp-train-{rec['model']['name']}-{gpu}-{nodes}x{gpn}", kind=launch["kind"],
        folder=out / "submitit", nodes=nodes, gpus_per_node=gpn, timeout_min=limit, use_gpus=on_gpus,
        slurm=launch["slurm"], record=out / layout.SLURM_RECORD, identity={"plan": str(p), **kwargs},
        max_num_timeout=requeues, launcher=launch, cpu_threads=per_rank,
    )  # fmt: skip
    result = out / layout.RESULT
    for _attempt in range(2):
        outcome = run_job(req, log, "train", log_path)
        log(f"job {outcome.job_id} done")
        if not result.exists() and isinstance(outcome.first, dict) and "throughput" in outcome.first:
            # it finished while the driver was away and Snakemake removed its outputs as incomplete: rank 0's
            # returned result is the run's (a new job would only resume at the last step and train nothing)
            from pretrain_planner.train.record import write_tables

            atomic_write_text(result, json.dumps(outcome.first, indent=1, default=str))
            write_tables(out, outcome.first)
            log(f"job {outcome.job_id}: result.json and the throughput tables written from its returned result")
        if result.exists():
            return json.loads(result.read_text())
        req.record.unlink(missing_ok=True)  # do not re-attach to that job again
        log(f"job {outcome.job_id} finished without {result}: running again (it resumes from its checkpoint)")
    raise RuntimeError(f"train: the job finished twice without writing {result}; see {log_path}")


def train_rule(
    plan_input: str,
    wildcards: Any,
    config: dict[str, Any],
    out_dir: str,
    log_path: str,
    threads: int,
    basedir: str | Path,
) -> dict[str, Any]:
    """The train rule: the setting's plan.json (given, or inside the export's optimal/ folder) through the
    config's launcher, with the config's `train` section."""
    setting = layout.setting_folder(wildcards.model, wildcards.gpu, wildcards.nodes, wildcards.gpus_per_node)
    p = plan_file(plan_input, setting)
    rec = read_plan(p)
    launch = launch_settings(config["launcher"], rec, basedir)
    t = config["train"]
    device = "cpu" if t["device"] == "cpu" or config["benchmark"].get("device") == "cpu" else "auto"
    return run_plan(p, launch, out_dir, log_path, threads=threads, device=device, steps=t["steps"],
                    time_budget_h=t["time_budget_hours"], data=t["data"], tokenizer=t["tokenizer"],
                    checkpoint_every_min=t["checkpoint_every_min"])  # fmt: skip


def plan_input(results: str, wildcards: Any, swept: Collection[str] = ()) -> str:
    """The train rule's input: the export's optimal/ folder for a setting of the sweep (`swept`: setting folders;
    the export writes its plan), else the setting's plan.json when it is there (a plan given by hand), else the
    folder. The same input on every run: a plan.json that appeared since the last run must not count as a changed
    input (Snakemake would train again on a finished workflow)."""
    setting = layout.setting_folder(wildcards.model, wildcards.gpu, wildcards.nodes, wildcards.gpus_per_node)
    plan = layout.optimal_plan_pattern(results).format(**dict(wildcards.items()))
    if setting in swept or not Path(plan).is_file():
        return f"{results}/{layout.OPTIMAL}"
    return plan


def rule_threads(kind: str, wildcards: Any, cores: int | None) -> int:
    """Cores the run holds on this host: one per rank (local, debug), one for a SLURM job."""
    from pretrain_planner.launch.request import driver_cores

    return driver_cores(kind, int(wildcards.nodes) * int(wildcards.gpus_per_node), 1, cores)
