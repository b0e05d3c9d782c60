"""Why a job pends, and whether waiting can help: SLURM keeps a job PENDING for ever for some reasons (where
EnforcePartLimits=NO, SLURM's default, a job over a partition's limits is accepted and never starts; a job an
administrator holds stays held; an account or QOS that does not exist never appears). The driver cancels such a job
and fails its cell within a minute, naming the reason and what fixes it, instead of waiting silently; the reasons
that clear by themselves (Priority, Resources, a per-user limit of running jobs) are waited for and logged.
Imports no torch.
"""

from __future__ import annotations

from typing import Any

# SLURM's job reason (scontrol show job's Reason=, squeue %r) -> (what it means, what fixes it); `{key}` is the site
# file's key of the GPU type, `{site}` the file
NEVER_CLEAR: dict[str, tuple[str, str]] = {
    "PartitionTimeLimit": ("its time limit is above the partition's MaxTime",
                           "lower gpus.{gpu}.time_limit_min in {site} (or set max_time_h: the plan then refuses it)"),
    "PartitionNodeLimit": ("it asks more nodes than the partition allows",
                           "set gpus.{gpu}.max_nodes in {site} (the plan then refuses larger cells)"),
    "PartitionConfig": ("the partition cannot run it as asked (its configuration: CPUs, memory or GPUs per node)",
                        "check gpus.{gpu}.partition, cpus_per_gpu and mem_per_gpu_gb in {site}"),
    "BadConstraints": ("no node has the features it asks",
                       "check gpus.{gpu}.constraint in {site}"),
    "InvalidAccount": ("its account does not exist or you are not in it", "check gpus.{gpu}.account in {site}"),
    "InvalidQOS": ("its QOS does not exist or its account may not use it", "check gpus.{gpu}.qos in {site}"),
    "QOSMaxWallDurationPerJobLimit": ("its time limit is above its QOS's MaxWall",
                                      "lower gpus.{gpu}.time_limit_min in {site}"),
    "AssocMaxWallDurationPerJobLimit": ("its time limit is above its account's MaxWall",
                                        "lower gpus.{gpu}.time_limit_min in {site}"),
    "QOSMaxNodePerJobLimit": ("it asks more nodes than its QOS allows a job", "set gpus.{gpu}.max_nodes in {site}"),
    "AssocMaxNodesPerJobLimit": ("it asks more nodes than its account allows a job",
                                 "set gpus.{gpu}.max_nodes in {site}"),
    "QOSMaxGRESPerJob": ("it asks more GPUs than its QOS allows a job", "sweep fewer GPUs per cell on {gpu}"),
    "AssocMaxGRESPerJob": ("it asks more GPUs than its account allows a job", "sweep fewer GPUs per cell on {gpu}"),
    "JobHeldAdmin": ("an administrator holds it", "ask the site's administrators (scontrol release)"),
    "launch_failed_requeued_held": ("its launch failed on a node and SLURM held it",
                                    "ask the site's administrators about the node (slurmd's log); then run again"),
    "DependencyNeverSatisfied": ("a job it depends on ended so that it can never start", "run again"),
}  # fmt: skip
CONFIRM_S = 5.0  # a never-clearing reason seen again this much later (not a moment of the scheduler's) ends the job


def never_clears(reason: str | None) -> bool:
    return bool(reason) and reason.split(",")[0].strip() in NEVER_CLEAR


def stuck_message(job_id: str, reason: str, settings: dict[str, Any] | None) -> str:
    """Why the job was cancelled, naming the reason and what fixes it."""
    s = settings or {}
    what, fix = NEVER_CLEAR[reason.split(",")[0].strip()]
    fix = fix.format(gpu=s.get("gpu_type", "<gpu>"), site=s.get("site") or "the site file")
    part = s.get("partition") or "the default partition"
    return (f"job {job_id} pended with reason {reason} on {part}: {what}, which does not clear by waiting; cancelled. "
            f"To fix: {fix}")  # fmt: skip
