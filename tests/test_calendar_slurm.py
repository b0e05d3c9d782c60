"""Calendar time on the SLURM testbed (issue 38): a queue wait asked of the scheduler without submitting
(planning/queue.py: `sbatch --test-only` with a job's exact request), and the train stage on a partition whose time
limit is shorter than the training (`short`: MaxTime 2 min, cluster/testbed/slurm-up.sh), run as requeued segments:
each job warned before its limit, checkpointing, requeued in place and resuming, one continuous step log and loss;
on the restrictive site (JobRequeue=0: a job is requeued only if it asks, tests/conftest.restrictive_site).

What the segments cost (the scheduler's requeue delay, each restart's start-up, when the warning came) is measured
from sacct's per-run records (`sacct -D`), submitit's log and the run's train.log, and printed; calendar.md's
prediction for the run (made before it) is held to its segment count and, within 15%, its wall time."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from pretrain_planner.launch import stage
from pretrain_planner.launch.rankjob import EntryJob
from pretrain_planner.planning.configtypes import Launch, LauncherSection, TrainSection
from pretrain_planner.planning.queue import ask_start
from pretrain_planner.planning.site import gpu_settings, load_site

from .conftest import (
    BIN,
    CATALOG,
    PACED,
    SITE,
    job_ids,
    last_job_id,
    restrictive_site,
    sacct,
    scontrol_job,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The train stage's GPU type on the short partition: a 2 min job (the partition's MaxTime), warned 5 s before its
# limit. slurmctld sends the warning at its time-limit check (every 30 s) at which at most signal_delay_s + 30 s are
# left, so a job is warned 5-35 s before its limit, depending on when it started; a job that starts in step with those
# checks (a requeued one: the scheduler pass that starts it follows a check) is warned 90 s after its start, trains
# 90 s less its start-up of it and waits ~60 s to start again (BeginTime: requeue + cred_expire 30 s + 1, then the
# pass); the first job starts in step with the checks too (`_aligner`).
TIME_LIMIT_MIN, SIGNAL_DELAY_S = 2, 5
# Training time (the loop's clock, kept across restarts): two such jobs train less than it whatever their start-up,
# three train it while their start-ups add up to under 90 s, so the run is 3 jobs with a wide margin for a loaded
# host's slower start-ups (a 1 min limit left 30 s: 3 start-ups of 10 s each under CI's load made it 4 jobs).
BUDGET_S = 180
NAME = "pp-train-tiny-gptneox-h100-1x1"


def _stamp(text: str) -> datetime:
    """A time as sacct, submitit's log ("2026-12-04 02:12:21,243") or train.log (".243") write it: local time."""
    return datetime.fromisoformat(text.replace(",", ".").replace(" ", "T"))


def test_a_blocker_delays_the_expected_start_and_asking_submits_nothing(slurm_cluster, tmp_path):
    """A job holding both of node-a100's GPUs: `ask_start` for a 1 x 1 a100 job expects it to start when the
    blocker ends (its EndTime: start + its 10 min limit), the same question for h100 (free) expects no wait; asking
    submits nothing. A request the scheduler refuses (no such partition; longer than the partition's MaxTime) is an
    unknown wait, never zero."""
    site = load_site(SITE, ["a100", "h100"])
    a100, h100 = gpu_settings(site, "a100"), gpu_settings(site, "h100")
    blocker = subprocess.run(["sbatch", "--parsable", "-p", "a100", "--gres=gpu:a100:2", "--time=10", "-J",
                              "pp-blocker", "-o", str(tmp_path / "blocker.out"), "--wrap", "sleep 900"],
                             capture_output=True, text=True, check=True).stdout.strip().split(";")[0]  # fmt: skip
    try:
        wait_for(lambda: scontrol_job(blocker)["JobState"] == "RUNNING", 60, "the blocker to run")
        ends = _stamp(scontrol_job(blocker)["EndTime"])
        before = job_ids()
        asked = datetime.now()
        blocked, cmd = ask_start(a100, 1, 1, "pp-probe-a100")
        free, _ = ask_start(h100, 1, 1, "pp-probe-h100")
        assert job_ids() - before == set(), "asking submitted a job"
        assert cmd[:2] == ["sbatch", "--test-only"] and "--partition=a100" in cmd and "--gres=gpu:a100:1" in cmd, cmd
        assert blocked.hours is not None, blocked
        start = _stamp(re.search(r"expected start (\S+)", blocked.how).group(1))
        # the scheduler's own estimate: the blocker's end (a minute of slack for a scheduler pass)
        assert ends - timedelta(seconds=5) <= start <= ends + timedelta(seconds=60), (start, ends, blocked)
        assert blocked.hours * 3600 == pytest.approx((ends - asked).total_seconds(), abs=65), blocked
        assert free.hours is not None and free.hours * 3600 < 30, free
        print(f"\nblocker {blocker} ends {ends:%H:%M:%S}; a100 1x1: {blocked.hours * 60:.2f} min ({blocked.how}); "
              f"h100 1x1: {free.hours * 3600:.0f} s ({free.how})")  # fmt: skip
    finally:
        subprocess.run(["scancel", blocker], check=False)
    for settings, why in (({**a100, "partition": "v100"}, "invalid partition"),
                          ({**h100, "partition": "short", "time_limit_min": 3}, "time limit")):  # fmt: skip
        before = job_ids()
        wait, _ = ask_start(settings, 1, 1, "pp-probe-refused")
        assert wait.hours is None and "refused" in wait.how, (why, wait)
        assert job_ids() - before == set()


# ---------------------------------------------------------------- the train stage in segments
@pytest.fixture(scope="module")
def short_plan(partitions_sweep) -> tuple[Path, Path]:
    """(the sweep's folder, its exported plan of tiny-gptneox 1 x 1 naive on h100, measured on its own partition
    with the testbed's site file), and beside them a site file mapping h100 to the short partition, which the train
    stage is run with."""
    work = partitions_sweep[0]
    site = yaml.safe_load(Path(SITE).read_text())
    site["defaults"].update(time_limit_min=TIME_LIMIT_MIN, signal_delay_s=SIGNAL_DELAY_S)
    site["gpus"] = {"h100": {"partition": "short", "gpu_request": "gres", "gres_type": "h100"}}
    (work / "site-short.yaml").write_text(yaml.safe_dump(site))
    return work, work / "results/optimal/tiny-gptneox/h100/1x1"


def _predict(work: Path) -> dict:
    """calendar.md of the plan's setting for the site the train stage runs with (the calendar rule's own code on the
    sweep's tables, the scheduler asked), written beside the sweep: its train-stage row, the prediction the run is
    held to."""
    from datetime import datetime

    import polars as pl
    from pretrain_planner.planning.calendar import disk_write_rate
    from pretrain_planner.planning.queue import run_sbatch
    from pretrain_planner.planning.site import resolve_limits
    from pretrain_planner.tables import calendar
    from pretrain_planner.tables.aggregate import read_table

    site = resolve_limits(load_site(work / "site-short.yaml", ["h100"]))
    where = calendar.Site(site, *disk_write_rate(str(work)), run_sbatch, datetime.now())
    tables = work / "results/tables"
    ttt = read_table(tables / "time_to_train.csv").filter((pl.col("gpu") == "h100") & (pl.col("gpus_per_node") == 1))
    settings = calendar.settings_of(
        ttt,
        pl.read_parquet(tables / "cells.parquet"),
        replace(TrainSection.defaults(), time_budget_hours=BUDGET_S / 3600),
    )
    table = calendar.calendar_table(settings, CATALOG, where)
    (work / "calendar-short.md").write_text(calendar.calendar_markdown(table, where))
    (row,) = table.filter(table["run"] == "train stage").to_dicts()
    return row


def _runs(job_id: str) -> list[dict[str, str]]:
    """Every run of a job, requeued ones included (sacct -D: one row per run, Submit = when it was (re)queued)."""
    fields = ["State", "Submit", "Eligible", "Start", "End", "Timelimit"]
    out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", ",".join(fields)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return [dict(zip(fields, ln.split("|"), strict=True)) for ln in out.splitlines() if ln.strip()]


def _limit_s(text: str) -> int:
    h, m, s = (int(x) for x in text.split(":"))
    return 3600 * h + 60 * m + s


def _aligner(folder: Path) -> str:
    """A job holding both of node-h100's GPUs until slurmctld's next time-limit check (a 1 min job warned at its
    first check: at most its limit + 30 s left), then gone: a train job queued behind it starts in step with the
    checks, as a requeued one does, so every segment is warned 90 s after its start (an unaligned first job is
    warned 85-115 s after its start: 2 or 3 segments of this budget, two and a half minutes apart)."""
    jid = subprocess.run(["sbatch", "--parsable", "-p", "h100", "--gres=gpu:h100:2", "--time=1", "--signal=B:USR2@55",
                          "-J", "pp-aligner", "-o", str(folder / "aligner.out"), "--wrap",
                          'trap "exit 0" USR2; while :; do sleep 0.2; done'],
                         capture_output=True, text=True, check=True).stdout.strip().split(";")[0]  # fmt: skip
    wait_for(lambda: scontrol_job(jid)["JobState"] == "RUNNING", 60, "the aligner to run")
    return jid


@pytest.fixture(scope="module")
def segmented(short_plan):
    """`pretrain-planner train` of the plan on the short partition with BUDGET_S of training time (CPU ranks),
    queued behind `_aligner`: the result, its steps, the job's runs from sacct -D, submitit's rank-0 log, train.log."""
    work, plan = short_plan
    since = last_job_id()
    predicted = _predict(work)
    out = work / "train"
    cmd = [str(BIN / "pretrain-planner"), "train", "--plan", str(plan), "--time-budget-h", str(BUDGET_S / 3600),
           "--launcher", "slurm", "--site", str(work / "site-short.yaml"), "--device", "cpu",
           "--out", str(out)]  # fmt: skip
    # on the restrictive site (issue 53: JobRequeue=0, where a job is requeued only if it asked --requeue)
    with restrictive_site():
        aligner = _aligner(work)
        t0 = time.time()
        with open(work / "train-stage.log", "w") as log:
            # paced steps (its training time, kept across the segments, is what counts, not how much a step computes)
            proc = subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, "HF_HUB_OFFLINE": "1", **PACED})  # fmt: skip
        try:
            rc = proc.wait(timeout=900)
        finally:
            subprocess.run(["scancel", aligner], check=False)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                for j in sacct(since, NAME):
                    subprocess.run(["scancel", j["JobID"]], check=False)
        driver_s = time.time() - t0
    assert rc == 0, (work / "train-stage.log").read_text()[-3000:] + (out / "launch.log").read_text()[-5000:]
    result = json.loads((out / "result.json").read_text())
    job_id = result["slurm_job_id"]
    runs = wait_for(lambda: (r := _runs(job_id)) and r[-1]["State"] == "COMPLETED" and r, 30, "sacct's runs")
    steps = [json.loads(ln) for ln in (out / "run/steps.jsonl").read_text().splitlines()]
    submitit_log = (out / f"submitit/{job_id}_0_log.out").read_text()
    train_log = (out / "train.log").read_text()
    return {"result": result, "steps": steps, "runs": runs, "submitit": submitit_log, "train_log": train_log,
            "work": work, "job_id": job_id, "since": since, "driver_s": driver_s, "predicted": predicted}  # fmt: skip


def _times(log: str, what: str) -> list[datetime]:
    """The times of submitit's log lines saying `what` ("submitit INFO (2026-12-04 02:12:21,243) - <what>")."""
    return [_stamp(t) for t in re.findall(r"\((\S+ \S+)\) - " + re.escape(what), log)]


def _figures(run: dict) -> list[dict]:
    """Per segment (one run of the job): its start, end and limit (sacct, whole seconds), its process's start and
    exit (submitit's log: "Starting with JobEnvironment", "Exiting ..."), its first step's end (train.log: the first
    step it logged less the steps after its first), the warning's arrival (submitit logs the SIGCONT SLURM sends with
    the signal), and for a requeued run its wait: from the requeue (sacct's Submit of the run) to its start."""
    steps = {s["step"]: s for s in run["steps"]}
    starts = run["result"]["starts_at_step"] + [run["result"]["steps"]]
    log = run["submitit"]
    procs, warns = _times(log, "Starting with JobEnvironment"), _times(log, "Bypassing signal SIGCONT")
    exits = sorted(_times(log, "Exiting gracefully after preemption") + _times(log, "Exiting after successful"))
    logged = [(_stamp(t), int(n)) for t, n in re.findall(r"^(\S+ \S+) step (\d+) ", run["train_log"], re.M)]
    out = []
    for i, r in enumerate(run["runs"]):
        start, end = _stamp(r["Start"]), _stamp(r["End"])
        seg: dict = {"start": start, "end": end, "limit": start + timedelta(seconds=_limit_s(r["Timelimit"])),
                     "pending_s": (start - _stamp(r["Submit"])).total_seconds(),
                     "eligible_after_s": (_stamp(r["Eligible"]) - _stamp(r["Submit"])).total_seconds()}  # fmt: skip
        proc = procs[i] if i < len(procs) else None
        seg["process_after_start_s"] = (proc - start).total_seconds() if proc else None
        if i + 1 < len(starts):
            seg["steps"] = starts[i + 1] - starts[i]
            first = starts[i] + 1
            mine = [(t, n) for t, n in logged if first <= n <= starts[i + 1]]
            if mine and proc:
                t, n = mine[0]
                first_end = t - timedelta(seconds=sum(steps[k]["step_time_s"] for k in range(first + 1, n + 1)))
                seg["process_to_first_step_s"] = (first_end - proc).total_seconds()
        warn = next((w for w in warns if start <= w <= end + timedelta(seconds=2)), None)
        gone = next((e for e in exits if start <= e <= end + timedelta(seconds=2)), None)
        if warn is not None:
            seg["warned_after_start_s"] = (warn - start).total_seconds()
            seg["warned_before_limit_s"] = (seg["limit"] - warn).total_seconds()
            seg["warning_to_exit_s"] = (gone - warn).total_seconds() if gone else None
        out.append(seg)
    return out


def _print_figures(run: dict, segs: list[dict]) -> None:
    def f(v):
        return "-" if v is None else f"{v:.1f}"

    total = (segs[-1]["end"] - segs[0]["start"]).total_seconds()
    print(f"\ntrain stage on partition short (time limit {TIME_LIMIT_MIN} min, signal_delay_s {SIGNAL_DELAY_S}), "
          f"{BUDGET_S} s of training: job {run['job_id']}, {len(segs)} segments, wall {total:.0f} s from the first "
          f"job's start to the last one's end (the driver: {run['driver_s']:.0f} s); training "
          f"{run['result']['elapsed_s']:.1f} s, {run['result']['steps']} steps")  # fmt: skip
    print("seg | queued->start s (eligible after) | job start->process s | process->first step s | warned after "
          "start s | warned before limit s | warning->process exit s | steps")  # fmt: skip
    for i, s in enumerate(segs):
        print(f"{i + 1} | {f(s['pending_s'])} ({f(s['eligible_after_s'])}) | {f(s['process_after_start_s'])} | "
              f"{f(s.get('process_to_first_step_s'))} | {f(s.get('warned_after_start_s'))} | "
              f"{f(s.get('warned_before_limit_s'))} | {f(s.get('warning_to_exit_s'))} | {s.get('steps')}")  # fmt: skip
    for entry in run["result"].get("starts") or []:  # the run's own record of each start (trainer/startup.py)
        if isinstance(entry, dict):
            print("start record:", json.dumps({k: v for k, v in entry.items() if k != "process_start"}))


def test_the_train_stage_runs_in_requeued_segments_each_warned_and_resumed(segmented):
    """Issue 38: a training longer than the partition's time limit is one job run >= 3 times: each run but the last
    is warned (USR2 from --signal), checkpoints, requeues itself (submitit's handler) and ends before its limit; each
    requeued run resumes from the checkpoint; the run finishes ok within its budget. On a site with JobRequeue=0
    (issue 53: the restrictive testbed), where only a job that asks --requeue may be requeued: the jobs ask it (before
    issue 53 they did not, and SLURM refuses `scontrol requeue` of a job that is not requeueable)."""
    run = segmented
    result, runs, job_id = run["result"], run["runs"], run["job_id"]
    segs = _figures(run)
    _print_figures(run, segs)
    n = len(runs)
    assert n >= 3, f"the run did not need >= 3 jobs: {runs}"
    assert [r["State"] for r in runs] == ["REQUEUED"] * (n - 1) + ["COMPLETED"], runs
    assert len(sacct(run["since"], NAME)) == 1, "requeued in place: one job"
    assert scontrol_job(job_id)["Restarts"] == str(n - 1)  # the controller keeps a finished job MinJobAge (300 s)
    assert result["status"] == "ok" and result["stop_reason"] == "time budget", result
    assert result["elapsed_s"] == pytest.approx(BUDGET_S, abs=1.0)
    starts = result["starts_at_step"]
    assert len(starts) == n and starts[0] == 0 and starts == sorted(set(starts)), starts  # each resumed further
    log, out = run["train_log"], run["submitit"]
    for k in starts[1:]:
        assert f"resumed at step {k}," in log, log[-3000:]
        assert f"signal 12 at step {k}: checkpoint saved" in log, log[-3000:]
    assert out.count("Starting with JobEnvironment") == n, out[-3000:]
    assert out.count("Caught signal SIGUSR2") == n - 1 and out.count(f"Requeued job {job_id}") == n - 1, out[-3000:]
    assert out.count("this job is timed-out") == n - 1 and "Job completed successfully" in out, out[-3000:]
    for s in segs[:-1]:  # each warned before its limit, and gone before it
        assert 0 < s["warned_before_limit_s"] <= SIGNAL_DELAY_S + 31, s
        assert s["end"] <= s["limit"], s
    for s in segs[1:]:
        assert s["pending_s"] >= s["eligible_after_s"] > 0, s  # requeued jobs wait out BeginTime first
    assert all(s.get("process_to_first_step_s") is not None for s in segs), segs


def test_the_segments_step_log_and_loss_are_continuous(segmented):
    """Every step once, in order, across the restarts; after each resume the loss goes on from where it was (the
    weights and optimizer came back), not from the initial loss."""
    steps, result = segmented["steps"], segmented["result"]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1)) and len(steps) == result["steps"]
    loss = [s["loss"] for s in steps]
    initial = sum(loss[:5]) / 5
    for k in result["starts_at_step"][1:]:
        before, after = sum(loss[k - 5 : k]) / 5, sum(loss[k : k + 5]) / 5
        assert initial - before > 0.5, (k, initial, before)  # it had learned something by then
        assert abs(after - before) < 0.2 * (initial - before), f"resume at step {k}: {before:.3f} -> {after:.3f}"
        assert steps[k]["elapsed_s"] > steps[k - 1]["elapsed_s"]  # the training clock carried over


def test_a_run_that_resumes_is_not_cut_short_by_submitits_count_of_time_out_requeues(tmp_path):
    """Issue 38: a train run budgeted in steps gives the launcher no hours to size submitit's time-out requeues by
    (it passes 0: 4 requeues on a 24 h partition), yet 30 days of training there is 31 jobs: a job that resumes from
    its checkpoint is allowed as many as its progress earns (progress.py refuses a time-out that got no further). A
    benchmark cell, which starts over, keeps the count its hours give."""
    site = {"time_limit_min": 24 * 60, "signal_delay_s": 120, "poll_max_s": 60}
    launch = Launch(LauncherSection.given({"kind": "slurm", "timeout_min": 60}), site, None)
    resumes = stage.request(EntryJob("m:f", {}, restartable=False), "pp-train", launch, tmp_path, {}, hours=0)
    assert resumes.max_num_timeout >= 31
    starts_over = stage.request(EntryJob("m:f", {}), "pp-cell", launch, tmp_path, {}, hours=0)
    assert starts_over.max_num_timeout == stage.limits(launch, 0)[1] == 4
    on_this_host = Launch(replace(launch.launcher, kind="local"), None, None)
    local = stage.request(EntryJob("m:f", {}, restartable=False), "pp-train", on_this_host, tmp_path, {}, hours=0)
    assert local.max_num_timeout == 3


def test_the_calendar_predicted_the_segments_and_their_wall_time(segmented):
    """Issue 38: calendar.md's train-stage row for this run (made before it, from the cell's measured start-up, the
    short partition's limit and warning, SLURM's requeue hold asked of the controller) predicted its segment count,
    and the run's wall time from its first job's start to its last one's end within 15% (the first job's queue wait
    aside: behind `_aligner`, whose end the scheduler estimates at its limit; the blocker tests check that wait)."""
    p, runs = segmented["predicted"], segmented["runs"]
    wall_s = (_stamp(runs[-1]["End"]) - _stamp(runs[0]["Start"])).total_seconds()
    predicted_s = p["calendar_days"] * 86400 - p["first_wait_h"] * 3600
    print(f"\ncalendar: {p['segments']} segments, {predicted_s:.0f} s after the first start (restart "
          f"{p['restart_s']:.1f} s, requeue wait {p['requeue_wait_h'] * 3600:.0f} s); measured {len(runs)} segments, "
          f"{wall_s:.0f} s ({wall_s / predicted_s - 1:+.1%})")  # fmt: skip
    assert p["segments"] == len(runs), (p, runs)
    assert abs(wall_s / predicted_s - 1) <= 0.15, (wall_s, predicted_s, p)
    assert "cred_expire=30" in p["note"] and p["restart_basis"].startswith("start-up measured"), p
