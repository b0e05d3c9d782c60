"""Hand a job to an executor, wait for it, and make sure its result landed. Imports no torch.

`run_job` runs any picklable callable on a request's ranks (a benchmark cell, the budget stage's pre-training
or a GLUE fine-tune); `run_cell` is the benchmark cell's use of it.

Launchers: `slurm` (submitit SlurmExecutor: one job per cell, one task per GPU, the partition and GPU
request of the site file; re-attaches to a job recorded in the cell folder), `local` (submitit
LocalExecutor: one process per rank on this host, on devices it holds alone, see hostpool.py), and `debug`
(in the driver's own process, one rank: for tests; submitit's DebugExecutor is not used because it swaps
os.environ and opens pdb on failure, which breaks a threaded Snakemake driver).

What keeps one job per cell and every result honest:
- SLURM: the job's state comes from the controller (scontrol), which sees a requeue at once (after a node
  failure sacct says NODE_FAIL for a while, but the job is pending again); accounting (sacct) only once the
  controller has forgotten the job. A result already on disk is collected before anything is asked; a state
  nobody can tell (controller or accounting down) is waited for, never taken as "submit anew". sbatch is
  retried while the controller is unreachable. A job that replaces a recorded one cancels it first, and a
  job that is not the recorded one never writes the cell's outputs (trainer side).
- local: the cell's folder is locked while a job measures it; each job is recorded (controller pid and
  start time, rank pids) so that a restarted driver ends what a killed driver left running.
- every attempt's messages stay in the rule's log (Snakemake deletes it before each attempt).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import driver, progress
from .catalog import Catalog
from .grid import Cell
from .hostpool import HostPool, alive, cgroup_oom_kills, descendants, end_processes, start_time
from .job import LOCAL_RECORD, SLURM_RECORD, CellJob
from .results import atomic_write_text, write_result, write_steps
from .site import sbatch_parameters

JOB_RECORD = SLURM_RECORD
LOCAL_RANKS = "local_ranks"  # each local rank's pid (job.RankJob writes them)
# SLURM states (controller's view) in which a job may still deliver its result: wait, never resubmit.
LIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "COMPLETING", "CONFIGURING",
               "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "SPECIAL_EXIT", "STOPPED"}  # fmt: skip
# final states after which SLURM may still requeue the job (JobRequeue): give the controller a moment
SETTLING_STATES = {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}
SETTLE_S = 90
HISTORY_MAX = 400_000  # characters of earlier attempts kept at the top of a rule's log


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
        spec["slurm"] = {**site["gpus"][cell.gpu], "poll_max_s": site["poll_max_s"], "gpu_type": cell.gpu,
                         "site": site.get("path")}  # fmt: skip
    return spec


class RuleLog:
    """Timestamped lines in a rule's log file. Snakemake deletes the file before each attempt; the lines of
    earlier attempts are kept beside it (`.<name>.attempts`) and copied back at the top, so a retry never
    loses why the attempt before it failed."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.history = self.path.with_name(f".{self.path.name}.attempts")
        earlier = self.history.read_text(errors="replace")[-HISTORY_MAX:] if self.history.is_file() else ""
        stamp = dt.datetime.now().isoformat(timespec="seconds")
        head = f"===== attempt started {stamp}" + (" (earlier attempts above)" if earlier else "") + "\n"
        self.path.write_text(earlier + head)
        with self.history.open("w") as fh:
            fh.write(earlier + head)

    def _append(self, text: str) -> None:
        for p in (self.path, self.history):
            with p.open("a") as fh:
                fh.write(text)

    def __call__(self, msg: str) -> None:
        stamp = dt.datetime.now().isoformat(timespec="seconds")
        self._append(f"[{stamp}] {msg}\n")

    def append_file(self, title: str, path: Path) -> None:
        if path.is_file():
            self._append(f"----- {title}: {path}\n{path.read_text(errors='replace')[-20000:]}\n")


def threads_per_rank(
    kind: str,
    slurm: dict[str, Any] | None,
    threads: int,
    world: int,
    on_gpus: bool = False,
    local_gpus: int | None = None,
) -> int:
    """CPU threads for each rank: the site's CPUs per GPU under SLURM; locally a GPU's share of the host's
    cores for a rank on a GPU, else the rule's threads shared out (the `cpu` type: one core per rank)."""
    if kind == "slurm" and slurm:
        return int(slurm["cpus_per_gpu"])
    if kind == "local" and on_gpus:
        return HostPool.from_config(local_gpus).cores_per_gpu
    return max(1, threads // max(1, world))


def uses_gpus(gpu: str, device: str | None) -> bool:
    """Whether a job asks its launcher for GPUs: not for the `cpu` GPU type nor a run forced onto the CPU."""
    return gpu != "cpu" and device != "cpu"


def holds_gpus(gpu: str, device: str | None, local_gpus: int | None) -> bool:
    """Whether a local job takes GPUs from the host's pool: when it runs on them, and also when a pool is
    configured (`launcher.local_gpus`) for a GPU type forced onto the CPU (the pool's tests without a GPU)."""
    return gpu != "cpu" and (device != "cpu" or bool(local_gpus))


def _spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _world(spec: dict[str, Any]) -> int:
    return spec["cell"]["nodes"] * spec["cell"]["gpus_per_node"]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class JobRequest:
    """One job for the launcher: a picklable callable run once per rank (`nodes` x `gpus_per_node`).

    Cells and the budget stage's pre-training and fine-tuning all go through `run_job`, so each gets the
    same executors, GPU requests, requeue contract and re-attachment."""

    fn: Any  # a job.RankJob: picklable, requeued on preemption / time-out
    name: str  # SLURM job name
    kind: str  # local | slurm (debug runs the callable in the caller)
    folder: Path  # submitit's logs and pickles
    nodes: int = 1
    gpus_per_node: int = 1
    timeout_min: int = 60  # local executor's limit (SLURM: the site's time_limit_min)
    use_gpus: bool = False  # local executor: the job takes GPUs from the host's pool
    slurm: dict[str, Any] | None = None  # the site's settings for the job's GPU type (+ poll_max_s)
    record: Path | None = None  # slurm_job.json: lets a restarted driver re-attach
    identity: dict[str, Any] | None = None  # what the job computes: a recorded job of another identity is not reused
    max_num_timeout: int = 3  # requeues after a time-out that submitit allows (a long budget run needs more)
    extra_record: dict[str, Any] = field(default_factory=dict)
    launcher: dict[str, Any] = field(default_factory=dict)  # the config's launcher section (waits, local_gpus)
    cpu_threads: int = 1  # threads of each rank of a CPU job (a GPU rank gets its GPU's share of the cores)

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def workdir(self) -> Path:
        """The job's own folder (a cell's folder): its records and lock live here."""
        return (self.record or self.folder).parent

    def context(self, **more: Any) -> dict[str, Any]:
        slurm = dict(self.slurm or {})
        slurm["identity"] = _spec_hash(self.identity or {})
        return {"kind": self.kind, "workdir": str(self.workdir), "what": self.name, "slurm": slurm, **more}


class JobFailed(RuntimeError):
    """A job ended without every rank's result: which job, SLURM's final state, and whether rank 0 left no
    result at all (killed, e.g. by the kernel's out-of-memory killer)."""

    def __init__(self, msg: str, job_id: str, state: Any = None, rank0_died: bool = False) -> None:
        super().__init__(msg)
        self.job_id, self.state, self.rank0_died = job_id, state, rank0_died


@dataclass
class Outcome:
    job_id: str
    values: list[Any]  # every rank's returned value, rank 0 first

    @property
    def first(self) -> Any:
        return self.values[0] if self.values else None


# ---------------------------------------------------------------- SLURM


@dataclass
class SlurmState:
    state: str  # SLURM's state name, UNREACHABLE (nobody answered) or GONE (known to have left no trace)
    source: str  # controller | accounting | none
    restarts: int | None = None
    reason: str | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def known(self) -> bool:
        return self.state != "UNREACHABLE"


def _run(cmd: list[str], timeout: float = 30) -> tuple[int, str, str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 255, "", f"{type(exc).__name__}: {exc}"
    return out.returncode, out.stdout, out.stderr


def slurm_state(job_id: str) -> SlurmState:
    """The job's state: the controller's view while it knows the job, accounting's after it forgot it."""
    rc, out, err = _run(["scontrol", "show", "job", "-o", str(job_id)])
    if rc == 0 and "JobState=" in out:
        fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
        restarts = fields.get("Restarts")
        return SlurmState(fields["JobState"].upper(), "controller", int(restarts) if restarts and restarts.isdigit()
                          else None, fields.get("Reason"))  # fmt: skip
    if "invalid job id" not in (err + out).lower():
        return SlurmState("UNREACHABLE", "controller", reason=(err or out).strip()[:300])
    rc, out, err = _run(["sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "State"])
    if rc == 0:
        states = [ln.split()[0].upper() for ln in out.splitlines() if ln.strip()]
        if states:
            return SlurmState(states[-1], "accounting")
        return SlurmState("GONE", "accounting", reason="neither the controller nor accounting knows the job")
    if "accounting storage is disabled" in err.lower():
        return SlurmState("GONE", "none", reason="the controller forgot the job and this site keeps no accounting")
    return SlurmState("UNREACHABLE", "accounting", reason=err.strip()[:300])


def controller_up() -> bool:
    rc, out, _ = _run(["scontrol", "ping"], timeout=20)
    return rc == 0 and " is UP" in out


_TRANSIENT = ("unable to contact", "connect failure", "timed out", "temporarily unavailable", "zero bytes",
              "slurm_persist_conn", "communication connection failure", "try again", "backup controller")  # fmt: skip


def _task_jobs(job: Any) -> list[Any]:
    return list(job._sub_jobs) if getattr(job, "_sub_jobs", None) else [job]


def _failed_task(job: Any, workdir: Path) -> int | None:
    """A task that failed while the job still runs: its result file says it raised, or its process is gone
    without one (killed). Local jobs only: submitit's controller waits for every task, and the peers of a
    failed rank would wait in a collective until the group's timeout (SLURM ends the step itself with
    --kill-on-bad-exit)."""
    from submitit.core.utils import pickle_load

    tasks = _task_jobs(job)
    for i, t in enumerate(tasks):
        path = t.paths.result_pickle
        if path.exists():
            with contextlib.suppress(Exception):  # half-written: looked at again on the next poll
                if pickle_load(path)[0] == "error":
                    return i
    for f in (workdir / LOCAL_RANKS).glob("rank*.json"):
        r = _read_json(f) or {}
        if str(r.get("job_id")) != str(job.job_id) or not r.get("pid"):
            continue
        i = int(f.stem[len("rank") :])
        if i < len(tasks) and not alive(int(r["pid"]), r.get("start")) and not tasks[i].paths.result_pickle.exists():
            time.sleep(1)  # a rank that just returned writes its result file as it exits
            if not tasks[i].paths.result_pickle.exists():
                return i
    return None


def _pickles_done(job: Any) -> bool:
    return all(t.paths.result_pickle.exists() for t in _task_jobs(job))


def _collect(job: Any, what: str, log: RuleLog, log_path: str | Path, state: SlurmState | None = None) -> list[Any]:
    """Every task's returned value from its result pickle; raise with the first error otherwise."""
    from submitit.core.utils import pickle_load

    values, problems = [], []
    for i, t in enumerate(_task_jobs(job)):
        path = t.paths.result_pickle
        if not path.exists():
            problems.append(f"task {i} left no result (state {state.state if state else '?'})")
            values.append(None)
            continue
        try:
            outcome, value = pickle_load(path)
        except Exception as exc:  # noqa: BLE001 - a damaged pickle is a failed task
            problems.append(f"task {i}: unreadable result {path}: {exc}")
            values.append(None)
            continue
        if outcome != "success":
            problems.append(f"task {i} failed:\n{str(value)[-3000:]}")
        values.append(value if outcome == "success" else None)
    if problems:
        log(f"job {job.job_id} did not complete: " + "\n".join(problems)[:6000])
        log.append_file("rank 0 stderr", job.paths.stderr)
        log.append_file("rank 0 stdout", job.paths.stdout)
        raise JobFailed(f"{what} failed in job {job.job_id}; see {log_path}", str(job.job_id), state,
                        rank0_died=not _task_jobs(job)[0].paths.result_pickle.exists())  # fmt: skip
    log.append_file("rank 0 stdout", job.paths.stdout)
    return values


def _cancel(job_id: str, log: RuleLog, why: str) -> None:
    rc, _, err = _run(["scancel", str(job_id)])
    log(f"cancelled job {job_id} ({why})" if rc == 0 else f"scancel {job_id} failed: {err.strip()[:300]}")


def _ask_until_known(job_id: str, req: JobRequest, log: RuleLog) -> SlurmState:
    """The job's state; while nobody can tell it, wait and ask again (bounded by launcher.state_wait_min)."""
    wait_s = float(req.launcher.get("state_wait_min", 60)) * 60
    t0, said = time.time(), False
    while True:
        st = slurm_state(job_id)
        if st.known:
            return st
        if not said:
            log(f"job {job_id}: its state cannot be learned now ({st.reason}); waiting and asking again "
                f"(up to launcher.state_wait_min = {wait_s / 60:g} min; an unknown state never means submit "
                "anew)")  # fmt: skip
            said = True
        if time.time() - t0 > wait_s:
            raise RuntimeError(
                f"job {job_id}: its state could not be learned for {wait_s / 60:g} min ({st.reason}); the job was "
                "not submitted again. Run the same command when the controller and slurmdbd answer."
            )
        if driver.STOP.wait(min(30.0, 2 + (time.time() - t0) / 4)):
            raise driver.DriverStopped(f"driver stopping; job {job_id} left as it is")


def _reattach(req: JobRequest, log: RuleLog):
    """The recorded job if it can still deliver (or already did); else None (after cancelling it if it
    computes something else)."""
    import submitit

    if req.record is None or not req.record.is_file():
        return None
    record = _read_json(req.record)
    if not record or "job_id" not in record:
        log(f"{req.record} is unreadable: ignored")
        return None
    job_id = str(record["job_id"])
    job = submitit.SlurmJob(folder=record["folder"], job_id=job_id, tasks=tuple(range(req.world)))
    if record.get("spec_hash") != _spec_hash(req.identity or {}):
        st = slurm_state(job_id)
        if st.live or not st.known:
            _cancel(job_id, log, "it ran another spec: the config changed")
        else:
            log(f"recorded job {job_id} ran another spec (config changed): not re-attaching")
        return None
    if _pickles_done(job):
        log(f"job {job_id} finished while the driver was away: collecting its result")
        return job
    st = _ask_until_known(job_id, req, log)
    if st.live:
        log(f"re-attached to job {job_id} (state {st.state}) submitted at {record.get('submitted_at')}")
        return job
    log(f"recorded job {job_id} ended {st.state} without a result: submitting anew")
    return None


def _submit_slurm(req: JobRequest, log: RuleLog):
    import submitit

    settings = req.slurm
    if settings is None:
        raise ValueError(f"job {req.name}: the slurm launcher needs the site's settings for its GPU type")
    if req.record is not None:
        req.record.unlink(missing_ok=True)  # no job but the one submitted now may write the outputs
    submitit.SlurmJob.watcher._delay_s = settings["poll_max_s"]  # one shared sacct poll for all jobs
    ex = submitit.SlurmExecutor(folder=req.folder, max_num_timeout=req.max_num_timeout)
    params = sbatch_parameters(settings, req.nodes, req.gpus_per_node, req.name)
    ex.update_parameters(**params)
    req.fn.context = req.context()
    wait_s = float(req.launcher.get("submit_wait_min", 15)) * 60
    t0, attempt = time.time(), 0
    while True:
        attempt += 1
        try:
            job = ex.submit(req.fn)
            break
        except Exception as exc:  # noqa: BLE001 - sbatch's errors come as several exception types
            msg = f"{type(exc).__name__}: {exc}".strip()
            up = controller_up()
            transient = not up or any(t in msg.lower() for t in _TRANSIENT)
            log(
                f"sbatch attempt {attempt} failed ({'controller up' if up else 'controller unreachable'}): {msg[:3000]}"
            )
            if not transient:
                raise RuntimeError(f"job {req.name}: sbatch refused it: {msg[:500]}") from exc
            if time.time() - t0 > wait_s:
                raise RuntimeError(
                    f"job {req.name}: sbatch failed for {wait_s / 60:g} min (launcher.submit_wait_min); last error: "
                    f"{msg[:500]}"
                ) from exc
            if driver.STOP.wait(min(60.0, 5.0 * 2 ** (attempt - 1))):
                raise driver.DriverStopped("driver stopping: nothing submitted") from exc
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


def _wait_slurm(job: Any, req: JobRequest, log: RuleLog) -> SlurmState | None:
    """Wait until the job has ended for good (a requeue is not an end); the final state, or None when every
    task's result is already on disk."""
    poll_max = float((req.slurm or {}).get("poll_max_s", 60))
    poll, last, settling_since = 1.0, None, None
    while True:
        if _pickles_done(job):
            return None
        if driver.STOP.is_set():
            log(f"driver stopping: job {job.job_id} left queued; the next run of the same command re-attaches to it")
            raise driver.DriverStopped(f"job {job.job_id} left queued")
        st = slurm_state(job.job_id)
        seen = (st.state, st.restarts)
        if seen != last:
            extra = f", requeued {st.restarts} time(s)" if st.restarts else ""
            log(
                f"job {job.job_id}: {st.state} ({st.source}{extra}"
                f"{'; ' + st.reason if st.reason and st.reason != 'None' else ''})"
            )
            last = seen
        if not st.known:
            st = _ask_until_known(job.job_id, req, log)
        if st.live:
            settling_since = None
        elif st.state in SETTLING_STATES and st.source == "controller":
            settling_since = settling_since or time.time()
            if time.time() - settling_since > SETTLE_S:
                return st
        elif st.state != "UNREACHABLE":
            end = time.time() + 15  # the result pickles may lag on a shared file system
            while time.time() < end and not _pickles_done(job):
                time.sleep(1)
            return st
        if driver.STOP.wait(poll):
            continue
        poll = min(poll_max, poll * 1.5)


def _run_slurm(req: JobRequest, log: RuleLog, what: str, log_path: str | Path) -> Outcome:
    identity = _spec_hash(req.identity or {})
    verdict = progress.verdict_for(req.workdir, identity, req.slurm)
    if verdict is not None:
        log(f"not submitted again: {verdict['reason']}")
        raise RuntimeError(f"{what}: {verdict['reason']}")
    job = _reattach(req, log) or _submit_slurm(req, log)
    driver.register(req.name, kind="slurm", job_id=job.job_id, what=what)
    try:
        state = _wait_slurm(job, req, log)
        try:
            values = _collect(job, what, log, log_path, state)
        except RuntimeError:
            verdict = _read_json(req.workdir / progress.VERDICT)
            if verdict and str(verdict.get("job_id")) == str(job.job_id):
                log(f"not requeued: {verdict['reason']}")
                raise RuntimeError(f"{what}: {verdict['reason']}") from None
            raise
    finally:
        driver.unregister(req.name)
    return Outcome(str(job.job_id), values)


# ---------------------------------------------------------------- local


@contextlib.contextmanager
def _folder_lock(workdir: Path, what: str):
    """Only one job measures a folder at a time (also across drivers; freed when the holder dies)."""
    workdir.mkdir(parents=True, exist_ok=True)
    fh = open(workdir / ".job.lock", "a")  # noqa: SIM115 - held for the job
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise RuntimeError(f"{what}: another process is running a job in {workdir} (its .job.lock is held)") from None
    try:
        yield
    finally:
        fh.close()


def end_orphans(workdir: Path, log: Any = None) -> list[int]:
    """End what a local job recorded in `workdir` left running (its driver was killed): the controller, its
    children and the ranks. Returns the pids ended."""
    record = _read_json(workdir / LOCAL_RECORD)
    if not record:
        return []
    procs: list[tuple[int, int | None]] = []
    ctl, ctl_start = record.get("controller_pid"), record.get("controller_start")
    if ctl and alive(int(ctl), ctl_start):
        procs += [(p, start_time(p)) for p in descendants(int(ctl))]
        procs.append((int(ctl), ctl_start))
    for f in sorted((workdir / LOCAL_RANKS).glob("rank*.json")):
        r = _read_json(f) or {}
        if r.get("pid") and str(r.get("job_id")) == str(record.get("job_id")):
            procs.append((int(r["pid"]), r.get("start")))
    ended = end_processes(procs)
    if ended and log is not None:
        log(f"ended a measurement left running by an earlier driver (job {record.get('job_id')}, driver pid "
            f"{record.get('driver_pid')}): pids {', '.join(map(str, ended))}")  # fmt: skip
    (workdir / LOCAL_RECORD).unlink(missing_ok=True)
    return ended


def end_all_orphans(results: str | Path) -> list[str]:
    """At a driver's start: end every local job an earlier, killed driver left running under `results`
    (before anything is measured: an orphan would share the devices of a new measurement)."""
    found = []
    for rec in Path(results).glob(f"**/{LOCAL_RECORD}"):
        data = _read_json(rec) or {}
        if data.get("driver_pid") and alive(int(data["driver_pid"]), data.get("driver_start")):
            continue  # its driver lives (refused by the driver lock anyway)
        with contextlib.suppress(RuntimeError), _folder_lock(rec.parent, str(rec.parent)):
            if end_orphans(rec.parent):
                found.append(str(rec.parent))
    return found


def _run_local(req: JobRequest, log: RuleLog, what: str, log_path: str | Path) -> Outcome:
    import os

    import submitit

    if req.nodes != 1:
        raise ValueError(f"{what}: the local launcher runs on one node, not {req.nodes}")
    workdir = req.workdir
    with _folder_lock(workdir, what):
        end_orphans(workdir, log)
        pool = HostPool.from_config(req.launcher.get("local_gpus"))
        with pool.hold(req.world, req.use_gpus, req.cpu_threads, log, driver.STOP) as place:
            ex = submitit.LocalExecutor(folder=req.folder, max_num_timeout=req.max_num_timeout)
            ex.update_parameters(nodes=1, tasks_per_node=req.world, timeout_min=req.timeout_min,
                                 gpus_per_node=len(place.gpus), visible_gpus=tuple(place.gpus))  # fmt: skip
            req.fn.context = req.context(placement=place.to_dict())
            (workdir / LOCAL_RECORD).unlink(missing_ok=True)
            job = ex.submit(req.fn)
            ctl = job._process.pid if getattr(job, "_process", None) is not None else None
            me = os.getpid()
            record = {"job_id": job.job_id, "controller_pid": ctl, "controller_start": start_time(ctl) if ctl else None,
                      "driver_pid": me, "driver_start": start_time(me), "folder": str(req.folder),
                      "started_at": dt.datetime.now().isoformat(timespec="seconds"),
                      "placement": place.to_dict()}  # fmt: skip
            atomic_write_text(workdir / LOCAL_RECORD, json.dumps(record, indent=1) + "\n")
            log(f"submitted local job {job.job_id} ({req.world} processes); logs in {req.folder}")
            driver.register(req.name, kind="local", job_id=job.job_id, what=what)
            try:
                while not job.done():
                    if driver.STOP.is_set():
                        end_orphans(workdir, log)
                        raise driver.DriverStopped(f"{what}: local job {job.job_id} ended: the driver is stopping")
                    failed = _failed_task(job, workdir)
                    if failed is not None:  # its peers would wait in a collective until the group's timeout
                        log(f"rank {failed} of job {job.job_id} failed: ending the other ranks now")
                        log.append_file(f"rank {failed} stderr", _task_jobs(job)[failed].paths.stderr)
                        end_orphans(workdir)
                        break
                    time.sleep(0.5)
                try:
                    values = job.results()
                except Exception as exc:
                    log(f"job {job.job_id} did not complete: {type(exc).__name__}: {str(exc)[:2000]}")
                    log.append_file("rank 0 stderr", job.paths.stderr)
                    died = not _task_jobs(job)[0].paths.result_pickle.exists()
                    raise JobFailed(f"{what} failed in job {job.job_id}; see {log_path}", str(job.job_id), None,
                                    rank0_died=died) from exc  # fmt: skip
                finally:
                    log.append_file("rank 0 stdout", job.paths.stdout)
            finally:
                driver.unregister(req.name)
                (workdir / LOCAL_RECORD).unlink(missing_ok=True)
    return Outcome(str(job.job_id), list(values))


def run_job(req: JobRequest, log: RuleLog, what: str, log_path: str | Path) -> Outcome:
    """Submit (or re-attach to) the job, wait for every rank; every rank's value; raise if it failed."""
    if req.kind == "slurm":
        return _run_slurm(req, log, what, log_path)
    if req.kind == "local":
        return _run_local(req, log, what, log_path)
    raise ValueError(f"unknown launcher {req.kind!r} (allowed: local, debug, slurm)")


# ---------------------------------------------------------------- a benchmark cell


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
    from .aggregate import parse_result

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
    data = _read_json(result_path)
    if not ranks or not isinstance(data, dict) or not isinstance(data.get("devices"), dict):
        return
    data["devices"]["ranks"] = ranks
    atomic_write_text(result_path, json.dumps(data, indent=1) + "\n")


def run_cell(spec: dict[str, Any], log_path: str, threads: int = 1) -> dict[str, Any]:
    """Run one cell to completion with the configured launcher; raise if it crashed (Snakemake retries)."""
    kind = spec["launcher"]["kind"]
    world = _world(spec)
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
        with _folder_lock(cell_dir, spec["name"]), HostPool.from_config(None).hold(world, False, 1, log, driver.STOP):
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
            record=cell_dir / (JOB_RECORD if kind == "slurm" else LOCAL_RECORD),
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
