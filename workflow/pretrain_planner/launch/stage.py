"""One launcher for every stage's job: a benchmark cell (launch/cell.py), the train stage's run (train/jobs.py), the
budget stage's pre-training and GLUE fine-tunes (budget/jobs.py). Imports no torch.

- `launch_settings`: how a stage's jobs run (a typed `Launch`): the config's launcher (typed where the config is
  loaded), and on SLURM the site's settings for the job's GPU type; a launcher that cannot run the job's ranks stops
  the dry run.
- `placement`: whether a local job takes GPUs from the host's pool, and each rank's CPU threads.
- `limits`: the local executor's time-out and the requeues after a time-out that a run of some hours needs (one
  longer than the site's time limit runs in requeued pieces, each resuming from the last checkpoint).
- `request`: the job in its folder: submitit's folder and the job's record (slurm_job.json or local_job.json, as
  the launcher writes it), which lets a restarted driver re-attach and names the one job that may write the
  folder's outputs.
- `run`: the job through executor.run_job (debug: in this process, holding what a local job holds), and once more
  if it completed but its outputs are gone (it finished while the driver was away and Snakemake removed them as
  incomplete): `collect` first writes them from rank 0's returned value where it can, a rerun resumes from the
  run's checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.launch.executor import run_job
from pretrain_planner.launch.rankjob import LOCAL_RECORD, SLURM_RECORD
from pretrain_planner.launch.request import JobRequest, Outcome, RuleLog, holds_gpus, threads_per_rank
from pretrain_planner.planning.configtypes import Launch, LauncherSection, require
from pretrain_planner.planning.site import gpu_settings, load_site
from pretrain_planner.schema import ConfigError, resolve_path


def launch_settings(
    launcher: LauncherSection,
    gpu: str,
    nodes: int,
    world: int,
    basedir: str | Path,
    source: str,
    ranks_key: str,
    gpu_key: str,
    soft_site: bool = False,
) -> Launch:
    """The config's `launcher` (its site file read) for a job of `world` ranks on `nodes` nodes of GPU type `gpu`;
    `source`, `ranks_key` and `gpu_key` name where those came from in errors. `soft_site`: a site that does not map
    the GPU type stops only these jobs (`slurm_error`), not the parse (a benchmark sweep need not map a stage's
    GPU type)."""
    require(launcher, LauncherSection, "launch.stage.launch_settings")
    if launcher.kind == "debug" and world > 1:
        raise ConfigError(f"{source}: {ranks_key} = {world} ranks, but launcher.kind debug runs one rank in the "
                          "driver's process: use launcher.kind local or slurm")  # fmt: skip
    if launcher.kind == "local" and nodes > 1:
        raise ConfigError(f"{source}: {nodes} nodes: the local launcher runs on one node (use launcher.kind slurm)")
    if launcher.kind != "slurm" or launcher.site is None:
        return Launch(launcher, None, None)
    try:
        site = load_site(resolve_path(launcher.site, basedir), [gpu], source, key=gpu_key)
    except ConfigError as exc:
        if not soft_site:
            raise
        return Launch(launcher, None, str(exc))
    return Launch(launcher, gpu_settings(site, gpu), None)


def placement(launch: Launch, gpu: str, device: str | None, world: int, threads: int) -> tuple[bool, int]:
    """(whether a local job takes GPUs from the host's pool, each rank's CPU threads): the site's CPUs per GPU under
    SLURM, a GPU's share of the host's cores for a rank on a GPU, else the rule's `threads` shared out."""
    require(launch, Launch, "launch.stage.placement")
    local_gpus = launch.launcher.local_gpus
    on_gpus = holds_gpus(gpu, device, local_gpus)
    return on_gpus, threads_per_rank(launch.kind, launch.slurm, threads, world, on_gpus, local_gpus)


def limits(launch: Launch, hours: float | None) -> tuple[int, int]:
    """(the local executor's time-out in minutes, the requeues after a time-out submitit allows) for a run of
    `hours` (None: not a timed run: the launcher's time-out, three requeues)."""
    require(launch, Launch, "launch.stage.limits")
    if hours is None:
        return launch.launcher.timeout_min, 3
    limit = max(launch.launcher.timeout_min, math.ceil(hours * 60 * 1.5) + 30)
    requeues = 3
    if launch.slurm:
        usable = max(1.0, launch.slurm["time_limit_min"] - launch.slurm["signal_delay_s"] / 60)
        requeues = math.ceil(limit / usable) + 3  # a run longer than the time limit: several requeued pieces
    return limit, requeues


# Time-out requeues submitit allows a SLURM job that resumes from its checkpoint (`fn.restartable` False: the train
# and budget stages' runs). Such a job is requeued after a time-out only when it checkpointed further than at the
# previous one (launch/progress.py refuses it otherwise, naming the site key to raise), so submitit's own count must
# not end it first: `limits` sizes the count from the run's hours, and a run budgeted in steps has none (the train
# stage passes 0, giving 4 requeues on a 24 h partition: a 30-day training there is 31 jobs). Issue 38.
RESUMING_REQUEUES = 10_000


def request(
    fn: Any,
    name: str,
    launch: Launch,
    workdir: Path,
    identity: dict[str, Any],
    *,
    nodes: int = 1,
    gpus_per_node: int = 1,
    on_gpus: bool = False,
    threads: int = 1,
    hours: float | None = None,
    extra_record: dict[str, Any] | None = None,
) -> JobRequest:
    """The job `fn` (a rankjob.RankJob) named `name` in its folder `workdir`; `identity`: what it computes (a
    recorded job of another identity is never re-attached to); `threads`: each rank's (`placement`)."""
    require(launch, Launch, "launch.stage.request")
    timeout, requeues = limits(launch, hours)
    if launch.slurm and not getattr(fn, "restartable", True):
        requeues = max(requeues, RESUMING_REQUEUES)  # bounded by its progress instead (see RESUMING_REQUEUES)
    return JobRequest(
        fn=fn, name=name, kind=launch.kind, folder=workdir / layout.SUBMITIT, nodes=nodes,
        gpus_per_node=gpus_per_node, timeout_min=timeout, use_gpus=on_gpus,
        slurm=dict(launch.slurm) if launch.slurm else None,
        record=workdir / (SLURM_RECORD if launch.kind == "slurm" else LOCAL_RECORD), identity=identity,
        max_num_timeout=requeues, extra_record=extra_record or {}, launcher=launch.launcher, cpu_threads=threads,
    )  # fmt: skip


def run(
    req: JobRequest,
    log: RuleLog,
    what: str,
    log_path: str | Path,
    outputs: list[Path],
    collect: Callable[[Outcome], None] | None = None,
    launch_error: str | None = None,
) -> Outcome:
    """Run the job (see the module's docstring); its outcome once every one of `outputs` is there."""
    if req.kind == "slurm" and req.slurm is None:
        raise RuntimeError(f"{what}: {launch_error or 'no site settings for the GPU type'}")
    for _attempt in range(2):
        outcome = run_job(req, log, what, log_path)
        log(f"job {outcome.job_id} done")
        if collect is not None and not all(p.exists() for p in outputs):
            collect(outcome)
        if all(p.exists() for p in outputs) or req.kind == "debug":
            return outcome
        missing = ", ".join(str(p) for p in outputs if not p.exists())
        req.record.unlink(missing_ok=True)  # do not re-attach to that job again
        log(f"job {outcome.job_id} finished without {missing}: running again (it resumes from its checkpoint)")
    raise RuntimeError(f"{what}: the job finished twice without writing {outputs}; see {log_path}")
