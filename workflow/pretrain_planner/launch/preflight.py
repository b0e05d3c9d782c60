"""The preflight (driver side): before a GPU type's first cell, one short job on its partition, in the site's
environment for it (its `python`, `container`, modules, env and setup lines: launch/slurm.py starts it as it starts
a cell's ranks), reports what a cell's job would find there (launch/probe.py); planning/preflight.py judges it.

An error stops the GPU type's cells with one message naming what is wrong and the site key that fixes it, before
any is measured; a passed preflight is the input of every cell of its type, which records its summary and
warnings. Its record is kept by digest (site entry + what the cells need + the environment as seen from the
driver): the rule runs again when that changes. results/site/preflight.md shows every GPU type's last preflight.
Imports no torch.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.launch import stage
from pretrain_planner.launch.rankjob import EntryJob
from pretrain_planner.launch.request import JobFailed, RuleLog
from pretrain_planner.planning.configtypes import Launch, LauncherSection
from pretrain_planner.planning.preflight import ERROR, WARNING, Expect, Finding, findings, markdown, summary
from pretrain_planner.results import atomic_write_text, read_json

PROBE = "pretrain_planner.launch.probe:probe"  # what the preflight's one task runs
JOB_PREFIX = "pp-preflight-"  # + the GPU type: the preflight job's name, apart from the cells' (pp-{model}-...)
TIME_LIMIT_MIN = 10  # a short job starts sooner (backfill); the probe takes seconds
# a job ended by these says nothing of the environment (someone cancelled it, its node failed): asked again, up to
# FAULT_ATTEMPTS jobs in all; a job that FAILED (its interpreter did not start) stops the GPU type at once
FAULT_STATES = {"CANCELLED", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "TIMEOUT"}
FAULT_ATTEMPTS = 3


class PreflightFailed(RuntimeError):
    """The site's environment for a GPU type cannot run its cells: its cells are not submitted."""


def _stderr_tail(folder: Path, job_id: str | None, lines: int = 4) -> str:
    """The last lines the job's task wrote to stderr (why a broken interpreter did not start)."""
    for path in sorted(folder.glob(f"{job_id}_0_log.err")) if job_id else []:
        text = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        return " | ".join(text[-lines:])[-600:]
    return ""


def write_markdown(results: str | Path) -> Path:
    """results/site/preflight.md from every GPU type's last preflight record (under a lock: the GPU types' rules
    run at once, each rewrites it)."""
    folder = Path(results) / layout.PREFLIGHT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    out = Path(results) / layout.PREFLIGHT_MD
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        records = [r for p in sorted(folder.glob("*.json")) if isinstance(r := read_json(p), dict) and "gpu_type" in r]
        atomic_write_text(out, markdown(records))
    return out


def _record(spec: dict[str, Any], job_id: str | None, report: dict[str, Any] | None, found: list[Finding],
            job_error: str | None) -> dict:  # fmt: skip
    return {
        "gpu_type": spec["gpu_type"],
        "digest": spec["digest"],
        "job_id": job_id,
        "checked_at": dt.datetime.now().isoformat(timespec="seconds"),
        "job_error": job_error,
        "errors": [f.line() for f in found if f.level == ERROR] + ([job_error] if job_error else []),
        "warnings": [f.line() for f in found if f.level == WARNING],
        "summary": summary(report, found) if report else None,
        "report": report,
    }


def run_preflight(spec: dict[str, Any], out_json: str | Path, log_path: str | Path) -> dict[str, Any]:
    """Run one GPU type's preflight job and judge it; write `out_json` when it passed, else raise PreflightFailed
    (and keep what it found in site/preflight/{gpu}.stopped.json). `spec`: the facade's preflight_spec."""
    log = RuleLog(log_path)
    gpu = spec["gpu_type"]
    expect = Expect(**{**spec["expect"], "catalog": tuple(spec["expect"]["catalog"])})
    out = Path(out_json)
    stopped = out.with_name(f"{gpu}{layout.PREFLIGHT_STOPPED}")
    workdir = out.parent / gpu
    settings = {**spec["slurm"], "time_limit_min": min(TIME_LIMIT_MIN, spec["slurm"]["time_limit_min"])}
    settings["signal_delay_s"] = min(settings["signal_delay_s"], 30)
    launch = Launch(LauncherSection.of_job(spec["launcher"]), settings, None)  # the spec's JSON, typed again
    job = EntryJob(PROBE, {"gpus_asked": expect.gpus_asked})
    log(f"preflight of {gpu}: one job on {settings.get('partition') or '(the default partition)'} asking "
        f"{expect.gpus_asked} GPU(s), {expect.cpus_per_gpu} core(s); cells need CUDA: {expect.needs_cuda}")  # fmt: skip
    t0, report, job_error, job_id = time.time(), None, None, None
    for attempt in range(1, FAULT_ATTEMPTS + 1):
        # each run of the rule asks anew (--forcerun, a changed site): a job recorded by an earlier run is not
        # re-used (one still queued, of a killed driver, is cancelled as a job of another identity)
        identity = {"preflight": spec["digest"], "run": dt.datetime.now().isoformat(), "attempt": attempt}
        req = stage.request(job, f"{JOB_PREFIX}{gpu}", launch, workdir, identity,
                            nodes=1, gpus_per_node=1, threads=expect.cpus_per_gpu)  # fmt: skip
        try:
            outcome = stage.run(req, log, f"preflight of {gpu}", log_path, [])
            report, job_id = outcome.first, outcome.job_id
            break
        except JobFailed as exc:
            job_id, state = exc.job_id, getattr(exc.state, "state", None)
            if state in FAULT_STATES and attempt < FAULT_ATTEMPTS:
                log(f"job {job_id} ended {state}: a fault, not the environment; asking again")
                continue
            tail = _stderr_tail(req.folder, exc.job_id)
            job_error = (f"its job {exc.job_id} did not start the site's python ({expect.python or sys.executable}"
                         f"{', in ' + expect.container if expect.container else ''}): {tail or exc}; set "
                         f"gpus.{gpu}.python (or container, modules, setup) in {expect.site}")  # fmt: skip
            break
    report = report if isinstance(report, dict) else None
    found = findings(report, expect) if report else []
    record = _record(spec, job_id, report, found, job_error)
    log(json.dumps(record, indent=1, default=str))
    if record["errors"]:
        atomic_write_text(stopped, json.dumps(record, indent=1) + "\n")
        md = write_markdown(spec["results"])
        raise PreflightFailed(f"preflight {gpu} ({time.time() - t0:.0f} s): no cell of {gpu} submitted: "
                              f"{' | '.join(record['errors'])} (see {md})")  # fmt: skip
    with suppress(FileNotFoundError):
        stopped.unlink()
    atomic_write_text(out, json.dumps(record, indent=1) + "\n")
    md = write_markdown(spec["results"])
    extra = f"; {len(record['warnings'])} warning(s) in {md}" if record["warnings"] else ""
    print(f"preflight {gpu}: passed on {(report or {}).get('node') or (report or {}).get('host')} "
          f"({time.time() - t0:.0f} s){extra}", file=sys.stderr, flush=True)  # fmt: skip
    return record
