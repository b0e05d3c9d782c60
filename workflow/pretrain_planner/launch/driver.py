"""The one Snakemake driver working a results folder: its lock, a prompt stop on SIGTERM, the jobs it waits for.

- Two drivers on one results folder would measure cells twice and overwrite each other's files, and
  `snakemake --unlock` removes Snakemake's own lock without asking whether its owner is alive. So a driver
  records itself (pid, host, start) in `results/.driver.json`, holds `results/.driver.lock` (flock: freed
  by the kernel when the driver dies) and refreshes a heartbeat; a second driver refuses to start while the
  first is alive (same host: its pid; another host sharing the folder: a fresh heartbeat).
- On SIGTERM (or Ctrl-C) Snakemake waits for every running job; the jobs here wait on SLURM jobs that may
  run for hours. So the driver's own handler sets `STOP`: waiting cells stop at once, SLURM jobs are left
  queued (the next run re-attaches to them), local jobs are ended, and the driver says which.

Imports no torch.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pretrain_planner.launch.hostpool import alive, start_time
from pretrain_planner.results import read_json

STOP = threading.Event()
RECORD = ".driver.json"
LOCKFILE = ".driver.lock"
# seconds between heartbeats (PP_DRIVER_HEARTBEAT_S: tests); a record from another host whose heartbeat is older than
# STALE_S belongs to a dead driver - or to one that is stopped (SIGSTOP, a suspended VM), which gives up on waking
HEARTBEAT_S = float(os.environ.get("PP_DRIVER_HEARTBEAT_S") or 20)
STALE_S = 6 * HEARTBEAT_S

_ACTIVE: dict[str, dict[str, Any]] = {}  # what this driver waits for, by cell/job name
_ACTIVE_LOCK = threading.Lock()
_HELD: dict[str, Any] = {}


class DriverStopped(RuntimeError):
    """The driver was asked to stop while a job ran: the job is left (SLURM) or ended (local)."""


def register(key: str, **info: Any) -> None:
    with _ACTIVE_LOCK:
        _ACTIVE[key] = info


def unregister(key: str) -> None:
    with _ACTIVE_LOCK:
        _ACTIVE.pop(key, None)


def active() -> dict[str, dict[str, Any]]:
    with _ACTIVE_LOCK:
        return dict(_ACTIVE)


# ---------------------------------------------------------------- what kind of invocation this is


def executing(workflow: Any, executor_plugin: Any) -> bool:
    """Whether this Snakemake invocation runs jobs, as Snakemake itself knows it when it starts to execute: an
    executor is in effect that is neither the dry-run nor the touch one, in Snakemake's main process (a job's own
    Snakemake process is not a driver). `--unlock`, `--lint`, `--list`, `--report`, `--dag` ... never execute.
    The command line is not read: `python -m snakemake`, Snakemake's Python API and a profile that sets
    `dryrun:` say the same as the `snakemake` script."""
    if executor_plugin is None:
        return False
    settings = executor_plugin.common_settings
    if getattr(settings, "dryrun_exec", False) or getattr(settings, "touch_exec", False):
        return False
    return bool(workflow.is_main_process)


def guard(workflow: Any, results: str | Path, prepare: Callable[[bool], None]) -> None:
    """Make the driver's work part of Snakemake's own start of execution: `Workflow.execute` is the one call
    every way of running Snakemake makes (the CLI, `python -m snakemake`, the API), after the Snakefile was
    parsed and before the DAG is built, with the executor in effect. Wrapped here: when it will run jobs the
    driver takes the results folder (refusing if another driver lives) and holds it until execution ends;
    `prepare(executing)` runs before the DAG is built (the damaged-result repair, the orphan clean-up)."""
    original = workflow.execute

    def execute(*args: Any, **kwargs: Any) -> Any:
        if "executor_plugin" in kwargs:
            plugin = kwargs["executor_plugin"]
        elif args:
            plugin = args[0]
        else:
            raise RuntimeError(
                "pretrain-planner: Snakemake's Workflow.execute was called without an executor plugin; this "
                "Snakemake version is not supported (the driver lock cannot tell whether jobs will run)"
            )
        runs = executing(workflow, plugin)
        if runs:
            acquire(results)
        try:
            prepare(runs)
            return original(*args, **kwargs)
        finally:
            if runs:
                release()

    workflow.execute = execute


# ---------------------------------------------------------------- the lock


def _read(results: Path) -> dict[str, Any] | None:
    return read_json(results / RECORD)


def other_driver(results: str | Path) -> dict[str, Any] | None:
    """The record of another driver that is alive and works on `results`, else None."""
    results = Path(results)
    rec = _read(results)
    if not rec:
        return None
    here = socket.gethostname()
    if rec.get("host") == here:
        if rec.get("pid") == os.getpid():
            return None
        return rec if alive(int(rec.get("pid", -1)), rec.get("pid_start")) else None
    return rec if time.time() - float(rec.get("heartbeat", 0)) < STALE_S else None


def busy_message(results: str | Path, rec: dict[str, Any]) -> str:
    return (
        f"pretrain-planner: another driver is working on {results}: pid {rec.get('pid')} on host {rec.get('host')}, "
        f"started {rec.get('started_at')} ({' '.join(rec.get('argv', []))[:200]}). Two drivers would measure "
        f"cells twice and overwrite each other's files. Wait for it, or stop it (kill {rec.get('pid')} on "
        f"{rec.get('host')}: it leaves SLURM jobs queued for the next run to re-attach), then run again. "
        f"(`snakemake --unlock` removes Snakemake's lock only; it does not stop a live driver.)"
    )


def check(results: str | Path) -> None:
    """Refuse (SystemExit) when another live driver works on `results`."""
    rec = other_driver(results)
    if rec is not None:
        raise SystemExit(busy_message(results, rec))


def _write(results: Path, rec: dict[str, Any]) -> None:
    from pretrain_planner.results import atomic_write_text

    atomic_write_text(results / RECORD, json.dumps(rec, indent=1) + "\n", guarded=False)


def _lost(results: Path, rec: dict[str, Any]) -> None:
    """Another driver took the results folder while this one was stopped (its heartbeat went stale: SIGSTOP, a
    suspended machine). Two drivers must never write one folder: this one ends its own local jobs and leaves at
    once, writing nothing more (its SLURM jobs run on: the other driver re-attaches to them)."""
    from pretrain_planner.launch.hostpool import descendants, end_processes

    print(
        f"pretrain-planner: this driver (pid {os.getpid()} on {socket.gethostname()}) was stopped longer than "
        f"{STALE_S:g} s and another driver has taken over {results} (pid {rec.get('pid')} on host {rec.get('host')},"
        f" started {rec.get('started_at')}). Leaving now without writing anything; that driver carries on.",
        file=sys.stderr,
        flush=True,
    )
    me = os.getpid()
    with contextlib.suppress(Exception):
        end_processes([(p, start_time(p)) for p in descendants(me)])
    os._exit(75)


def owner_check(_path: Path | None = None) -> None:
    """Before this driver writes (results.WRITE_CHECKS): it must still own the results folder. A record that
    names another driver means it was taken over while this one was stopped: leave (`_lost`)."""
    held = _HELD.get("record")
    if held is None:
        return
    rec = _read(_HELD["results"])
    if rec is not None and rec.get("token") != held["token"]:
        _lost(_HELD["results"], rec)


def acquire(results: str | Path) -> None:
    """Become the driver of `results` (at the start of execution, `guard`): refuse if another is alive; hold the
    lock, keep a heartbeat, check before each write that no other driver took over."""
    import uuid

    from pretrain_planner.results import WRITE_CHECKS

    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    fh = open(results / LOCKFILE, "a")  # noqa: SIM115 - held for the driver's life
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        rec = _read(results) or {"pid": "?", "host": socket.gethostname()}
        raise SystemExit(busy_message(results, rec)) from None
    try:
        check(results)  # another host's driver (flock may not reach across a network file system)
    except SystemExit:
        fh.close()
        raise
    pid = os.getpid()
    rec = {
        "pid": pid, "pid_start": start_time(pid), "host": socket.gethostname(), "argv": sys.argv,
        "started_at": dt.datetime.now().isoformat(timespec="seconds"), "heartbeat": time.time(),
        "token": uuid.uuid4().hex,
    }  # fmt: skip
    _write(results, rec)
    _HELD.update(results=results, file=fh, record=rec)
    beat = threading.Event()
    _HELD["beat"] = beat
    WRITE_CHECKS.append(owner_check)

    def heartbeat() -> None:
        while not beat.wait(HEARTBEAT_S):
            owner_check()  # after a stop (SIGSTOP), another driver may have taken over meanwhile
            rec["heartbeat"] = time.time()
            with contextlib.suppress(OSError):
                _write(results, rec)

    threading.Thread(target=heartbeat, name="pp-driver-heartbeat", daemon=True).start()


def started() -> None:
    """Snakemake's onstart (its scheduler has installed its own SIGTERM handler by now): stop promptly on SIGTERM
    and SIGINT while this driver holds the results folder."""
    if _HELD:
        install_stop_handlers()


def release() -> None:
    """Give up the results folder (execution ended, however)."""
    from pretrain_planner.results import WRITE_CHECKS

    if not _HELD:
        return
    _HELD["beat"].set()
    with contextlib.suppress(ValueError):
        WRITE_CHECKS.remove(owner_check)
    rec = _read(_HELD["results"])
    if rec and rec.get("token") == _HELD["record"]["token"]:
        (_HELD["results"] / RECORD).unlink(missing_ok=True)
    _HELD["file"].close()
    _HELD.clear()


# ---------------------------------------------------------------- a prompt stop


def stop_message(jobs: dict[str, dict[str, Any]]) -> str:
    """What a stop leaves of `jobs` (what active() said when the stop came)."""
    slurm = [f"{k} (job {v.get('job_id')})" for k, v in jobs.items() if v.get("kind") == "slurm" and v.get("job_id")]
    local = [f"{k} (job {v.get('job_id')})" for k, v in jobs.items() if v.get("kind") == "local" and v.get("job_id")]
    lines = ["pretrain-planner: stopping on request; waiting cells end now."]
    if slurm:
        lines.append(f"  left queued on SLURM ({len(slurm)}), re-attached by the next run of the same command:")
        lines += [f"    {s}" for s in sorted(slurm)]
    if local:
        lines.append(f"  local jobs ended ({len(local)}; measured again by the next run):")
        lines += [f"    {s}" for s in sorted(local)]
    if not slurm and not local:
        lines.append("  no job was running.")
    return "\n".join(lines)


def install_stop_handlers() -> None:
    """Chain a handler before Snakemake's own on SIGTERM and SIGINT (main thread only).

    A signal handler runs in the main thread between two bytecodes, whatever that thread holds at the moment.
    Snakemake's SIGTERM handler (JobScheduler.exit_gracefully, 9.x) takes the scheduler's non-reentrant lock, which
    the main thread holds while it schedules: called from the handler it waits for ever on its own thread, and the
    driver never stops. A print to stderr from the handler can likewise land inside a write to stderr (a reentrant
    call). So the handler itself only sets STOP (waiting cells stop at once) and queues the rest (SimpleQueue.put is
    safe in a signal handler); the stop message and Snakemake's own handler run on a helper thread, which waits for
    the lock like any other thread. Ctrl-C without a handler of Snakemake's still raises KeyboardInterrupt in the
    main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    if _STOP_WORKER.ident is None:
        _STOP_WORKER.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if getattr(previous, "pp_stop_handler", False):
            continue  # installed already (a second onstart): chaining it again would run it off the main thread

        def handler(signum, frame, previous=previous):
            # the jobs waited for as the stop comes (a copy under the GIL, no lock): once STOP is set their threads
            # end and leave active() before the helper thread could ask it
            jobs = dict(_ACTIVE) if not STOP.is_set() else None
            STOP.set()
            chain = previous if callable(previous) and previous is not signal.default_int_handler else None
            _STOP_WORK.put((jobs, chain, signum))
            if previous is signal.default_int_handler or (previous == signal.SIG_DFL and signum == signal.SIGINT):
                raise KeyboardInterrupt

        handler.pp_stop_handler = True  # type: ignore[attr-defined]
        signal.signal(sig, handler)


_STOP_WORK: queue.SimpleQueue = queue.SimpleQueue()


def _after_stop() -> None:
    """What a stop signal does beyond setting STOP, off the signal handler (install_stop_handlers says why)."""
    while True:
        jobs, chain, signum = _STOP_WORK.get()
        if jobs is not None:  # the first stop signal
            print(stop_message(jobs), file=sys.stderr, flush=True)
        if chain is not None:
            try:
                chain(signum, None)
            except BaseException as e:  # noqa: BLE001 - the helper must outlive one handler's failure
                print(f"pretrain-planner: the stop handler before this one failed: {e!r}", file=sys.stderr, flush=True)


_STOP_WORKER = threading.Thread(target=_after_stop, name="pp-driver-stop", daemon=True)  # started by the first install
