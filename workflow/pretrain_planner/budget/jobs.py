"""The budget stage's heavy jobs through the pipeline's launcher, like the benchmark cells. Imports no torch.

`launcher.kind` of the main config: `local` (submitit LocalExecutor, one process per rank), `slurm` (one job on
the partition the site file maps train.gpu to, one task per GPU; re-attached after a driver restart through
slurm_job.json; a preempted or timed-out pre-training checkpoints, is requeued and resumes) and `debug` (in
the driver's process, one rank).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pretrain_planner.budget.config import setting_of
from pretrain_planner.budget.job import BudgetJob
from pretrain_planner.launch.executor import run_job
from pretrain_planner.launch.rankjob import SLURM_RECORD as JOB_RECORD
from pretrain_planner.launch.request import JobRequest, RuleLog, holds_gpus, threads_per_rank
from pretrain_planner.launch.stage import TORCH_LOCK


def _run(
    entry: str,
    kwargs: dict[str, Any],
    req: JobRequest,
    log: RuleLog,
    log_path: str,
    outputs: list[Path],
    launch_error: str | None = None,
) -> dict[str, Any]:
    """Run the job; once more if it completed but its outputs are gone (it finished while the driver was
    down and Snakemake removed them as incomplete): the rerun resumes from the final checkpoint."""
    if req.kind == "debug":
        from pretrain_planner.budget import glue, pretrain

        with TORCH_LOCK:
            return (pretrain.pretrain if entry == "pretrain" else glue.finetune)(**kwargs)
    if req.kind == "slurm" and req.slurm is None:
        raise RuntimeError(f"budget {entry}: {launch_error or 'no site settings for train.gpu'}")
    for _attempt in range(2):
        outcome = run_job(req, log, f"budget {entry}", log_path)
        job_id = outcome.job_id
        log(f"job {job_id} done")
        if all(p.exists() for p in outputs):
            return outcome.first or {}
        if req.record is not None:
            req.record.unlink(missing_ok=True)  # do not re-attach to that job again
        log(f"job {job_id} finished without {', '.join(str(p) for p in outputs if not p.exists())}: running again")
    raise RuntimeError(f"budget {entry}: the job finished twice without writing {outputs}; see {log_path}")


def _threads(cfg: dict[str, Any], launch: dict[str, Any], threads: int, world: int) -> int:
    on_gpus = holds_gpus(cfg["train"]["gpu"], cfg["train"]["device"], launch.get("local_gpus"))
    return threads_per_rank(launch["kind"], launch["slurm"], threads, world, on_gpus, launch.get("local_gpus"))


def _of(cfg: dict[str, Any]) -> str:
    """A job name's suffix naming its budget.sweep recipe: the recipes' jobs run side by side, each its own."""
    return f"-{cfg['recipe']['name']}" if cfg.get("recipe") else ""


def _request(
    entry: str, kwargs: dict[str, Any], cfg: dict[str, Any], launch: dict[str, Any], folder: Path, **more: Any
) -> JobRequest:
    """The job of a budget rule: `entry` with `kwargs` on train.gpu, its submitit folder and SLURM record in
    `folder` (what identifies it for a re-attach: the entry and its arguments)."""
    return JobRequest(
        fn=BudgetJob(entry, kwargs),
        kind=launch["kind"],
        folder=folder / "submitit",
        use_gpus=holds_gpus(cfg["train"]["gpu"], cfg["train"]["device"], launch.get("local_gpus")),
        slurm=launch["slurm"],
        record=folder / JOB_RECORD,
        identity={"entry": entry, **kwargs},
        launcher=launch,
        cpu_threads=kwargs["threads"],
        **more,
    )


def pretrain(
    cfg: dict[str, Any],
    launch: dict[str, Any],
    index: str,
    out_model: str,
    out_result: str,
    run_dir: str,
    log_path: str,
    threads: int = 1,
    kill_at_step: int | None = None,
) -> dict[str, Any]:
    """The pretrain rule: the time-budgeted pre-training on train.nodes x train.gpus_per_node ranks.
    `kill_at_step` (testing): rank 0 SIGKILLs itself after that step, a crash mid-run."""
    tr, setting = cfg["train"], setting_of(cfg)
    world = setting["world_size"]
    run = Path(run_dir).resolve()
    kwargs = {
        "cfg": cfg, "index_path": str(Path(index).resolve()), "out_model": str(Path(out_model).resolve()),
        "out_result": str(Path(out_result).resolve()), "run_dir": str(run), "log": str(Path(log_path).resolve()),
        "threads": _threads(cfg, launch, threads, world),
    }  # fmt: skip
    if kill_at_step is not None:
        kwargs["kill_at_step"] = kill_at_step
    log = RuleLog(log_path)
    log(
        f"pretrain: launcher {launch['kind']}, {world} rank(s) ({tr['nodes']}x{tr['gpus_per_node']} {tr['gpu']}), "
        f"setting from {setting['source']}{' (' + setting['plan'] + ')' if setting['plan'] else ''}: micro-batch "
        f"{setting['micro_batch']} x {setting['grad_accum_steps']} accumulation x {world} = {setting['global_batch']}, "
        f"method {setting['method']}, {kwargs['threads']} thread(s) per rank"
    )
    budget_min = tr["budget_hours"] * 60
    timeout = max(launch["timeout_min"], math.ceil(budget_min * 1.5) + 30)
    max_requeues = 3
    if launch["slurm"]:
        usable = max(1.0, launch["slurm"]["time_limit_min"] - launch["slurm"]["signal_delay_s"] / 60)
        max_requeues = math.ceil(budget_min * 1.5 / usable) + 3  # a budget longer than the time limit
    req = _request(
        "pretrain", kwargs, cfg, launch, run.parent,
        name=f"pp-budget-pretrain-{cfg['model']['name']}-{tr['gpu']}-{tr['nodes']}x{tr['gpus_per_node']}{_of(cfg)}",
        nodes=tr["nodes"], gpus_per_node=tr["gpus_per_node"], timeout_min=timeout, max_num_timeout=max_requeues,
    )  # fmt: skip
    outputs = [Path(out_model), Path(out_result)]
    return _run("pretrain", kwargs, req, log, log_path, outputs, launch.get("slurm_error"))


def finetune(
    cfg: dict[str, Any],
    launch: dict[str, Any],
    task: str,
    init_model: str,
    out_metrics: str,
    log_path: str,
    *,
    out_model: str | None = None,
    init_kind: str = "pretrained",
    threads: int = 1,
) -> dict[str, Any]:
    """A finetune rule: one GLUE task on one rank (GPU) of train.gpu."""
    tr = cfg["train"]
    out = Path(out_metrics).resolve()
    kwargs = {
        "cfg": cfg, "task_name": task, "init_model": str(Path(init_model).resolve()), "out_metrics": str(out),
        "log": str(Path(log_path).resolve()), "out_model": str(Path(out_model).resolve()) if out_model else None,
        "init_kind": init_kind, "threads": _threads(cfg, launch, threads, 1),
    }  # fmt: skip
    log = RuleLog(log_path)
    log(f"finetune {task} from {init_kind}: launcher {launch['kind']}, 1 rank ({tr['gpu']})")
    name = f"pp-budget-glue-{task}{_of(cfg)}"
    req = _request("finetune", kwargs, cfg, launch, out.parent, name=name, timeout_min=launch["timeout_min"])
    outputs = [Path(out_metrics)] + ([Path(out_model)] if out_model else [])
    return _run("finetune", kwargs, req, log, log_path, outputs, launch.get("slurm_error"))
