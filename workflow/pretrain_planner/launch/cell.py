"""A benchmark cell's job: `run_cell` (driver side, the `benchmark_cell` rule) hands `CellJob` to the one stage
launcher (launch/stage.py) and makes sure the cell's result landed; `CellJob` runs on every rank and measures
(trainer/run.py, named by its entry: the launcher stays below the trainer). Imports no torch.

The driver keeps the cell's state record (launch.state: submitted, running, done, failed, with job ids and
times), copies rank 0's progress lines into cell.log while the job runs, and prints one line per finished
cell on the console."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.launch import driver, neighbours, progress, stage
from pretrain_planner.launch.hostpool import cgroup_oom_kills
from pretrain_planner.launch.rankjob import RankJob, entry, global_rank, job_id_here
from pretrain_planner.launch.request import JobFailed, Outcome, RuleLog
from pretrain_planner.launch.state import StateRecord
from pretrain_planner.planning.configtypes import BenchmarkSection, Launch
from pretrain_planner.results import (
    atomic_write_text,
    parse_result,
    read_json,
    throughput_text,
    write_result,
    write_steps,
)

MEASURE = "pretrain_planner.trainer.run:run_rank"  # what every rank of a cell's job runs

FOLLOW_S = 0.5  # how often the driver looks for the job's id and rank 0's new progress lines
FOLLOW_READS_PER_S = 20  # progress files read per second at most, every live cell together


class CellJob(RankJob):
    """Measure one cell. On preemption or time-out submitit calls `checkpoint`, which requeues this same
    callable: a benchmark restarts cleanly from its first step."""

    def __init__(self, spec: dict[str, Any], progress_file: str | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.progress_file = progress_file  # rank 0 appends its progress here (the driver copies it to cell.log)

    def run(self) -> dict[str, Any]:
        run_rank = entry(MEASURE)  # torch is imported here, on the compute side only
        mine = getattr(self, "progress_file", None) if global_rank() == 0 else None
        context = {**(getattr(self, "context", None) or {}), "progress_file": mine}
        if mine:
            progress.report_to(mine)
            job = job_id_here() or "in-process"
            progress.mark(0, f"rank 0 started on {socket.gethostname()} (pid {os.getpid()}, job {job})", always=True)
        start = neighbours.look()  # this rank's node and cores; the first rank of a node: the node's other jobs
        try:
            out = run_rank({**self.spec, "launch_context": context})
            if isinstance(out, dict):
                out["placement"] = neighbours.placement(start, neighbours.look())
            if mine and isinstance(out, dict) and out.get("result"):
                progress.mark(0, f"rank 0 finished: status {out['result'].get('status')}", always=True)
            return out
        finally:
            if mine:
                progress.report_to(None)


def _materialise(payload: dict[str, Any], spec: dict[str, Any]) -> None:
    """Write rank 0's result from the job's returned value if the files are not there (a job that
    finished while the driver was down: Snakemake removed its outputs as incomplete)."""
    result, steps = Path(spec["outputs"]["result"]), Path(spec["outputs"]["steps"])
    if payload.get("result") and not (result.is_file() and steps.is_file()):
        write_steps(steps, payload.get("steps", []))
        write_result(result, payload["result"])


def _host_memory_oom(
    exc: JobFailed, spec: dict[str, Any], launch: Launch, kills_before: int | None, log: RuleLog
) -> dict[str, Any] | None:
    """A job that failed because the kernel killed a rank for host memory is an `oom` result, not a crash to
    retry: rank 0 wrote it before the job failed (a peer was killed), or the driver writes it (rank 0 was
    killed: SLURM says OUT_OF_MEMORY, or this host's cgroup counted an out-of-memory kill meanwhile)."""
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
              "slurm_job_id": exc.job_id if launch.kind == "slurm" else None,
              "submitit_job_id": exc.job_id}  # fmt: skip
    write_steps(spec["outputs"]["steps"], [])
    write_result(result_path, result)
    log(f"job {exc.job_id}: {why}: recorded as oom (a result, not retried)")
    return {"result": result}


def _record_ranks(result_path: Path, values: list[Any], preflight: dict[str, Any] | None,
                  shared_by_design: bool = False) -> dict[str, Any] | None:  # fmt: skip
    """Add every rank's own view of its devices to result.json (rank 0 wrote its own), the summary of the preflight
    its GPU type passed before it (SLURM): which environment, node and warnings it was measured under, and where its
    ranks ran beside whom (launch/neighbours.py: an ok cell measured beside other jobs becomes noisy unless the
    site's nodes are shared by design). The result as written."""
    ranks = [v.get("devices") for v in values if isinstance(v, dict) and v.get("devices")]
    placements = [v["placement"] for v in values if isinstance(v, dict) and v.get("placement")]
    data = read_json(result_path)
    if not isinstance(data, dict):
        return None
    if ranks and isinstance(data.get("devices"), dict):
        data["devices"]["ranks"] = ranks
    if preflight is not None:
        data["preflight"] = preflight
    if placements:
        data = neighbours.judge(data, placements, shared_by_design)
    atomic_write_text(result_path, json.dumps(data, indent=1) + "\n")
    return data


def _preflight_summary(paths: list[str] | None) -> dict[str, Any] | None:
    """The cell's GPU type's passed preflight (launch/preflight.py), as every cell records it."""
    for path in paths or []:
        record = read_json(path)
        if isinstance(record, dict):
            return {**(record.get("summary") or {}), "checked_at": record.get("checked_at"), "file": str(path)}
    return None


class _Follow:
    """While the job runs, from the driver: its id once the launcher has one (driver.active), what it waits for
    before it is queued, and rank 0's new progress lines copied into the cell's log (the first one marks the cell
    running). Polled by the driver's one follower thread (`_Followers`), never a thread per cell."""

    def __init__(self, name: str, record: StateRecord, progress_file: Path, log: RuleLog) -> None:
        self.key, self.record, self.path, self.log = name, record, progress_file, log
        self.offset = 0
        self._lock = threading.Lock()  # the follower thread's poll and the final one never overlap

    def start(self) -> None:
        FOLLOWERS.add(self)

    def poll(self) -> None:
        with self._lock:
            info = driver.active().get(self.key) or {}
            job_id = info.get("job_id")
            if info.get("waiting") != self.record.data.get("waiting") and self.record.state == "submitted":
                self.record.update(waiting=info.get("waiting"))  # what it waits for before it is queued, or None
            if job_id is not None and str(job_id) != self.record.data["job_id"]:
                # a job re-attached to that was running when the last driver left is running still
                self.record.update("running" if self.record.was_running(job_id) else None, job_id=job_id)
            lines, self.offset = progress.read_lines(self.path, self.offset)
            for line in lines:
                self.log(f"progress: {progress.describe(line)}")
            if lines and self.record.state == "submitted":
                self.record.update("running")

    def finish(self) -> None:
        FOLLOWERS.remove(self)
        self.poll()


class _Followers:
    """The driver's one thread that polls every live cell's follower: FOLLOW_S apart while few cells run, and never
    more than FOLLOW_READS_PER_S progress files read per second whatever their number (a sweep of hundreds of
    waiting cells on a shared file system)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._live: dict[int, _Follow] = {}
        self._thread: threading.Thread | None = None

    def add(self, follow: _Follow) -> None:
        with self._cond:
            self._live[id(follow)] = follow
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="pp-follow", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def remove(self, follow: _Follow) -> None:
        with self._cond:
            self._live.pop(id(follow), None)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._live:
                    self._cond.wait(5.0)
                live = list(self._live.values())
            t0 = time.time()
            for follow in live:
                try:
                    follow.poll()
                except Exception as exc:  # noqa: BLE001 - one cell's unreadable file must not stop the others'
                    follow.log(f"following the job failed once: {type(exc).__name__}: {exc}")
            time.sleep(max(0.0, max(FOLLOW_S, len(live) / FOLLOW_READS_PER_S) - (time.time() - t0)))


FOLLOWERS = _Followers()


def error_text(exc: BaseException) -> str:
    """What went wrong, on one line, for the state record and the console."""
    if isinstance(exc, JobFailed):
        text = f"job {exc.job_id} did not complete"
        state = getattr(exc.state, "state", None)
        if state:
            text += f" (SLURM state {state})"
        cause = exc.__cause__
        text += f": {type(cause).__name__}: {cause}" if cause is not None else f": {exc}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:600]


def cell_line(cell: dict[str, Any], result: dict[str, Any] | None, error: str | None, seconds: float,
              attempt: int = 1) -> str:  # fmt: skip
    """The console's one line for a finished cell: status, micro-batch, step time, throughput, or why not."""
    name = f"{layout.setting_folder(cell['model'], cell['gpu'], cell['nodes'], cell['gpus_per_node'])}/{cell['method']}"
    took = f"{seconds:.0f} s" + (f", attempt {attempt}" if attempt > 1 else "")
    if result is None:
        return f"cell {name}: failed ({took}): {(error or 'no result')[:300]}"
    status, parts = result.get("status"), []
    if status in ("ok", "noisy"):
        micro_batch, accum = result.get("micro_batch"), result.get("grad_accum_steps")
        parts.append(f"micro-batch {micro_batch}" + (f" x {accum}" if accum and accum > 1 else ""))
        if result.get("step_time_s") is not None:
            parts.append(f"step {result['step_time_s']:.4g} s")
        if throughput_text(result):
            parts.append(throughput_text(result))
    if status != "ok" and result.get("reason"):
        parts.append(" ".join(str(result["reason"]).split())[:200])
    if result.get("suspect"):
        parts.append(f"suspect: {result.get('suspect_reason')}"[:200])
    return f"cell {name}: {status}" + (f", {', '.join(parts)}" if parts else "") + f" ({took})"


def _launch(spec: dict[str, Any], launch: Launch, log: RuleLog, log_path: str, on_gpus: bool, per_rank: int,
            progress_file: Path, preflight: dict[str, Any] | None = None,
            ) -> tuple[dict[str, Any], str | None]:  # fmt: skip
    """Run the cell's job with its launcher (`launch`: the spec's, typed at run_cell): (rank 0's payload, the job's
    id; None in-process)."""
    result_path = Path(spec["outputs"]["result"])
    c = spec["cell"]
    req = stage.request(
        CellJob(spec, str(progress_file)), spec["name"], launch, result_path.parent,
        {k: v for k, v in spec.items() if k not in ("launcher", "threads_per_rank")}, nodes=c["nodes"],
        gpus_per_node=c["gpus_per_node"], on_gpus=on_gpus, threads=per_rank, extra_record={"cell": c},
    )  # fmt: skip
    kills_before = cgroup_oom_kills() if req.kind == "local" else None

    def collect(outcome: Outcome) -> None:
        _materialise(outcome.first or {}, spec)

    try:
        outcome = stage.run(req, log, f"cell {c}", log_path, [result_path], collect)
    except JobFailed as exc:
        payload = _host_memory_oom(exc, spec, launch, kills_before, log)
        if payload is None:
            raise
        return payload, exc.job_id
    payload = outcome.first or {}
    log(f"job {outcome.job_id} done: status={(payload.get('result') or {}).get('status')}")
    if req.kind == "debug":
        return payload, None
    written = _record_ranks(result_path, outcome.values, preflight, bool((spec.get("slurm") or {}).get("shared_nodes")))
    if written is not None and payload.get("result"):
        payload = {**payload, "result": {**payload["result"], **{k: written.get(k) for k in ("status", "reason")}}}
    return payload, outcome.job_id


def run_cell(
    spec: dict[str, Any], log_path: str, threads: int = 1, preflight: list[str] | None = None
) -> dict[str, Any]:
    """Run one cell to completion with the configured launcher; raise if it crashed (Snakemake retries).
    Its state record says where it stands at every point; one line on the console says how it ended. `preflight`:
    its GPU type's passed preflight record (SLURM), which its result records."""
    launch, benchmark = Launch.of_job(spec), BenchmarkSection.of_job(spec["benchmark"])  # its JSON, typed again
    kind = launch.kind
    world = spec["cell"]["nodes"] * spec["cell"]["gpus_per_node"]
    gpu, device = spec["cell"]["gpu"], benchmark.device
    # a `cpu` rank: one core (its stand-in for a GPU); a GPU rank: its GPU's share of the cores
    on_gpus, per_rank = stage.placement(launch, gpu, device, world, world)
    spec = {
        **spec,
        "threads_per_rank": per_rank,
        "outputs": {k: str(Path(v).resolve()) for k, v in spec["outputs"].items()},
    }
    result_path = Path(spec["outputs"]["result"])
    cell_dir = result_path.parent
    log = RuleLog(log_path)
    record = StateRecord(cell_dir, kind, Path(log_path).name)
    earlier = record.previous_note()
    if earlier:
        log(f"state record: {earlier}")
    log(f"cell {json.dumps(spec['cell'])} launcher={kind} ranks={world} threads/rank={per_rank} "
        f"attempt={record.data['attempt']}")  # fmt: skip
    progress_file = cell_dir / progress.PROGRESS_FILE
    progress_file.unlink(missing_ok=True)  # a re-attached job's rank 0 starts it again with its next line
    record.update("submitted")
    follow = _Follow(spec["name"], record, progress_file, log)
    follow.start()
    t0 = time.time()
    try:
        payload, job_id = _launch(
            spec, launch, log, log_path, on_gpus, per_rank, progress_file, _preflight_summary(preflight)
        )
        if not result_path.is_file():
            raise RuntimeError(f"cell {spec['cell']} finished but wrote no {result_path}; see {log_path}")
    except Exception as exc:
        follow.finish()
        if isinstance(exc, JobFailed):
            record.update(job_id=exc.job_id)
        if isinstance(exc, driver.DriverStopped) and kind == "slurm":
            record.update(note=f"the driver stopped at {time.strftime('%Y-%m-%dT%H:%M:%S')}: {exc}")
        else:  # a local job was ended with its driver: nothing runs any more
            record.update("failed", error=error_text(exc))
        print(cell_line(spec["cell"], None, error_text(exc), time.time() - t0, record.data["attempt"]),
              file=sys.stderr, flush=True)  # fmt: skip
        raise
    follow.finish()
    result = payload.get("result") or {}
    record.update("done", job_id=job_id, result_status=result.get("status"))
    print(cell_line(spec["cell"], result, None, time.time() - t0, record.data["attempt"]), file=sys.stderr, flush=True)
    return payload
