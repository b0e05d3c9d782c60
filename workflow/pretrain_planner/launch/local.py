"""A job on this host: its devices held alone (hostpool), the folder locked while it runs, recorded so that a
restarted driver ends what a killed one left running, and a failing rank ending its peers at once (`run_local`,
submitit's LocalExecutor: one process per rank); or, for the debug launcher, one rank in the driver's own process
holding what a local job holds (`run_debug`: the folder lock, the host's devices, and this process's turn at
torch: `torch_job`). Imports no torch."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pretrain_planner.launch import driver, warm
from pretrain_planner.launch.hostpool import HostPool, alive, descendants, end_processes, start_time
from pretrain_planner.launch.rankjob import LOCAL_RECORD
from pretrain_planner.launch.request import JobFailed, JobRequest, Outcome, RuleLog
from pretrain_planner.launch.slurm import task_jobs
from pretrain_planner.results import atomic_write_text, read_json

LOCAL_RANKS = "local_ranks"  # each local rank's pid (job.RankJob writes them)
# Jobs of one Snakemake process (--force-use-threads) share torch's global RNG and thread settings: a torch job in
# the driver's process (the debug launcher, a test calling a stage function) takes its turn, so that each is
# deterministic given its seed.
TORCH_LOCK = threading.RLock()


@contextlib.contextmanager
def torch_job() -> Iterator[None]:
    """A torch job of this process: one at a time (TORCH_LOCK); a process group it leaves behind (a failed run's,
    or a one-rank sharded run's in-process group) is destroyed at its end."""
    with TORCH_LOCK:
        try:
            yield
        finally:
            import torch.distributed as torch_dist  # a torch job's, at run time: this module imports no torch

            if torch_dist.is_available() and torch_dist.is_initialized():
                torch_dist.destroy_process_group()


def _failed_task(job: Any, workdir: Path) -> int | None:
    """A task that failed while the job still runs: its result file says it raised, or its process is gone
    without one (killed). Local jobs only: submitit's controller waits for every task, and the peers of a
    failed rank would wait in a collective until the group's timeout (SLURM ends the step itself with
    --kill-on-bad-exit)."""
    from submitit.core.utils import pickle_load

    tasks = task_jobs(job)
    for i, t in enumerate(tasks):
        path = t.paths.result_pickle
        if path.exists():
            with contextlib.suppress(Exception):  # half-written: looked at again on the next poll
                if pickle_load(path)[0] == "error":
                    return i
    for f in (workdir / LOCAL_RANKS).glob("rank*.json"):
        r = read_json(f) or {}
        if str(r.get("job_id")) != str(job.job_id) or not r.get("pid"):
            continue
        i = int(f.stem[len("rank") :])
        if i < len(tasks) and not alive(int(r["pid"]), r.get("start")) and not tasks[i].paths.result_pickle.exists():
            time.sleep(1)  # a rank that just returned writes its result file as it exits
            if not tasks[i].paths.result_pickle.exists():
                return i
    return None


@contextlib.contextmanager
def folder_lock(workdir: Path, what: str):
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
    record = read_json(workdir / LOCAL_RECORD)
    if not record:
        return []
    if record.get("host", socket.gethostname()) != socket.gethostname():
        # its pids are another host's (a results folder shared between hosts): never end this host's namesakes
        if log is not None:
            log(f"a local job of a driver on host {record['host']} is recorded in {workdir}: not ended from here")
        return []
    procs: list[tuple[int, int | None]] = []
    ctl, ctl_start = record.get("controller_pid"), record.get("controller_start")
    if ctl and alive(int(ctl), ctl_start):
        procs += [(p, start_time(p)) for p in descendants(int(ctl))]
        procs.append((int(ctl), ctl_start))
    for f in sorted((workdir / LOCAL_RANKS).glob("rank*.json")):
        r = read_json(f) or {}
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
        data = read_json(rec) or {}
        if data.get("host", socket.gethostname()) != socket.gethostname():
            continue  # another host's job: its pids mean nothing here
        if data.get("driver_pid") and alive(int(data["driver_pid"]), data.get("driver_start")):
            continue  # its driver lives (refused by the driver lock anyway)
        with contextlib.suppress(RuntimeError), folder_lock(rec.parent, str(rec.parent)):
            if end_orphans(rec.parent):
                found.append(str(rec.parent))
    return found


def run_debug(req: JobRequest, log: RuleLog, what: str) -> Outcome:
    """The debug launcher: the job's callable, one rank, in this process, holding what a local job holds (its
    folder's lock, the host's devices, this process's torch turn)."""
    if req.world_size != 1:
        raise ValueError(f"{what}: the debug launcher runs one rank in the driver's process, not {req.world_size}")
    pool = HostPool.from_config(req.launcher.local_gpus)
    with folder_lock(req.workdir, what), pool.hold(1, req.use_gpus, req.cpu_threads, log, driver.STOP), torch_job():
        value = req.fn()
    log("finished in-process")
    return Outcome("in-process", [value])


def run_local(req: JobRequest, log: RuleLog, what: str, log_path: str | Path) -> Outcome:

    import submitit

    if req.nodes != 1:
        raise ValueError(f"{what}: the local launcher runs on one node, not {req.nodes}")
    workdir = req.workdir
    with folder_lock(workdir, what):
        end_orphans(workdir, log)
        pool = HostPool.from_config(req.launcher.local_gpus)
        with pool.hold(req.world_size, req.use_gpus, req.cpu_threads, log, driver.STOP) as place:
            # CPU ranks forked from a warm interpreter (launch/warm.py: ~4 s of imports each saved); GPU ones cold
            warm_on = req.launcher.warm_ranks and not place.gpus
            python = warm.server_command(log) if warm_on else None
            ex = submitit.LocalExecutor(folder=req.folder, max_num_timeout=req.max_num_timeout, python=python)
            ex.update_parameters(nodes=1, tasks_per_node=req.world_size, timeout_min=req.timeout_min,
                                 gpus_per_node=len(place.gpus), visible_gpus=tuple(place.gpus))  # fmt: skip
            req.fn.context = req.context(placement=place.to_dict())
            (workdir / LOCAL_RECORD).unlink(missing_ok=True)
            job = ex.submit(req.fn)
            ctl = job._process.pid if getattr(job, "_process", None) is not None else None
            me = os.getpid()
            record = {"job_id": job.job_id, "controller_pid": ctl, "controller_start": start_time(ctl) if ctl else None,
                      "driver_pid": me, "driver_start": start_time(me), "host": socket.gethostname(),
                      "folder": str(req.folder), "started_at": dt.datetime.now().isoformat(timespec="seconds"),
                      "placement": place.to_dict()}  # fmt: skip
            atomic_write_text(workdir / LOCAL_RECORD, json.dumps(record, indent=1) + "\n")
            log(f"submitted local job {job.job_id} ({req.world_size} processes); logs in {req.folder}")
            driver.register(req.name, kind="local", job_id=job.job_id, what=what)
            try:
                while not job.done():
                    if driver.STOP.is_set():
                        end_orphans(workdir, log)
                        raise driver.DriverStopped(f"{what}: local job {job.job_id} ended: the driver is stopping")
                    failed = _failed_task(job, workdir)
                    if failed is not None:  # its peers would wait in a collective until the group's timeout
                        log(f"rank {failed} of job {job.job_id} failed: ending the other ranks now")
                        log.append_file(f"rank {failed} stderr", task_jobs(job)[failed].paths.stderr)
                        end_orphans(workdir)
                        break
                    time.sleep(0.5)
                try:
                    values = job.results()
                except Exception as exc:
                    log(f"job {job.job_id} did not complete: {type(exc).__name__}: {str(exc)[:2000]}")
                    log.append_file("rank 0 stderr", job.paths.stderr)
                    died = not task_jobs(job)[0].paths.result_pickle.exists()
                    raise JobFailed(f"{what} failed in job {job.job_id}; see {log_path}", str(job.job_id), None,
                                    rank0_died=died) from exc  # fmt: skip
                finally:
                    log.append_file("rank 0 stdout", job.paths.stdout)
            finally:
                driver.unregister(req.name)
                (workdir / LOCAL_RECORD).unlink(missing_ok=True)
    return Outcome(str(job.job_id), list(values))
