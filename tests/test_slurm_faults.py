"""Fault drills on the live testbed: exactly one SLURM job per cell, and result.json from the recorded job,
whatever fails — a node, the accounting daemon, the controller, a time limit too short, the driver itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from .conftest import (
    PACED,
    PROFILE,
    REPO,
    SITE,
    bench,
    cell_results,
    dump_driver_threads,
    last_job_id,
    sacct,
    slurm_conf,
    snakemake,
    start_driver,
    steps_lasting,
    wait_for,
    write_config,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
DAEMON = str(REPO / "cluster/testbed/daemon.sh")


def _config(path: Path, models: list[str], gpus: list[str], timed_steps: int, site: str = SITE, **launcher) -> Path:
    return write_config(
        path,
        sweep={"models": models, "gpus": gpus, "methods": ["naive"]},
        launcher={"kind": "slurm", "site": site, **launcher},
        benchmark=bench(timed_steps),
    )


def _daemon(action: str, name: str) -> None:
    proc = subprocess.run(["bash", DAEMON, action, name], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _scontrol(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


def _one_job_per_cell(work: Path, since: int) -> list[dict]:
    """Every cell: exactly one SLURM job (COMPLETED), and its result.json names the job slurm_job.json records."""
    results = cell_results(work)
    assert results and all(r["status"] == "ok" for r in results), results
    for r in results:
        name = f"pp-{r['model']}-{r['gpu']}-{r['nodes']}x{r['gpus_per_node']}-{r['method']}"
        # accounting may lag behind the controller (e.g. records queued while slurmdbd was down)
        wait_for(
            lambda n=name: all(j["State"] == "COMPLETED" for j in sacct(since, n)) and sacct(since, n), 90, "sacct"
        )
        jobs = sacct(since, name)
        assert len(jobs) == 1 and jobs[0]["State"] == "COMPLETED", jobs
        cell = work / f"results/cells/{r['model']}/{r['gpu']}/{r['nodes']}x{r['gpus_per_node']}/{r['method']}"
        record = json.loads((cell / "slurm_job.json").read_text())
        assert r["slurm_job_id"] == str(record["job_id"]) == jobs[0]["JobID"], (r["slurm_job_id"], record, jobs)
    return results


def _log(work: Path, rel: str) -> str:
    return (work / "results/cells" / rel / "cell.log").read_text()


def test_node_failure_reattaches_to_the_requeued_job(slurm_cluster, tmp_path):
    """A node goes down under a running cell: SLURM requeues the job (sacct says NODE_FAIL for a while); the
    driver waits for the same job instead of failing the cell and submitting a second one."""
    since = last_job_id()
    run_s = 25  # still running when the node goes down, 3 s after the job started (start-up comes on top)
    cfg = _config(tmp_path / "c.yaml", ["tiny-gptneox"], ["a100"], timed_steps=steps_lasting(run_s))
    driver = start_driver(tmp_path, cfg, "cells", env=PACED)
    try:
        job = wait_for(lambda: [j for j in sacct(since, "pp-tiny-gptneox-a100-1x1-naive") if j["State"] == "RUNNING"],
                    180, "the cell to run")[0]  # fmt: skip
        time.sleep(3)
        subprocess.run(["scontrol", "update", "nodename=node-a100", "state=down", "reason=drill"], check=True)
        wait_for(lambda: int(_scontrol(job["JobID"]).get("Restarts", "0")) >= 1, 60, "SLURM to requeue the job")
        time.sleep(5)  # the driver polls meanwhile (NODE_FAIL in accounting); the node returns by itself
        subprocess.run(["scontrol", "update", "nodename=node-a100", "state=resume"], capture_output=True)
        # the requeued run from its first step, the node's return and SLURM's requeue delay on top
        assert driver.wait(timeout=300 + 2 * run_s) == 0, (tmp_path / "driver.log").read_text()[-5000:]
    finally:
        subprocess.run(["scontrol", "update", "nodename=node-a100", "state=resume"], capture_output=True)
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    (result,) = _one_job_per_cell(tmp_path, since)
    assert result["slurm_job_id"] == job["JobID"]
    assert "requeued 1 time(s)" in _log(tmp_path, "tiny-gptneox/a100/1x1/naive")
    time.sleep(5)  # nothing writes the cell after the driver finished
    assert json.loads((tmp_path / "results/cells/tiny-gptneox/a100/1x1/naive/result.json").read_text()) == result


def test_reattach_collects_finished_jobs_while_slurmdbd_is_down(slurm_cluster, tmp_path):
    """The driver is killed; every job finishes; accounting goes down; the restarted driver collects the
    results on disk and submits nothing."""
    since = last_job_id()
    cfg = _config(tmp_path / "c.yaml", ["tiny-gptneox", "tiny-bert"], ["a100", "h100"], timed_steps=10)
    driver = start_driver(tmp_path, cfg, "cells")
    records = lambda: list((tmp_path / "results/cells").glob("*/*/*/*/slurm_job.json"))  # noqa: E731
    try:
        wait_for(lambda: len(records()) == 4, 120, "all four cells to be submitted")
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    ids = [json.loads(p.read_text())["job_id"] for p in records()]
    wait_for(lambda: all(_scontrol(str(i)).get("JobState") == "COMPLETED" for i in ids), 240, "every job to finish")
    wait_for(lambda: sum(j["State"] == "COMPLETED" for j in sacct(since)) == 4, 60, "accounting to record them")
    _daemon("stop", "slurmdbd")
    try:
        assert snakemake(tmp_path, "--profile", PROFILE, "--configfile", str(cfg), "--unlock").returncode == 0
        proc = snakemake(tmp_path, "cells", "--profile", PROFILE, "--configfile", str(cfg), timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    finally:
        _daemon("start", "slurmdbd")
    _one_job_per_cell(tmp_path, since)
    logs = [p.read_text() for p in (tmp_path / "results/cells").glob("*/*/*/*/cell.log")]
    assert len(logs) == 4 and all("finished while the driver was away" in log for log in logs), logs


def test_controller_down_at_submission_backs_off_and_logs_every_attempt(slurm_cluster, tmp_path):
    """sbatch fails while slurmctld is down: the first job the sweep submits (h100's preflight) waits for the
    controller (launcher.submit_wait_min) instead of spending Snakemake's retries in seconds, and its log keeps every
    failed attempt; the cell follows once it is back."""
    since = last_job_id()
    cfg = _config(tmp_path / "c.yaml", ["tiny-bert"], ["h100"], timed_steps=3, submit_wait_min=5)
    _daemon("stop", "slurmctld")
    log = tmp_path / "results/logs/preflight-h100.log"
    try:
        driver = start_driver(tmp_path, cfg, "cells")
        wait_for(
            lambda: log.is_file() and log.read_text().count("sbatch attempt") >= 2, 120, "two failed sbatch attempts"
        )
    finally:
        _daemon("start", "slurmctld")
    wait_for(lambda: subprocess.run(["sinfo", "-h", "-n", "node-h100", "-o", "%T"], capture_output=True,
                                 text=True).stdout.strip() == "idle", 90, "node-h100 to be idle")  # fmt: skip
    assert driver.wait(timeout=420) == 0, (tmp_path / "driver.log").read_text()[-5000:]
    text = log.read_text()
    assert "sbatch attempt 1 failed (controller unreachable)" in text and "Unable to contact slurm controller" in text
    _one_job_per_cell(tmp_path, since)


@pytest.fixture(scope="module")
def time_limit_sweep(slurm_cluster, tmp_path_factory):
    """One sweep, two cells that outlast a 1-minute time limit, side by side on the two nodes (each drill waits on
    SLURM's clock, minutes at its coarsest, so one run serves both): on a100 the USR2 warning arrives right after each
    (re)start (signal_delay_s 90 > the limit), on h100 there is no warning before the limit (signal_delay_s 0)."""
    work = tmp_path_factory.mktemp("time-limits")
    site = yaml.safe_load(Path(SITE).read_text())
    site["gpus"]["a100"].update(time_limit_min=1, signal_delay_s=90)
    site["gpus"]["h100"].update(time_limit_min=1, signal_delay_s=0)
    site_path = work / "site.yaml"
    site_path.write_text(yaml.safe_dump(site))
    since = last_job_id()
    steps = steps_lasting(300)  # 5 x the limit: never done within it
    cfg = _config(work / "c.yaml", ["tiny-gptneox"], ["a100", "h100"], timed_steps=steps, site=str(site_path))
    proc = snakemake(work, "cells", "--profile", PROFILE, "--configfile", str(cfg), timeout=600, env=PACED)
    return work, since, proc


def test_time_limit_too_short_fails_once_naming_the_site_key(time_limit_sweep):
    """The USR2 warning arrives right after each (re)start: the second time-out without progress is not
    requeued, the cell fails with the site key to raise, and Snakemake's retry does not submit it again."""
    work, since, proc = time_limit_sweep
    assert proc.returncode != 0
    text = _log(work, "tiny-gptneox/a100/1x1/naive")
    # the second time-out ends as requeued-without-progress, or (its USR2 came while submitit unpickled, ignored
    # by the guard) as a TIMEOUT of a job that restarts from its first step: either way refused, naming the key
    refused = "without getting further" in text or "ran into its time limit" in text
    assert "gpus.a100.time_limit_min" in text and refused, text[-4000:]
    assert "not submitted again" in text  # Snakemake's retries did not loop again
    jobs = sacct(since, "pp-tiny-gptneox-a100-1x1-naive")
    assert len(jobs) == 1, jobs  # one job, requeued once, then refused


def test_a_cell_ending_at_its_time_limit_is_not_submitted_again(time_limit_sweep):
    """No warning before the limit (signal_delay_s 0; likewise a warning that arrives while the job still starts,
    before submitit's handler exists): the job ends TIMEOUT. A benchmark starts over from its first step, so a new
    job with the same limit would end the same way: the cell fails naming the site key, with one job only."""
    work, since, proc = time_limit_sweep
    assert proc.returncode != 0
    text = _log(work, "tiny-gptneox/h100/1x1/naive")
    assert "(SLURM state TIMEOUT)" in text and "gpus.h100.time_limit_min" in text, text[-4000:]
    assert "not submitted again" in text
    jobs = sacct(since, "pp-tiny-gptneox-h100-1x1-naive")
    assert [j["State"] for j in jobs] == ["TIMEOUT"], jobs


def test_second_driver_is_refused_and_sigterm_leaves_jobs_queued(slurm_cluster, tmp_path):
    """`--unlock` while a driver lives does not let a second driver in; SIGTERM stops the first promptly,
    names the jobs it leaves queued, and the next run re-attaches to them."""
    since = last_job_id()
    run_s = 60  # both still running after --unlock, a refused second driver and the first one's SIGTERM
    cfg = _config(tmp_path / "c.yaml", ["tiny-gptneox"], ["a100", "h100"], timed_steps=steps_lasting(run_s))
    driver = start_driver(tmp_path, cfg, "cells", env=PACED)
    try:
        wait_for(lambda: len([j for j in sacct(since) if j["State"] == "RUNNING"]) == 2, 180, "both cells to run")
        assert snakemake(tmp_path, "--profile", PROFILE, "--configfile", str(cfg), "--unlock").returncode == 0
        second = snakemake(tmp_path, "cells", "--profile", PROFILE, "--configfile", str(cfg), timeout=120)
        assert second.returncode != 0
        assert "another driver is working on results" in second.stderr and f"pid {driver.pid}" in second.stderr
        t0 = time.time()
        os.kill(driver.pid, signal.SIGTERM)
        try:
            driver.wait(timeout=60)
        except subprocess.TimeoutExpired:
            dump_driver_threads(driver)  # where it hung, into driver.log
            raise AssertionError((tmp_path / "driver.log").read_text()[-6000:]) from None
        assert time.time() - t0 < 45
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    out = (tmp_path / "driver.log").read_text()
    left = [j["JobID"] for j in sacct(since) if j["State"] in ("RUNNING", "PENDING")]
    assert len(left) == 2 and "left queued on SLURM (2)" in out and all(f"job {i})" in out for i in left), out[-3000:]
    assert not cell_results(tmp_path)
    assert snakemake(tmp_path, "--profile", PROFILE, "--configfile", str(cfg), "--unlock").returncode == 0
    proc = snakemake(tmp_path, "cells", "--profile", PROFILE, "--configfile", str(cfg), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    _one_job_per_cell(tmp_path, since)


def _two_node_cell(path: Path, run_s: float) -> Path:
    """A 2 x 1 naive cell on the testbed's two-node partition (`l40s` on `multi`) that times for about `run_s`."""
    return write_config(
        path,
        sweep={"models": ["tiny-gptneox"], "gpus": ["l40s"], "nodes": [2], "gpus_per_node": [1], "methods": ["naive"]},
        launcher={"kind": "slurm", "site": SITE},
        benchmark=bench(steps_lasting(run_s)),
    )


TWO_NODE = "pp-tiny-gptneox-l40s-2x1-naive"


def test_a_node_lost_under_a_two_node_cell_requeues_it_and_one_job_delivers(slurm_cluster, tmp_path):
    """Issue 37: the second node of a running 2-node cell goes down: SLURM requeues the job, the driver waits for
    the same job (no second submission), and when the node is back exactly that job delivers the result."""
    since = last_job_id()
    run_s = 15
    driver = start_driver(tmp_path, _two_node_cell(tmp_path / "c.yaml", run_s), "cells", env=PACED)
    try:
        job = wait_for(lambda: [j for j in sacct(since, TWO_NODE) if j["State"] == "RUNNING"], 180, "the cell")[0]
        time.sleep(3)
        subprocess.run(["scontrol", "update", "nodename=node-mn1", "state=down", "reason=drill"], check=True)
        wait_for(lambda: int(_scontrol(job["JobID"]).get("Restarts", "0")) >= 1, 60, "SLURM to requeue the job")
        time.sleep(5)
        subprocess.run(["scontrol", "update", "nodename=node-mn1", "state=resume"], capture_output=True)
        assert driver.wait(timeout=300 + 2 * run_s) == 0, (tmp_path / "driver.log").read_text()[-5000:]
    finally:
        subprocess.run(["scontrol", "update", "nodename=node-mn1", "state=resume"], capture_output=True)
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    (result,) = _one_job_per_cell(tmp_path, since)
    assert result["slurm_job_id"] == job["JobID"] and result["nodes"] == 2
    assert set(result["step_split"]["nodes"]) == {"node-mn0", "node-mn1"}
    assert "requeued 1 time(s)" in _log(tmp_path, "tiny-gptneox/l40s/2x1/naive")


def test_a_rank_killed_on_the_second_node_stops_every_rank_and_the_cell_is_rerun(slurm_cluster, tmp_path):
    """Issue 37: SIGKILL of the rank on node-mn1 while the 2-node cell times: every rank of the job is gone within a
    bounded time (no peer left waiting in a collective), the job FAILED, and the cell is measured again by a new
    job as any failed cell is (Snakemake's retry), which delivers."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from chaos_soak import environ, processes, rank_pid

    since = last_job_id()
    driver = start_driver(tmp_path, _two_node_cell(tmp_path / "c.yaml", 20), "cells", env=PACED)
    try:
        job = wait_for(lambda: [j for j in sacct(since, TWO_NODE) if j["State"] == "RUNNING"], 180, "the cell")[0]
        pid = wait_for(lambda: rank_pid(job["JobID"], 1), 120, "rank 1 to start")
        assert environ(pid).get("SLURMD_NODENAME") == "node-mn1"
        wait_for(lambda: "timing micro-batch" in _log(tmp_path, "tiny-gptneox/l40s/2x1/naive"), 180, "the timing")
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)

        def ranks_left() -> list[int]:
            return [p for p in processes() if environ(p).get("SLURM_JOB_ID") == job["JobID"]]

        wait_for(lambda: not ranks_left(), 120, "every rank of the job to stop")
        stopped_s = time.monotonic() - t0
        print(f"every rank of job {job['JobID']} stopped {stopped_s:.1f} s after rank 1 was killed")
        assert stopped_s < 60
        assert driver.wait(timeout=600) == 0, (tmp_path / "driver.log").read_text()[-5000:]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    jobs = wait_for(lambda: [j for j in sacct(since, TWO_NODE) if j["State"] != "RUNNING"][1:] and
                    sacct(since, TWO_NODE), 90, "sacct")  # fmt: skip
    states = {j["JobID"]: j["State"] for j in jobs}
    assert states[job["JobID"]] == "FAILED" and list(states.values()).count("COMPLETED") == 1, states
    (result,) = cell_results(tmp_path)
    assert result["status"] == "ok" and result["slurm_job_id"] != job["JobID"]


def test_a_cell_that_would_pend_for_ever_fails_within_a_minute_naming_the_limit(slurm_cluster, tmp_path):
    """With EnforcePartLimits=NO (SLURM's default; the testbed's own is ALL, which refuses at submission) a cell
    asking 10 min of partition `short` (MaxTime 2 min) is accepted and pends for ever (PartitionTimeLimit): the
    driver cancels it and fails the cell within a minute, naming the reason and the site key, and Snakemake's
    retries submit nothing more (issue 53)."""
    since = last_job_id()
    site = yaml.safe_load(Path(SITE).read_text())
    site["gpus"]["h100"]["partition"] = "short"  # time_limit_min: the file's 10 min
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(site))
    # the cell's own watchdog (the preflight, whose job would pend there too, is another test's)
    cfg = _config(tmp_path / "c.yaml", ["tiny-gptneox"], ["h100"], 2, site=str(tmp_path / "site.yaml"),
                  preflight=False)  # fmt: skip
    slurm_conf("EnforcePartLimits", "NO")
    try:
        t0 = time.time()
        proc = snakemake(tmp_path, "cells", "--profile", PROFILE, "--configfile", str(cfg), timeout=600)
        took = time.time() - t0
    finally:
        slurm_conf("EnforcePartLimits", "ALL")
    assert proc.returncode != 0 and took < 60, (took, proc.stderr[-3000:])
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("cell tiny-gptneox/h100/1x1/naive: failed"))
    assert "pended with reason PartitionTimeLimit on short" in line and "gpus.h100.time_limit_min" in line, line
    jobs = sacct(since)
    assert [j["State"].split()[0] for j in jobs] == ["CANCELLED"], jobs  # one job: the retries submitted nothing
