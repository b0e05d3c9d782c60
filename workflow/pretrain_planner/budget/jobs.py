"""The budget stage's heavy jobs through the pipeline's one stage launcher (launch/stage.py), like the benchmark
cells and the train stage. Imports no torch.

`launcher.kind` of the main config: `local` (submitit LocalExecutor, one process per rank), `slurm` (one job on
the partition the site file maps train.gpu to, one task per GPU; re-attached after a driver restart through its
record; a preempted or timed-out pre-training checkpoints, is requeued and resumes) and `debug` (in the driver's
process, one rank).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pretrain_planner.budget.config import checked
from pretrain_planner.launch import stage
from pretrain_planner.launch.rankjob import EntryJob
from pretrain_planner.launch.request import JobRequest, RuleLog
from pretrain_planner.planning.configtypes import BudgetRecipe, Launch, require

ENTRIES = {"pretrain": "pretrain_planner.budget.pretrain:pretrain", "finetune": "pretrain_planner.budget.glue:finetune"}


def _of(recipe: BudgetRecipe) -> str:
    """A job name's suffix naming its budget.sweep recipe: the recipes' jobs run side by side, each its own."""
    return f"-{recipe.recipe}" if recipe.recipe else ""


def _request(entry: str, kwargs: dict[str, Any], launch: Launch, folder: Path, on_gpus: bool,
             **more: Any) -> JobRequest:  # fmt: skip
    """The job of a budget rule: `entry` with `kwargs` on train.gpu in `folder` (what identifies it for a
    re-attach: the entry and its arguments). The pre-training resumes from its checkpoint (not restartable)."""
    job = EntryJob(ENTRIES[entry], kwargs, restartable=entry != "pretrain")
    return stage.request(job, launch=launch, workdir=folder, identity={"entry": entry, **kwargs}, on_gpus=on_gpus,
                         threads=kwargs["threads"], **more)  # fmt: skip


def pretrain(
    recipe: BudgetRecipe,
    launch: Launch,
    index: str,
    out_model: str,
    out_result: str,
    run_dir: str,
    log_path: str,
    threads: int = 1,
    kill_at_step: int | None = None,
) -> dict[str, Any]:
    """The pretrain rule: the time-budgeted pre-training of `recipe` (typed by the facade: BudgetStage.recipe) on
    train.nodes x train.gpus_per_node ranks. `kill_at_step` (testing): rank 0 SIGKILLs itself after that step, a
    crash mid-run."""
    require(recipe, BudgetRecipe, "budget.jobs.pretrain")
    require(launch, Launch, "budget.jobs.pretrain")
    tr, setting = recipe.train, checked(recipe.setting)
    world = setting.world_size
    run = Path(run_dir).resolve()
    on_gpus, per_rank = stage.placement(launch, tr.gpu, tr.device, world, threads)
    kwargs = {
        "cfg": recipe.to_job(), "index_path": str(Path(index).resolve()), "out_model": str(Path(out_model).resolve()),
        "out_result": str(Path(out_result).resolve()), "run_dir": str(run), "log": str(Path(log_path).resolve()),
        "threads": per_rank,
    }  # fmt: skip
    if kill_at_step is not None:
        kwargs["kill_at_step"] = kill_at_step
    log = RuleLog(log_path)
    log(
        f"pretrain: launcher {launch.kind}, {world} rank(s) ({tr.nodes}x{tr.gpus_per_node} {tr.gpu}), "
        f"setting from {setting.source}{' (' + setting.plan + ')' if setting.plan else ''}: micro-batch "
        f"{setting.micro_batch} x {setting.grad_accum_steps} accumulation x {world} = {setting.global_batch}, "
        f"method {setting.method.slug}, {kwargs['threads']} thread(s) per rank"
    )
    req = _request(
        "pretrain", kwargs, launch, run.parent, on_gpus, hours=tr.budget_hours,
        name=f"pp-budget-pretrain-{recipe.model.name}-{tr.gpu}-{tr.nodes}x{tr.gpus_per_node}{_of(recipe)}",
        nodes=tr.nodes, gpus_per_node=tr.gpus_per_node,
    )  # fmt: skip
    outputs = [Path(out_model), Path(out_result)]
    return stage.run(req, log, "budget pretrain", log_path, outputs, launch_error=launch.slurm_error).first or {}


def finetune(
    recipe: BudgetRecipe,
    launch: Launch,
    task: str,
    init_model: str,
    out_metrics: str,
    log_path: str,
    *,
    out_model: str | None = None,
    init_kind: str = "pretrained",
    threads: int = 1,
) -> dict[str, Any]:
    """A finetune rule: one GLUE task of `recipe` (typed by the facade) on one rank (GPU) of train.gpu."""
    require(recipe, BudgetRecipe, "budget.jobs.finetune")
    require(launch, Launch, "budget.jobs.finetune")
    tr = recipe.train
    out = Path(out_metrics).resolve()
    on_gpus, per_rank = stage.placement(launch, tr.gpu, tr.device, 1, threads)
    kwargs = {
        "cfg": recipe.to_job(), "task_name": task, "init_model": str(Path(init_model).resolve()),
        "out_metrics": str(out), "log": str(Path(log_path).resolve()),
        "out_model": str(Path(out_model).resolve()) if out_model else None, "init_kind": init_kind, "threads": per_rank,
    }  # fmt: skip
    log = RuleLog(log_path)
    log(f"finetune {task} from {init_kind}: launcher {launch.kind}, 1 rank ({tr.gpu})")
    name = f"pp-budget-glue-{task}{_of(recipe)}"
    req = _request("finetune", kwargs, launch, out.parent, on_gpus, name=name)
    outputs = [Path(out_metrics)] + ([Path(out_model)] if out_model else [])
    return stage.run(req, log, "budget finetune", log_path, outputs, launch_error=launch.slurm_error).first or {}
