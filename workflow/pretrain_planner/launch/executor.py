"""Hand a job to an executor and wait for it: `run_job` runs any picklable callable (a `rankjob.RankJob`) on a
request's ranks — a benchmark cell (launch/cell.py), the train stage's run, the budget stage's pre-training or a
GLUE fine-tune, each through launch/stage.py.

Launchers: `slurm` (submitit SlurmExecutor: one job, one task per GPU, the partition and GPU request of the
site file; re-attached to through the job's record; see slurm.py), `local` (submitit LocalExecutor: one
process per rank on this host, on devices it holds alone; see local.py and hostpool.py), and `debug` (in the
driver's own process, one rank, holding what a local job holds: local.run_debug). Imports no torch.
"""

from __future__ import annotations

from pathlib import Path

from pretrain_planner.launch.local import run_debug, run_local
from pretrain_planner.launch.request import JobRequest, Outcome, RuleLog
from pretrain_planner.launch.slurm import run_slurm


def run_job(req: JobRequest, log: RuleLog, what: str, log_path: str | Path) -> Outcome:
    """Submit (or re-attach to) the job, wait for every rank; every rank's value; raise if it failed."""
    if req.kind == "slurm":
        return run_slurm(req, log, what, log_path)
    if req.kind == "local":
        return run_local(req, log, what, log_path)
    if req.kind == "debug":
        return run_debug(req, log, what)
    raise ValueError(f"unknown launcher {req.kind!r} (allowed: local, debug, slurm)")
