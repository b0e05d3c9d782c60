"""A job on SLURM: submitted by submitit (with back-off while the controller is unreachable), its state read
from the controller while it knows the job and from accounting after (a requeue is not an end; an unknown
state is waited for, never taken as "submit anew"), re-attached after a driver restart, its ranks' results
collected from disk. Imports no torch."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pretrain_planner.launch import driver, pending, progress, slots
from pretrain_planner.launch.poller import POLLER
from pretrain_planner.launch.request import JobFailed, JobRequest, Outcome, RuleLog, spec_hash
from pretrain_planner.launch.slurm_state import SlurmState, run_cmd, slurm_state
from pretrain_planner.planning.site import driver_settings, rank_python, sbatch_parameters
from pretrain_planner.results import atomic_write_text, before_write, read_json

# final states after which SLURM may still requeue the job (JobRequeue): give the controller a moment
SETTLING_STATES = {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}


SETTLE_S = 90


def controller_up() -> bool:
    rc, out, _ = run_cmd(["scontrol", "ping"], timeout=20)
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
    rc, _, err = run_cmd(["scancel", str(job_id)])
    log(f"cancelled job {job_id} ({why})" if rc == 0 else f"scancel {job_id} failed: {err.strip()[:300]}")


def _ask_until_known(job_id: str, req: JobRequest, log: RuleLog,
                     ask: Callable[[], SlurmState | None] | None = None) -> SlurmState:  # fmt: skip
    """The job's state; while nobody can tell it, wait and ask again (bounded by launcher.state_wait_min). `ask`:
    the next state from the driver's poller (None: the driver stops); without it, the job's own question."""
    wait_s = float(req.launcher.state_wait_min) * 60
    t0, said, asked = time.time(), False, 0
    while True:
        if ask is not None:
            st = ask()
        elif asked and driver.STOP.wait(min(30.0, 2 + (time.time() - t0) / 4)):
            st = None
        else:
            st = slurm_state(job_id)
        if st is None:
            raise driver.DriverStopped(f"driver stopping; job {job_id} left as it is")
        asked += 1
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


def _waiting(req: JobRequest, why: str | None) -> None:
    """What the job waits for before it is queued (the cell's state record and `status` show it)."""
    driver.register(req.name, kind="slurm", job_id=None, what=_what(req), waiting=why)


def _wait_for_submit_limit(req: JobRequest, log: RuleLog, msg: str, times: int) -> None:
    """sbatch refused the job for a submit limit: wait (the driver's other jobs end and free room) and ask again,
    for as long as it takes; never a failed cell."""
    if times == 1 or times % 20 == 0:
        log(
            f"sbatch refused the job for the scheduler's submit limit ({' '.join(msg.split())[:300]}); waiting for "
            f"one of your queued jobs to end and asking again (refusal {times}; set max_queued_jobs in "
            f"{(req.slurm or {}).get('site') or 'the site file'} to the cap so that the driver never asks beyond it)"
        )
    _waiting(req, "a queue slot: the scheduler's submit limit refused it")
    # asked again once one of the driver's own jobs leaves the queue, else after a back-off (the user's other jobs)
    slots.SLOTS.wait_release(min(30.0, 2.0 * 1.5 ** min(times - 1, 20)))
    if driver.STOP.is_set():
        raise driver.DriverStopped("driver stopping: nothing submitted")


def _take_slot(req: JobRequest, log: RuleLog) -> None:
    """Wait until fewer than the site's cap of the driver's jobs are queued (launch/slots.py), then hold one."""
    cap, source = slots.queue_cap(req.slurm or {})

    def waiting(held: int) -> None:
        log(f"waiting for a queue slot: {held} of the driver's jobs are queued or running, at most {cap} ({source})")
        _waiting(req, f"a queue slot ({held} of at most {cap} jobs queued: {source})")

    if not slots.SLOTS.take(req.name, cap, driver.STOP, waiting):
        raise driver.DriverStopped("driver stopping: nothing submitted")


def _submit_slurm(req: JobRequest, log: RuleLog):
    import submitit

    settings = req.slurm
    if settings is None:
        raise ValueError(f"job {req.name}: the slurm launcher needs the site's settings for its GPU type")
    before_write(req.folder)  # the driver still owns the results folder (nothing is submitted by one taken over)
    if req.record is not None:
        req.record.unlink(missing_ok=True)  # no job but the one submitted now may write the outputs
    # submitit's own sacct watcher, should anything ask it: no more often than the driver's poller (launch/poller.py)
    submitit.SlurmJob.watcher._delay_s = driver_settings(settings.get("site"))["poll_max_s"]
    python = GUARDED_PYTHON.format(python=rank_python(settings, sys.executable))
    ex = submitit.SlurmExecutor(folder=req.folder, max_num_timeout=req.max_num_timeout, python=python)
    params = sbatch_parameters(settings, req.nodes, req.gpus_per_node, req.name)
    ex.update_parameters(**params)
    req.fn.context = req.context()
    wait_s = float(req.launcher.submit_wait_min) * 60
    t0, attempt, limited = time.time(), 0, 0
    while True:
        attempt += 1
        try:
            job = ex.submit(req.fn)
            break
        except Exception as exc:  # noqa: BLE001 - sbatch's errors come as several exception types
            msg = f"{type(exc).__name__}: {exc}".strip()
            if slots.is_submit_limit(msg):  # back-pressure: the user's queued jobs are at the site's cap
                limited += 1
                _wait_for_submit_limit(req, log, msg, limited)
                continue
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
    task's result is already on disk. Its state comes from the driver's one poller (launch/poller.py)."""
    job_id = str(job.job_id)
    seen_round = POLLER.watch(job_id, float(driver_settings((req.slurm or {}).get("site"))["poll_max_s"]))
    try:
        return _follow_state(job, req, log, seen_round)
    finally:
        POLLER.unwatch(job_id)


def _follow_state(job: Any, req: JobRequest, log: RuleLog, seen_round: int) -> SlurmState | None:
    last, settling_since, stuck_since = None, None, None

    def polled() -> SlurmState | None:
        """The job's state from the poller's next round; None when the driver stops."""
        nonlocal seen_round
        answer = POLLER.next_state(str(job.job_id), seen_round, driver.STOP)
        if answer is None:
            return None
        st, seen_round = answer
        return st

    while True:
        st = polled()
        if st is None:
            log(f"driver stopping: job {job.job_id} left queued; the next run of the same command re-attaches to it")
            raise driver.DriverStopped(f"job {job.job_id} left queued")
        seen = (st.state, st.restarts)
        if seen != last:
            extra = f", requeued {st.restarts} time(s)" if st.restarts else ""
            log(
                f"job {job.job_id}: {st.state} ({st.source}{extra}"
                f"{'; ' + st.reason if st.reason and st.reason != 'None' else ''})"
            )
            last = seen
        if not st.live and _pickles_done(job):  # the files are looked at once the job has left the queue
            return None
        if not st.known:
            st = _ask_until_known(job.job_id, req, log, polled)
        if st.state == "PENDING" and pending.never_clears(st.reason):
            stuck_since = stuck_since or time.time()
            if time.time() - stuck_since >= pending.CONFIRM_S:
                raise RuntimeError(_stuck(job, st, req, log))
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


def run_slurm(req: JobRequest, log: RuleLog, what: str, log_path: str | Path) -> Outcome:
    identity = spec_hash(req.identity or {})
    verdict = progress.verdict_for(req.workdir, identity, req.slurm)
    if verdict is not None:
        log(f"not submitted again: {verdict['reason']}")
        raise RuntimeError(f"{what}: {verdict['reason']}")
    job = _reattach(req, log)
    try:
        if job is None:
            _take_slot(req, log)
            job = _submit_slurm(req, log)
        else:
            slots.SLOTS.hold(req.name)  # already in the queue: it counts
    except BaseException:
        slots.SLOTS.release(req.name)
        driver.unregister(req.name)
        raise
    driver.register(req.name, kind="slurm", job_id=job.job_id, what=what)
    segment = 1
    try:
        while True:
            state = _wait_slurm(job, req, log)
            try:
                values = _collect(job, what, log, log_path, state)
                break
            except RuntimeError:
                verdict = read_json(req.workdir / progress.VERDICT)
                if verdict and str(verdict.get("job_id")) == str(job.job_id):
                    log(f"not requeued: {verdict['reason']}")
                    raise RuntimeError(f"{what}: {verdict['reason']}") from None
                if state is not None and state.state == "TIMEOUT" and getattr(req.fn, "restartable", False):
                    raise RuntimeError(_ran_out_of_time(req, str(job.job_id), log)) from None
                why = None if getattr(req.fn, "restartable", True) else _not_requeued(job, state)
                if why is None or segment > req.max_num_timeout:
                    raise
            # a job that resumes from its checkpoint, not requeued where SLURM would have (the site refuses requeue):
            # a new job takes it up, as a requeue would have (nothing lost, the segment counted)
            segment += 1
            log(f"job {job.job_id} {why}: submitting a new job that resumes from its checkpoint (segment {segment})")
            job = _submit_slurm(req, log)
            driver.register(req.name, kind="slurm", job_id=job.job_id, what=what)
    finally:
        slots.SLOTS.release(req.name)
        driver.unregister(req.name)
    return Outcome(str(job.job_id), values)


# states in which SLURM requeues a job where the site allows it (JobRequeue, --requeue; submitit on the warning)
REQUEUE_STATES = SETTLING_STATES | {"TIMEOUT"}


def _not_requeued(job: Any, state: SlurmState | None) -> str | None:
    """Why a job ended without its result where a requeue was due, or None: `scontrol requeue` refused in the job
    (rank 0's result holds that error: a site that refuses requeue), or a state SLURM requeues in where allowed."""
    from submitit.core.utils import pickle_load

    path = task_jobs(job)[0].paths.result_pickle
    if path.exists():
        try:
            outcome, value = pickle_load(path)
        except Exception:  # noqa: BLE001 - unreadable: not known to be a refused requeue
            return None
        if outcome != "success" and "'scontrol', 'requeue'" in str(value):
            return "could not requeue itself (the site refused `scontrol requeue`)"
    if state is not None and state.state in REQUEUE_STATES:
        return f"ended {state.state} and was not requeued"
    return None
