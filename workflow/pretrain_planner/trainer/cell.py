"""A benchmark cell's job: `run_cell` (driver side, the `benchmark_cell` rule) hands `CellJob` to the launcher
and makes sure the cell's result landed; `CellJob` runs on every rank and measures (trainer.run). Imports no
torch until a rank runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pretrain_planner.launch import driver
from pretrain_planner.launch.executor import run_job
from pretrain_planner.launch.hostpool import HostPool, cgroup_oom_kills
from pretrain_planner.launch.local import folder_lock
from pretrain_planner.launch.rankjob import LOCAL_RECORD, SLURM_RECORD, RankJob
from pretrain_planner.launch.request import JobFailed, JobRequest, RuleLog, holds_gpus, read_json, threads_per_rank
from pretrain_planner.results import atomic_write_text, write_result, write_steps


class CellJob(RankJob):
    """Measure one cell. On preemption or time-out submitit calls `checkpoint`, which requeues this same
    callable: a benchmark restarts cleanly from its first step."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__()
        self.spec = spec

    def run(self) -> dict[str, Any]:
        from pretrain_planner.trainer.run import run_rank  # torch is imported here, on the compute side only

        return run_rank({**self.spec, "launch_context": getattr(self, "context", None) or {}})


def _materialise(payload: dict[str, Any], spec: dict[str, Any]) -> None:
    """Write rank 0's result from the job's returned value if the files are not there (a job that
    finished while the driver was down: Snakemake removed its outputs as incomplete)."""
    result, steps = Path(spec["outputs"]["result"]), Path(spec["outputs"]["steps"])
    if payload.get("result") and not (result.is_file() and steps.is_file()):
        write_steps(steps, payload.get("steps", []))
        write_result(result, payload["result"])


def _host_memory_oom(
    exc: JobFailed, spec: dict[str, Any], kills_before: int | None, log: RuleLog
) -> dict[str, Any] | None:
    """A job that failed because the kernel killed a rank for host memory is an `oom` result, not a crash to
    retry: rank 0 wrote it before the job failed (a peer was killed), or the driver writes it (rank 0 was
    killed: SLURM says OUT_OF_MEMORY, or this host's cgroup counted an out-of-memory kill meanwhile)."""
    from pretrain_planner.tables.aggregate import parse_result

    result_path = Path(spec["outputs"]["result"])
    row, _ = parse_result(result_path) if result_path.is_file() else (None, None)
    if (
        row is not None
        and row["status"] == "oom"
        and (row.get("reason") or "").startswith("host memory")
        and (exc.job_id in (row.get("slurm_job_id"), row.get("submitit_job_id")))
    ):
        log(f"job {exc.job_id} failed after rank 0 recorded a host-memory kill: kept as oom ({row['reason']})")
        return {"result": row}
    kills = cgroup_oom_kills() if kills_before is not None else None
    state = getattr(exc.state, "state", None)
    if state == "OUT_OF_MEMORY":
        why = f"host memory: SLURM ended job {exc.job_id} OUT_OF_MEMORY (the node's memory limit for the job)"
    elif exc.rank0_died and kills is not None and kills_before is not None and kills > kills_before:
        why = (f"host memory: a rank was killed by the kernel's out-of-memory killer (this host's cgroup counted "
               f"{kills - kills_before} kill(s) during job {exc.job_id})")  # fmt: skip
    else:
        return None
    c = spec["cell"]
    result = {"status": "oom", "reason": why, **c, "world_size": c["nodes"] * c["gpus_per_node"],
              "precision": spec["model"]["recipe"]["precision"],
              "global_batch": spec["model"]["recipe"]["global_batch"],
              "slurm_job_id": exc.job_id if spec["launcher"]["kind"] == "slurm" else None,
              "submitit_job_id": exc.job_id}  # fmt: skip
    write_steps(spec["outputs"]["steps"], [])
    write_result(result_path, result)
    log(f"job {exc.job_id}: {why}: recorded as oom (a result, not retried)")
    return {"result": result}


def _record_ranks(result_path: Path, values: list[Any], job_id: str) -> None:
    """Add every rank's own view of its devices to result.json (rank 0 wrote its own)."""
    ranks = [v.get("devices") for v in values if isinstance(v, dict) and v.get("devices")]
    data = read_json(result_path)
    if not ranks or not isinstance(data, dict) or not isinstance(data.get("devices"), dict):
        return
    data["devices"]["ranks"] = ranks
    atomic_write_text(result_path, json.dumps(data, indent=1) + "\n")


def run_cell(spec: dict[str, Any], log_path: str, threads: int = 1) -> dict[str, Any]:
    """Run one cell to completion with the configured launcher; raise if it crashed (Snakemake retries)."""
    kind = spec["launcher"]["kind"]
    world = spec["cell"]["nodes"] * spec["cell"]["gpus_per_node"]
    gpu, device = spec["cell"]["gpu"], spec["benchmark"].get("device")
    on_gpus = holds_gpus(gpu, device, spec["launcher"].get("local_gpus"))
    # a `cpu` rank: one core (its stand-in for a GPU); a GPU rank: its GPU's share of the cores
    per_rank = threads_per_rank(kind, spec.get("slurm"), world, world, on_gpus, spec["launcher"].get("local_gpus"))
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
        with folder_lock(cell_dir, spec["name"]), HostPool.from_config(None).hold(world, False, 1, log, driver.STOP):
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
            use_gpus=on_gpus,
            slurm=spec.get("slurm"),
            record=cell_dir / (SLURM_RECORD if kind == "slurm" else LOCAL_RECORD),
            identity={k: v for k, v in spec.items() if k not in ("launcher", "threads_per_rank")},
            extra_record={"cell": spec["cell"]},
            launcher=spec["launcher"],
        )
        kills_before = cgroup_oom_kills() if kind == "local" else None
        try:
            outcome = run_job(req, log, f"cell {spec['cell']}", log_path)
        except JobFailed as exc:
            payload = _host_memory_oom(exc, spec, kills_before, log)
            if payload is None:
                raise
            return payload
        payload = outcome.first or {}
        log(f"job {outcome.job_id} done: status={(payload.get('result') or {}).get('status')}")
        _materialise(payload, spec)
        _record_ranks(result_path, outcome.values, outcome.job_id)
    if not result_path.is_file():
        raise RuntimeError(f"cell {spec['cell']} finished but wrote no {result_path}; see {log_path}")
    return payload
