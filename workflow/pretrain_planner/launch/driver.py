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
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pretrain_planner.launch.hostpool import alive, start_time

STOP = threading.Event()
RECORD = ".driver.json"
LOCKFILE = ".driver.lock"
HEARTBEAT_S = 20
STALE_S = 120  # a record from another host whose heartbeat is older than this belongs to a dead driver

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

_DRY = {"-n", "--dry-run", "--dryrun", "--dry_run"}
_NOT_EXECUTING = {
    "--unlock", "--lint", "--list", "-l", "--list-rules", "--list-target-rules", "--lt", "--summary", "-S",
    "--detailed-summary", "-D", "--report", "--dag", "--rulegraph", "--filegraph", "--d3dag", "--archive",
    "--cleanup-metadata", "--cm", "--list-changes", "--lc", "--list-input-changes", "--li", "--list-params-changes",
    "--lp", "--list-code-changes", "--list-version-changes", "--lv", "--delete-all-output", "--delete-temp-output",
    "--containerize", "--print-compilation", "--touch", "-t", "--cleanup-shadow", "--export-cwl",
    "--generate-unit-tests",
}  # fmt: skip


def executing(argv: list[str] | None = None) -> bool:
    """Whether this Snakemake invocation will run jobs (not a dry run, --unlock, --lint, --report ...).
    Read from the command line: Snakemake tells its Snakefile only after parsing it. Anything but the
    `snakemake` command line counts as not executing (nothing is changed on its behalf)."""
    argv = sys.argv if argv is None else argv
    if not argv or "snakemake" not in Path(argv[0]).name:
        return False
    for tok in argv[1:]:
        flag = tok.split("=", 1)[0]
        if flag in _DRY or flag in _NOT_EXECUTING:
            return False
        if re.fullmatch(r"-[A-Za-z]{2,}", tok) and "n" in tok[1:]:  # bundled short flags, e.g. -np
            return False
    return True


# ---------------------------------------------------------------- the lock


def _read(results: Path) -> dict[str, Any] | None:
    try:
        return json.loads((results / RECORD).read_text())
    except (OSError, ValueError):
        return None


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

    atomic_write_text(results / RECORD, json.dumps(rec, indent=1) + "\n")


def acquire(results: str | Path) -> None:
    """Become the driver of `results` (Snakemake's onstart): refuse if another is alive; hold the lock,
    keep a heartbeat, and stop promptly on SIGTERM / SIGINT."""
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    fh = open(results / LOCKFILE, "a")  # noqa: SIM115 - held for the driver's life
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        rec = _read(results) or {"pid": "?", "host": socket.gethostname()}
        raise SystemExit(busy_message(results, rec)) from None
    check(results)  # another host's driver (flock may not reach across a network file system)
    pid = os.getpid()
    rec = {
        "pid": pid, "pid_start": start_time(pid), "host": socket.gethostname(), "argv": sys.argv,
        "started_at": dt.datetime.now().isoformat(timespec="seconds"), "heartbeat": time.time(),
    }  # fmt: skip
    _write(results, rec)
    _HELD.update(results=results, file=fh, record=rec)
    beat = threading.Event()
    _HELD["beat"] = beat

    def heartbeat() -> None:
        while not beat.wait(HEARTBEAT_S):
            rec["heartbeat"] = time.time()
            with contextlib.suppress(OSError):
                _write(results, rec)

    threading.Thread(target=heartbeat, name="pp-driver-heartbeat", daemon=True).start()
    install_stop_handlers()


def release() -> None:
    """Give up the results folder (Snakemake's onsuccess / onerror)."""
    if not _HELD:
        return
    _HELD["beat"].set()
    rec = _read(_HELD["results"])
    if rec and rec.get("pid") == os.getpid() and rec.get("host") == socket.gethostname():
        (_HELD["results"] / RECORD).unlink(missing_ok=True)
    _HELD["file"].close()
    _HELD.clear()


# ---------------------------------------------------------------- a prompt stop


def stop_message() -> str:
    jobs = active()
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
    """Chain a handler before Snakemake's own on SIGTERM and SIGINT (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def handler(signum, frame, previous=previous):
            if not STOP.is_set():
                STOP.set()
                print(stop_message(), file=sys.stderr, flush=True)
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL and signum == signal.SIGINT:
                raise KeyboardInterrupt

        signal.signal(sig, handler)
