"""A job on SLURM: submitted by submitit (with back-off while the controller is unreachable), its state read
from the controller while it knows the job and from accounting after (a requeue is not an end; an unknown
state is waited for, never taken as "submit anew"), re-attached after a driver restart, its ranks' results
collected from disk. Imports no torch."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pretrain_planner.launch import driver, pending, progress
from pretrain_planner.launch.rankjob import SLURM_RECORD
from pretrain_planner.launch.request import JobFailed, JobRequest, Outcome, RuleLog, spec_hash
from pretrain_planner.planning.site import rank_python, sbatch_parameters
from pretrain_planner.results import atomic_write_text, before_write, read_json
from pretrain_planner.schema import section

JOB_RECORD = SLURM_RECORD
# SLURM states (controller's view) in which a job may still deliver its result: wait, never resubmit.
LIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "COMPLETING", "CONFIGURING",
               "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "SPECIAL_EXIT", "STOPPED"}  # fmt: skip


# final states after which SLURM may still requeue the job (JobRequeue): give the controller a moment
SETTLING_STATES = {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}


SETTLE_S = 90


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


def task_jobs(job: Any) -> list[Any]:
    return list(job._sub_jobs) if getattr(job, "_sub_jobs", None) else [job]


def _pickles_done(job: Any) -> bool:
    return all(t.paths.result_pickle.exists() for t in task_jobs(job))


def _collect(job: Any, what: str, log: RuleLog, log_path: str | Path, state: SlurmState | None = None) -> list[Any]:
    """Every task's returned value from its result pickle; raise with the first error otherwise."""
    from submitit.core.utils import pickle_load

    values, problems = [], []
    for i, t in enumerate(task_jobs(job)):
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
                        rank0_died=not task_jobs(job)[0].paths.result_pickle.exists())  # fmt: skip
    log.append_file("rank 0 stdout", job.paths.stdout)
    return values


def _cancel(job_id: str, log: RuleLog, why: str) -> None:
    rc, _, err = _run(["scancel", str(job_id)])
    log(f"cancelled job {job_id} ({why})" if rc == 0 else f"scancel {job_id} failed: {err.strip()[:300]}")


def _ask_until_known(job_id: str, req: JobRequest, log: RuleLog) -> SlurmState:
    """The job's state; while nobody can tell it, wait and ask again (bounded by launcher.state_wait_min)."""
    wait_s = float(section("config", "launcher", req.launcher)["state_wait_min"]) * 60
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
    record = read_json(req.record)
    if not record or "job_id" not in record:
        log(f"{req.record} is unreadable: ignored")
        return None
    job_id = str(record["job_id"])
    job = submitit.SlurmJob(folder=record["folder"], job_id=job_id, tasks=tuple(range(req.world_size)))
    if record.get("spec_hash") != spec_hash(req.identity or {}):
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
    if st.state == "TIMEOUT" and getattr(req.fn, "restartable", False):
        raise RuntimeError(_ran_out_of_time(req, job_id, log))
    log(f"recorded job {job_id} ended {st.state} without a result: submitting anew")
    return None


def _what(req: JobRequest) -> str:
    """What the job is, as its refusals name it: its context's `what` (a cell, a stage's run), else its name."""
    return (req.fn.context or {}).get("what", req.name) if getattr(req.fn, "context", None) else req.name


def _stuck(job: Any, st: SlurmState, req: JobRequest, log: RuleLog) -> str:
    """A job pending for a reason that never clears (launch/pending.py): cancelled, and the refusal recorded so
    that Snakemake's retries submit nothing until the site file changes. Returns what the cell fails with."""
    message = pending.stuck_message(str(job.job_id), st.reason or "", req.slurm)
    _cancel(str(job.job_id), log, f"pending for ever: {st.reason}")
    progress.refuse(req.workdir, str(job.job_id), req.context()["slurm"], message, whole=True)  # with its identity
    log(f"not submitted again: {message}")
    return f"{_what(req)}: {message}"


def _ran_out_of_time(req: JobRequest, job_id: str, log: RuleLog) -> str:
    """A job that starts over from scratch (a benchmark cell) ended at its time limit (TIMEOUT: the warning signal
    was not acted on, e.g. it came while the job was starting): a new job with the same limit would end the same
    way. Refuse it as a time-out without progress does (launch/progress.py), so Snakemake's retry submits nothing."""
    reason = progress.refuse(req.workdir, job_id, req.slurm, f"{_what(req)}: job {job_id} ran into its time limit "
                             "(SLURM state TIMEOUT) before finishing (it starts over from its first step")  # fmt: skip
    log(f"not submitted again: {reason}")
    return reason


# The rank's command: USR2 ignored until submitit installs its handler. SLURM sends the time-limit warning
# (`--signal=USR2@signal_delay_s`) as soon as less than that is left, which for a short limit is right after a
# (re)start, while the interpreter still loads the job; USR2's default action would kill it (state FAILED, then
# submitted anew). Ignored, the early warning is lost and the job ends TIMEOUT, which `_ran_out_of_time` refuses.
GUARDED_PYTHON = '/bin/sh -c \'trap "" USR2; exec "$0" "$@"\' {python}'


def _submit_slurm(req: JobRequest, log: RuleLog):
    import submitit

    settings = req.slurm
    if settings is None:
        raise ValueError(f"job {req.name}: the slurm launcher needs the site's settings for its GPU type")
    before_write(req.folder)  # the driver still owns the results folder (nothing is submitted by one taken over)
    if req.record is not None:
        req.record.unlink(missing_ok=True)  # no job but the one submitted now may write the outputs
    submitit.SlurmJob.watcher._delay_s = settings["poll_max_s"]  # one shared sacct poll for all jobs
    python = GUARDED_PYTHON.format(python=rank_python(settings, sys.executable))
    ex = submitit.SlurmExecutor(folder=req.folder, max_num_timeout=req.max_num_timeout, python=python)
    params = sbatch_parameters(settings, req.nodes, req.gpus_per_node, req.name)
    ex.update_parameters(**params)
    req.fn.context = req.context()
    wait_s = float(section("config", "launcher", req.launcher)["submit_wait_min"]) * 60
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
            "spec_hash": spec_hash(req.identity or {}),
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
    poll, last, settling_since, stuck_since = 1.0, None, None, None
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
        if st.state == "PENDING" and pending.never_clears(st.reason):
            stuck_since = stuck_since or time.time()
            if time.time() - stuck_since >= pending.CONFIRM_S:
                raise RuntimeError(_stuck(job, st, req, log))
            poll = min(poll, pending.CONFIRM_S)
        else:
            stuck_since = None
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


def run_slurm(req: JobRequest, log: RuleLog, what: str, log_path: str | Path) -> Outcome:
    identity = spec_hash(req.identity or {})
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
            verdict = read_json(req.workdir / progress.VERDICT)
            if verdict and str(verdict.get("job_id")) == str(job.job_id):
                log(f"not requeued: {verdict['reason']}")
                raise RuntimeError(f"{what}: {verdict['reason']}") from None
            if state is not None and state.state == "TIMEOUT" and getattr(req.fn, "restartable", False):
                raise RuntimeError(_ran_out_of_time(req, str(job.job_id), log)) from None
            raise
    finally:
        driver.unregister(req.name)
    return Outcome(str(job.job_id), values)
