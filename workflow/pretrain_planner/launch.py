"""Hand a job to an executor, wait for it, and make sure its result landed. Imports no torch.

`run_job` runs any picklable callable on a request's ranks (a benchmark cell, the budget stage's pre-training
or a GLUE fine-tune); `run_cell` is the benchmark cell's use of it.

Launchers: `slurm` (submitit SlurmExecutor: one job per cell, one task per GPU, the partition and GPU
request of the site file; re-attaches to a job recorded in the cell folder), `local` (submitit
LocalExecutor: one process per rank on this host, gloo on CPU), and `debug` (in the driver's own
process, one rank: for tests; submitit's DebugExecutor is not used because it swaps os.environ and opens
pdb on failure, which breaks a threaded Snakemake driver).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .catalog import Catalog
from .grid import Cell
from .job import CellJob
from .results import atomic_write_text, write_result, write_steps
from .site import sbatch_parameters

JOB_RECORD = "slurm_job.json"
# SLURM states in which a recorded job may still deliver its result: re-attach instead of resubmitting.
LIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "COMPLETING", "CONFIGURING",
               "SUSPENDED", "RESIZING", "PREEMPTED", "SIGNALING", "STAGE_OUT", "COMPLETED"}  # fmt: skip


def cell_spec(
    cell: Cell, catalog: Catalog, config: dict[str, Any], result: str, steps: str, site: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Everything a cell's job needs, as plain JSON data (the job never reads config files)."""
    spec = {
        "cell": {
            "model": cell.model,
            "gpu": cell.gpu,
            "nodes": cell.nodes,
            "gpus_per_node": cell.gpus_per_node,
            "method": cell.method,
        },
        "name": cell.name,
        "model": catalog.model(cell.model).to_dict(),
        "gpu": catalog.gpu(cell.gpu).to_dict(),
        "benchmark": dict(config["benchmark"]),
        "launcher": {k: v for k, v in config["launcher"].items() if k != "site"},
        "outputs": {"result": str(result), "steps": str(steps)},
    }
    if config["launcher"]["kind"] == "slurm" and site:
        spec["slurm"] = {**site["gpus"][cell.gpu], "poll_max_s": site["poll_max_s"]}
    return spec


class RuleLog:
    """Timestamped lines in a rule's log file (truncated when the rule starts)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")

    def __call__(self, msg: str) -> None:
        stamp = dt.datetime.now().isoformat(timespec="seconds")
        with self.path.open("a") as fh:
            fh.write(f"[{stamp}] {msg}\n")

    def append_file(self, title: str, path: Path) -> None:
        if path.is_file():
            with self.path.open("a") as fh:
                fh.write(f"----- {title}: {path}\n{path.read_text(errors='replace')[-20000:]}\n")


def threads_per_rank(kind: str, slurm: dict[str, Any] | None, threads: int, world: int) -> int:
    """CPU threads for each rank: the site's CPUs per GPU under SLURM, else the rule's threads shared out."""
    if kind == "slurm" and slurm:
        return int(slurm["cpus_per_gpu"])
    return max(1, threads // max(1, world))


def uses_gpus(gpu: str, device: str | None) -> bool:
    """Whether a job asks its launcher for GPUs: not for the `cpu` GPU type nor a run forced onto the CPU."""
    return gpu != "cpu" and device != "cpu"


def _spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _world(spec: dict[str, Any]) -> int:
    return spec["cell"]["nodes"] * spec["cell"]["gpus_per_node"]


def _slurm_state(job) -> str:
    """The job's state from sacct (forced poll), falling back to squeue while sacct does not know it yet."""
    state = job.watcher.get_state(job.job_id, mode="force").split()[0].upper()
    if state == "UNKNOWN":
        out = subprocess.run(["squeue", "-h", "-j", job.job_id, "-o", "%T"], capture_output=True, text=True)
        state = out.stdout.strip().split("\n")[0].upper() if out.returncode == 0 and out.stdout.strip() else "GONE"
    return state


@dataclass
class JobRequest:
    """One job for the launcher: a picklable callable run once per rank (`nodes` x `gpus_per_node`).

    Cells and the budget stage's pre-training and fine-tuning all go through `run_job`, so each gets the
    same executors, GPU requests, requeue contract and re-attachment."""

    fn: Any  # picklable; a submitit Checkpointable is requeued on preemption / time-out
    name: str  # SLURM job name
    kind: str  # local | slurm (debug runs the callable in the caller)
    folder: Path  # submitit's logs and pickles
    nodes: int = 1
    gpus_per_node: int = 1
    timeout_min: int = 60  # local executor's limit (SLURM: the site's time_limit_min)
    use_gpus: bool = False  # local executor: give each rank a GPU
    slurm: dict[str, Any] | None = None  # the site's settings for the job's GPU type (+ poll_max_s)
    record: Path | None = None  # slurm_job.json: lets a restarted driver re-attach
    identity: dict[str, Any] | None = None  # what the job computes: a recorded job of another identity is not reused
    max_num_timeout: int = 3  # requeues after a time-out that submitit allows (a long budget run needs more)
    extra_record: dict[str, Any] = field(default_factory=dict)

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


def _reattach(req: JobRequest, log: RuleLog):
    """A job this request submitted before the driver restarted, if it can still deliver; else None."""
    import submitit

    if req.record is None or not req.record.is_file():
        return None
    record = json.loads(req.record.read_text())
    if record.get("spec_hash") != _spec_hash(req.identity or {}):
        log(f"recorded job {record.get('job_id')} ran another spec (config changed): not re-attaching")
        return None
    job = submitit.SlurmJob(folder=record["folder"], job_id=record["job_id"], tasks=tuple(range(req.world)))
    state = _slurm_state(job)
    if state in LIVE_STATES:
        log(f"re-attached to job {job.job_id} (state {state}) submitted at {record.get('submitted_at')}")
        return job
    log(f"recorded job {job.job_id} ended {state}: submitting anew")
    return None


def _submit_slurm(req: JobRequest, log: RuleLog):
    import submitit

    settings = req.slurm
    if settings is None:
        raise ValueError(f"job {req.name}: the slurm launcher needs the site's settings for its GPU type")
    submitit.SlurmJob.watcher._delay_s = settings["poll_max_s"]  # one shared sacct poll for all jobs
    ex = submitit.SlurmExecutor(folder=req.folder, max_num_timeout=req.max_num_timeout)
    params = sbatch_parameters(settings, req.nodes, req.gpus_per_node, req.name)
    ex.update_parameters(**params)
    job = ex.submit(req.fn)
    if req.record is not None:
        record = {
            "job_id": job.job_id,
            "folder": str(req.folder),
            "spec_hash": _spec_hash(req.identity or {}),
            "submitted_at": dt.datetime.now().isoformat(timespec="seconds"),
            **req.extra_record,
            "sbatch": params,
        }
        atomic_write_text(req.record, json.dumps(record, indent=1) + "\n")
    log(f"submitted SLURM job {job.job_id} to partition {params.get('partition')} ({json.dumps(params)})")
    return job


def _submit_local(req: JobRequest, log: RuleLog):
    import submitit

    shutil.rmtree(req.folder, ignore_errors=True)  # logs of an earlier attempt
    ex = submitit.LocalExecutor(folder=req.folder, max_num_timeout=req.max_num_timeout)
    gpus = req.world if req.use_gpus else 0
    ex.update_parameters(nodes=1, tasks_per_node=req.world, timeout_min=req.timeout_min, gpus_per_node=gpus)
    job = ex.submit(req.fn)
    log(f"submitted local job {job.job_id} ({req.world} processes); logs in {req.folder}")
    return job


def run_job(req: JobRequest, log: RuleLog, what: str, log_path: str | Path) -> tuple[str, Any]:
    """Submit (or re-attach to) the job, wait for every rank; (job id, rank 0's value); raise if it failed."""
    if req.kind == "slurm":
        job = _reattach(req, log) or _submit_slurm(req, log)
    elif req.kind == "local":
        if req.nodes != 1:
            raise ValueError(f"{what}: the local launcher runs on one node, not {req.nodes}")
        job = _submit_local(req, log)
    else:
        raise ValueError(f"unknown launcher {req.kind!r} (allowed: local, debug, slurm)")
    try:
        outs = job.results()
    except Exception as exc:
        log(f"job {job.job_id} did not complete: {type(exc).__name__}: {str(exc)[:2000]}")
        log.append_file("rank 0 stderr", job.paths.stderr)
        raise RuntimeError(f"{what} failed in job {job.job_id}; see {log_path}") from exc
    finally:
        log.append_file("rank 0 stdout", job.paths.stdout)
    return job.job_id, (outs[0] if outs else None)


def _materialise(payload: dict[str, Any], spec: dict[str, Any]) -> None:
    """Write rank 0's result from the job's returned value if the files are not there (a job that
    finished while the driver was down: Snakemake removed its outputs as incomplete)."""
    result, steps = Path(spec["outputs"]["result"]), Path(spec["outputs"]["steps"])
    if payload.get("result") and not (result.is_file() and steps.is_file()):
        write_steps(steps, payload.get("steps", []))
        write_result(result, payload["result"])


def run_cell(spec: dict[str, Any], log_path: str, threads: int = 1) -> dict[str, Any]:
    """Run one cell to completion with the configured launcher; raise if it crashed (Snakemake retries)."""
    kind = spec["launcher"]["kind"]
    world = _world(spec)
    per_rank = threads_per_rank(kind, spec.get("slurm"), threads, world)
    spec = {
        **spec,
        "threads_per_rank": per_rank,
        "outputs": {k: str(Path(v).resolve()) for k, v in spec["outputs"].items()},
    }
    result_path = Path(spec["outputs"]["result"])
    cell_dir = result_path.parent
    log = RuleLog(log_path)
    log(f"cell {json.dumps(spec['cell'])} launcher={kind} ranks={world} threads/rank={per_rank}")
    if kind == "debug":
        payload = CellJob(spec)()
        log(f"finished in-process: status={payload['result'].get('status')}")
    else:
        req = JobRequest(
            fn=CellJob(spec),
            name=spec["name"],
            kind=kind,
            folder=cell_dir / "submitit",
            nodes=spec["cell"]["nodes"],
            gpus_per_node=spec["cell"]["gpus_per_node"],
            timeout_min=spec["launcher"]["timeout_min"],
            use_gpus=uses_gpus(spec["cell"]["gpu"], spec["benchmark"].get("device")),
            slurm=spec.get("slurm"),
            record=cell_dir / JOB_RECORD,
            identity=spec,
            extra_record={"cell": spec["cell"]},
        )
        job_id, payload = run_job(req, log, f"cell {spec['cell']}", log_path)
        payload = payload or {}
        log(f"job {job_id} done: status={(payload.get('result') or {}).get('status')}")
    _materialise(payload, spec)
    if not result_path.is_file():
        raise RuntimeError(f"cell {spec['cell']} finished but wrote no {result_path}; see {log_path}")
    return payload
