"""The SLURM path against a live slurmctld (cluster/testbed): partitions per GPU type, GPU requests,
multi-task jobs, retries after scancel, requeue, and re-attaching after the driver is killed."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from pretrain_planner.launch import slots

from .conftest import (
    BIN,
    CAP,
    CAP_QOS,
    CONTAINER_PYTHON,
    PACED,
    PROFILE,
    SITE,
    bench,
    cell_results,
    ended,
    job_ids,
    last_job_id,
    restrictive_site,
    rpc_counts,
    sacct,
    scontrol_job,
    snakemake,
    start_driver,
    steps_lasting,
    wait_for,
    write_config,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _config(path: Path, sweep: dict, timed_steps: int = 3) -> Path:
    return write_config(
        path,
        sweep={"gpus": ["a100", "h100"], "methods": ["naive"], **sweep},
        launcher={"kind": "slurm", "site": SITE},
        benchmark=bench(timed_steps),
    )


def _step_tasks(job_id: str) -> int:
    out = subprocess.run(
        ["sacct", "-n", "-P", "-j", job_id, "-o", "JobID,NTasks"], capture_output=True, text=True, check=True
    ).stdout
    return max((int(n) for jid, n in (ln.split("|") for ln in out.splitlines()) if n.strip() and "." in jid), default=0)


def test_default_sweep_lands_on_each_gpu_partition(partitions_sweep):
    tmp_path, _, (since, until), proc = partitions_sweep
    assert "partition a100: 2 cells" in proc.stderr  # the plan summary
    results = cell_results(tmp_path)
    assert len(results) == 4 and all(r["status"] == "ok" for r in results), results
    for r in results:  # the sweep's own jobs (other modules' sweeps may run the same cells' names later)

        def mine(r=r):
            jobs = sacct(since, f"pp-{r['model']}-{r['gpu']}-1x{r['gpus_per_node']}-naive")
            return [j for j in jobs if int(j["JobID"].split("_")[0]) <= until]

        jobs = wait_for(mine, 30, "sacct")
        assert len(jobs) == 1, jobs  # submitted once
        job = jobs[0]
        assert job["JobID"] == r["slurm_job_id"]
        assert job["Partition"] == r["gpu"]
        assert f"gres/gpu:{r['gpu']}={r['gpus_per_node']}" in job["AllocTRES"]
        assert job["NodeList"] == f"node-{r['gpu']}"
        if r["world_size"] == 2:  # two tasks, and DDP's gradient all-reduce ran across them
            assert _step_tasks(job["JobID"]) == 2
            assert r["method_settings"]["parallel"] == "ddp"
        # issue 52: the driver ran without torch (login_env); each job ran the site's interpreter, a100's inside
        # its container (bubblewrap, the environment bound at another path), h100's outside
        if r["gpu"] == "a100" and shutil.which("bwrap"):
            inside = str(Path(CONTAINER_PYTHON).parents[1])
            assert r["interpreter"] == {"python": CONTAINER_PYTHON, "prefix": inside, "container": "bwrap"}, r
        else:
            assert r["interpreter"]["python"] == str(BIN / "python") and r["interpreter"]["container"] is None, r
    # every job (the cells' and each GPU type's preflight) loaded the site's module and saw its env (the value
    # quoted: `$HOME` and backquotes kept as written)
    preflights = [json.loads((tmp_path / f"results/site/preflight/{g}.json").read_text()) for g in ("a100", "h100")]
    ids = sorted([r["slurm_job_id"] for r in results] + [p["job_id"] for p in preflights])
    assert sorted((tmp_path / "modules.log").read_text().splitlines()) == [
        f"module load testbed-mpi/1.0 (job {i})" for i in ids
    ]
    assert sorted((tmp_path / "setup.log").read_text().splitlines()) == [f"job {i}: it's $HOME `id`" for i in ids]


def test_each_gpu_type_passed_its_preflight_in_the_sites_environment_and_its_cells_record_it(partitions_sweep):
    """One preflight job per GPU type, on its partition, before its first cell, in the environment its cells ran
    in (a100's inside the container); each cell records it. A change to that environment as the driver sees it (a
    package installed into the site python's venv) runs the preflights again, and re-measures no cell."""
    tmp_path, cfg, (since, until), _ = partitions_sweep
    results = cell_results(tmp_path)
    for gpu in ("a100", "h100"):
        rec = json.loads((tmp_path / f"results/site/preflight/{gpu}.json").read_text())
        jobs = [j for j in sacct(since, f"pp-preflight-{gpu}", preflight=True) if int(j["JobID"]) <= until]
        assert [j["JobID"] for j in jobs] == [rec["job_id"]], jobs
        assert jobs[0]["Partition"] == gpu and f"gres/gpu:{gpu}=1" in jobs[0]["AllocTRES"]
        report = rec["report"]
        assert report["torch_error"] is None and report["env"]["CUDA_VISIBLE_DEVICES"] == "0", report
        assert report["env"]["GLOO_SOCKET_IFNAME"] == "lo"  # the site's env reached the job
        if gpu == "a100" and shutil.which("bwrap"):
            assert report["python"] == CONTAINER_PYTHON and report["container"] == "bwrap", report
        else:
            assert report["python"] == str(BIN / "python") and report["container"] is None, report
        assert any("is not bound to its 1 core(s)" in w for w in rec["warnings"]), rec  # the testbed's task/none
        mine = [r for r in results if r["gpu"] == gpu]
        assert len(mine) == 2
        for r in mine:
            assert int(r["slurm_job_id"]) > int(rec["job_id"])  # the preflight came first
            assert r["preflight"]["job_id"] == rec["job_id"] and r["preflight"]["warnings"] == rec["warnings"]
            assert r["preflight"]["python"] == report["python"]
    md = (tmp_path / "results/site/preflight.md").read_text()
    assert "## a100: passed" in md and "## h100: passed" in md
    packages = next((BIN.parent / "lib").glob("python*/site-packages"))
    before = packages.stat()
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    try:
        os.utime(packages, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
        dry = snakemake(tmp_path, "cells", "-n", "--profile", PROFILE, "--configfile", str(cfg), env=env,
                        python=tmp_path / "login/bin/python")  # fmt: skip
    finally:
        os.utime(packages, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert re.search(r"preflight_gpu\s+2", dry.stdout) and "benchmark_cell" not in dry.stdout, dry.stdout[-3000:]
    dry = snakemake(tmp_path, "cells", "-n", "--profile", PROFILE, "--configfile", str(cfg), env=env,
                    python=tmp_path / "login/bin/python")  # fmt: skip
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]


def test_the_exported_launch_script_asks_what_its_cells_asked(partitions_sweep):
    """Issue 52: launch.sh of a setting measured on SLURM asks sbatch what its cells asked (partition, account, QOS,
    GPU request, CPUs for its one torchrun task per node, memory) and prepares the site's environment; submitted
    held, read back with `scontrol show job`, cancelled: nothing runs."""
    work = partitions_sweep[0]
    script = work / "results/optimal/tiny-gptneox/a100/1x2/launch.sh"
    text = script.read_text()
    assert "module load testbed-mpi/1.0" in text and "export GLOO_SOCKET_IFNAME=lo" in text
    if shutil.which("bwrap"):
        assert f"PYTHON=${{PYTHON:-{CONTAINER_PYTHON}}}" in text and "CONTAINER=${CONTAINER-'bwrap " in text
    out = subprocess.run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", str(script)], cwd=work,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    try:
        job = scontrol_job(job_id)
    finally:
        subprocess.run(["scancel", job_id], check=False)
    assert job["Partition"] == "a100" and job["JobName"] == "pp-train-tiny-gptneox-a100-1x2", job
    assert "gpu:a100:2" in job.get("TresPerNode", ""), job
    assert job["NumNodes"] in ("1", "1-1") and job["CPUs/Task"] == "2", job  # 1-1 while pending
    assert job["Account"] == "pp-lab" and job["QOS"] == "normal" and job["MinMemoryNode"] == "2G", job
    # the time-limit warning to the batch shell, the site's signal_delay_s ahead (scontrol does not show it), and a
    # requeue the script asks for after the ranks checkpointed (test_exported_launch_script_runs_under_sbatch)
    assert job["Requeue"] == "1" and "#SBATCH --signal=B:USR1@30\n" in text, job


def _calendar(work: Path) -> list[dict]:
    import polars as pl

    return pl.read_csv(work / "results/tables/calendar.csv").to_dicts()


def test_the_calendar_asks_the_scheduler_and_a_blocked_partition_starts_after_its_blocker(partitions_sweep):
    """Issue 38: the sweep's calendar.md asked `sbatch --test-only` for each setting (nothing submitted: a100 and h100
    free, a wait of ~0). A blocker then holds both a100 GPUs for 10 minutes: asked again, every a100 setting is
    expected to start when the blocker ends (the scheduler's own estimate, its EndTime), h100 still at once, so h100
    finishes first; `pretrain-planner when` says the same, the wait's source named."""
    work, cfg, _, _ = partitions_sweep
    rows = _calendar(work)
    assert {(r["gpu"], r["gpus_per_node"]) for r in rows if r["run"] == "recipe"} == {
        ("a100", 1), ("a100", 2), ("h100", 1), ("h100", 2)}  # fmt: skip
    for r in rows:  # asked as the sweep ended (a cell's job still completing is a wait the scheduler says)
        assert r["wait_basis"].startswith(f"sbatch --test-only on {r['gpu']}: expected start"), r
        assert r["first_wait_h"] is not None and r["restart_s"] > 0 and r["segments"] >= 1, r
    hold = ["sbatch", "--parsable", "-p", "a100", "--gres=gpu:a100:2", "--time=10", "-J", "pp-blocker",
            "-o", str(work / "blocker.out")]  # fmt: skip
    blocker = subprocess.run([*hold, "--wrap", "sleep 600"], capture_output=True, text=True, check=True)
    job = blocker.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: scontrol_job(job).get("JobState") == "RUNNING", 60, "the blocker to run")
        end = scontrol_job(job)["EndTime"]
        before = job_ids()
        proc = snakemake(work, "--profile", PROFILE, "--configfile", str(cfg), "--forcerun", "calendar",
                         "results/tables/calendar.csv")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
        after = _calendar(work)
        when = subprocess.run([str(BIN / "pretrain-planner"), "when", "--model", "tiny-gptneox", "--gpu", "a100",
                               "--count", "1"], cwd=work, capture_output=True, text=True)  # fmt: skip
        assert job_ids() == before  # asking submitted nothing
    finally:
        subprocess.run(["scancel", job], check=False)
    from datetime import datetime, timedelta

    blocked_until = datetime.fromisoformat(end)
    for r in after:
        start = datetime.fromisoformat(r["expected_start"])
        if r["gpu"] == "a100":
            assert abs((start - blocked_until).total_seconds()) <= 90, (r, end)
            assert r["first_wait_h"] * 60 > 5 and not r["finishes_first"], r
        else:
            assert r["first_wait_h"] * 3600 < 120, r
    for model, run in {(r["model"], r["run"]) for r in after}:  # one row finishes first: none of them ends sooner
        mine = [r for r in after if (r["model"], r["run"]) == (model, run)]
        (first,) = [r for r in mine if r["finishes_first"]]
        assert first["gpu"] == "h100", first  # the a100 rows wait for the blocker
        ends = [datetime.fromisoformat(r["expected_finish"]) for r in mine if r["expected_finish"] != "unknown"]
        assert datetime.fromisoformat(first["expected_finish"]) <= min(ends) + timedelta(minutes=1), mine
    assert when.returncode == 0, when.stderr
    (line,) = [ln for ln in when.stdout.splitlines() if ln.strip().startswith("start:")]
    shown = datetime.fromisoformat(line.split("start:")[1].split(" - ")[0].strip())
    assert abs((shown - blocked_until).total_seconds()) <= 90 + 60, (end, when.stdout)  # shown to the minute
    assert "sbatch --test-only on a100: expected start" in line and "compute: " in when.stdout, when.stdout
    assert "measured" in when.stdout, when.stdout


def test_cancelled_cell_is_retried_preempted_and_timed_out_cells_requeue(slurm_cluster, tmp_path):
    """scancel -> the job fails -> Snakemake retries it; `scontrol requeue` (preemption) and the
    time-limit warning signal (USR2, as SLURM sends it `signal_delay_s` before the limit) -> submitit
    checkpoints and requeues the same job, which restarts cleanly and completes."""
    since = last_job_id()
    cfg = _config(
        tmp_path / "c.yaml",
        {"models": ["tiny-gptneox"], "gpus_per_node": [1], "methods": ["naive", "fl"]},
        timed_steps=steps_lasting(20),
    )  # still running when it is cancelled, requeued, signalled
    driver = start_driver(tmp_path, cfg, "cells", env=PACED)
    cancel_name, requeue_name = "pp-tiny-gptneox-a100-1x1-naive", "pp-tiny-gptneox-a100-1x1-fl"
    timeout_name = "pp-tiny-gptneox-h100-1x1-fl"
    try:

        def running(name):
            return [j for j in sacct(since, name) if j["State"] == "RUNNING"]

        victim = wait_for(lambda: running(cancel_name), 120, "the cell to cancel to run")[0]
        subprocess.run(["scancel", victim["JobID"]], check=True)
        requeued = wait_for(lambda: running(requeue_name), 120, "the cell to preempt to run")[0]
        subprocess.run(["scontrol", "requeue", requeued["JobID"]], check=True)
        timed = wait_for(lambda: running(timeout_name), 120, "the cell to time out to run")[0]
        time.sleep(3)  # let submitit install its signal handlers in the tasks
        subprocess.run(["scancel", "--signal", "USR2", timed["JobID"]], check=True)
        assert driver.wait(timeout=600) == 0, (tmp_path / "driver.log").read_text()[-5000:]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    results = cell_results(tmp_path)
    assert len(results) == 4 and all(r["status"] == "ok" for r in results)
    cancelled = ended(since, cancel_name)
    assert sorted(j["State"].split()[0] for j in cancelled) == ["CANCELLED", "COMPLETED"], cancelled
    for name in (requeue_name, timeout_name):  # same job id, restarted in place, submitted once
        again = ended(since, name)
        assert len(again) == 1 and again[0]["State"] == "COMPLETED", again
    out = (tmp_path / f"results/cells/tiny-gptneox/h100/1x1/fl/submitit/{timed['JobID']}_0_log.out").read_text()
    assert "Calling checkpoint method" in out and f"Requeued job {timed['JobID']}" in out, out[-2000:]
    assert out.count("Starting with JobEnvironment") == 2 and "Job completed successfully" in out, out[-2000:]
    log = (tmp_path / "results/cells/tiny-gptneox/a100/1x1/naive/cell.log").read_text()
    assert "submitted SLURM job" in log


def test_killed_driver_reattaches_without_resubmitting(slurm_cluster, tmp_path):
    since = last_job_id()
    cfg = _config(tmp_path / "c.yaml", {"models": ["tiny-gptneox", "tiny-bert"], "gpus_per_node": [1]}, timed_steps=25)
    driver = start_driver(tmp_path, cfg, "cells")
    records = lambda: list((tmp_path / "results/cells").glob("*/*/*/*/slurm_job.json"))  # noqa: E731
    try:
        wait_for(lambda: len(records()) == 4, 120, "all four cells to be submitted")
        # let one job finish while the driver is down, others are still pending or running
        time.sleep(2)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    wait_for(lambda: any(j["State"] == "COMPLETED" for j in sacct(since)), 180, "a job to finish meanwhile", every=2)
    unlock = snakemake(tmp_path, "--profile", PROFILE, "--configfile", str(cfg), "--unlock")
    assert unlock.returncode == 0, unlock.stderr[-2000:]
    proc = snakemake(tmp_path, "cells", "--profile", PROFILE, "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = cell_results(tmp_path)
    assert len(results) == 4 and all(r["status"] == "ok" for r in results)
    logs = [p.read_text() for p in (tmp_path / "results/cells").glob("*/*/*/*/cell.log")]
    # each cell found its recorded job: still queued/running (re-attached) or finished meanwhile (collected)
    assert all("re-attached to job" in log or "finished while the driver was away" in log for log in logs), logs
    jobs = [j for j in sacct(since) if j["JobName"].startswith("pp-")]
    assert len(jobs) == 4, jobs  # zero duplicate submissions
    assert {j["JobID"] for j in jobs} == {r["slurm_job_id"] for r in results}
    # issue 53 item 5: two 1-GPU cells ran at once on each of node-a100 and node-h100; each cell records its rank's
    # cores and the node's other jobs at its start and end, so at least one of each node's pair names the other
    # (the testbed's nodes are shared by design, shared_nodes: true: recorded, still ok)
    full = [json.loads(p.read_text()) for p in (tmp_path / "results/cells").glob("*/*/*/*/result.json")]
    for node in ("node-a100", "node-h100"):
        pair = [r for r in full if r["placement"]["ranks"][0]["node"] == node]
        assert len(pair) == 2, [r["placement"] for r in full]
        named = [o for r in pair for o in r["placement"]["co_tenants"]]
        assert {o.split()[0] for o in named} & {r["slurm_job_id"] for r in pair}, [r["placement"] for r in pair]
        assert all(r["placement"]["shared_by_design"] and r["placement"]["ranks"][0]["cores"] for r in pair)


def test_exported_launch_script_runs_under_sbatch(slurm_cluster, tmp_path):
    """`sbatch launch.sh` as its header says, from an environment without the venv on PATH: the job runs the train
    stage with the interpreter the plan was exported with (srun + torchrun inside the allocation); the time-limit
    warning makes it checkpoint and requeue itself, and it resumes. The plan comes
    from a one-cell local sweep of its own, so this test needs no other module's sweep (the tests' workers: the
    SLURM tests run on one worker, tests/conftest.py)."""
    cfg = write_config(tmp_path / "c.yaml", sweep={"models": ["tiny-bert"], "gpus": ["cpu"], "gpus_per_node": [1],
                       "methods": ["naive"]}, launcher={"kind": "local"}, benchmark=bench(3))  # fmt: skip
    # its cell holds a host of its own (PP_HOST_LOCKS): it needs a plan, not a quiet host, and would wait for the
    # other workers' CPU cells to free this one
    proc = snakemake(tmp_path, "results/optimal", "--cores", "2", "--configfile", str(cfg),
                     env={"PP_HOST_LOCKS": str(tmp_path / "host-locks")})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    folder = tmp_path / "results/optimal/tiny-bert/cpu/1x1"
    out = tmp_path / "train"
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", **PACED}
    env.pop("PYTHON", None)
    steps = out / "run/steps.jsonl"
    n = steps_lasting(12)
    job = subprocess.run(["sbatch", "--parsable", "--output", str(tmp_path / "job.out"), "--open-mode=append",
                          str(folder / "launch.sh"), "--steps", str(n), "--out", str(out)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout.strip().split(";")[0]  # fmt: skip
    log = lambda: (tmp_path / "job.out").read_text() if (tmp_path / "job.out").is_file() else ""  # noqa: E731
    # the time-limit warning as SLURM sends it (--signal=B:USR1: to the batch shell) while it trains: the ranks
    # checkpoint, the script requeues the job, and its next start resumes there
    wait_for(lambda: steps.is_file() and len(steps.read_text().splitlines()) > 3, 180, f"training to start: {log()}")
    subprocess.run(["scancel", "--batch", "--signal", "USR1", job], check=True)
    final = wait_for(lambda: [j for j in sacct(int(job) - 1) if j["JobID"] == job and j["State"] in
                              ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")], 300, "the job to end")  # fmt: skip
    assert final[0]["State"] == "COMPLETED", log()[-4000:]
    assert "launch.sh: time-limit warning: checkpointing, then requeue" in log()
    assert scontrol_job(job).get("Restarts") == "1", scontrol_job(job)
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["steps"] == n and result["world_size"] == 1
    got = [json.loads(ln)["step"] for ln in steps.read_text().splitlines()]
    assert got == list(range(1, n + 1)), got  # resumed: none lost, none repeated


def test_rendezvous_port_is_outside_the_ephemeral_range():
    """A SLURM job's rendezvous port comes from its id (every rank agrees) but, unlike submitit's 20000-60000, never
    from the kernel's ephemeral range, where an outgoing connection may already hold it (EADDRINUSE in the chaos
    soak, job 375: submitit's port for it was 53167)."""
    from pretrain_planner.launch.rankjob import rendezvous_port

    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
    ports = [rendezvous_port(str(job)) for job in range(1, 5000)]
    assert all(not low <= p <= high and 1024 < p < 65536 for p in ports)
    assert len(set(ports)) == len(ports)  # consecutive jobs (which run at once) never share one
    assert rendezvous_port("375") == rendezvous_port("375")
    assert all(p > 5000 for p in (rendezvous_port(str(j), (1024, 5000)) for j in range(100)))


def test_the_plan_asks_the_scheduler_what_a_partition_holds(slurm_cluster, tmp_path):
    """Issue 37: with `ask_scheduler: true` the dry run reads each partition's limits from the controller (no job
    submitted): partition a100 has one node with 2 x gpu:a100, so its 2-node and 4-per-node cells are invalid, named
    with what scontrol and sinfo said; cpu spans two nodes, so a 2-node cell there stays in the plan."""
    import yaml
    from pretrain_planner.facade.pipeline import load

    from .conftest import REPO

    site = yaml.safe_load(Path(SITE).read_text())
    site["ask_scheduler"] = True
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(site))
    since = last_job_id()
    sweep = {"models": ["tiny-gptneox"], "gpus": ["a100", "cpu"], "nodes": [1, 2], "gpus_per_node": [2, 4],
             "methods": ["naive"]}  # fmt: skip
    config = {"sweep": sweep, "launcher": {"kind": "slurm", "site": str(tmp_path / "site.yaml")}}
    plan = {(p.cell.gpu, p.cell.nodes, p.cell.gpus_per_node): p.reason for p in load(config, REPO).planned}
    assert plan[("a100", 1, 2)] is None
    assert plan[("a100", 2, 2)].startswith("partition a100 allows at most 1 node(s) per job (scontrol show partition "
                                           "a100: MaxNodes=UNLIMITED, TotalNodes=1")  # fmt: skip
    assert "a node of partition a100 has at most 2 GPU(s)" in plan[("a100", 1, 4)]
    assert "sinfo -N -p a100 -o %G: at most 2 gpu:a100 per node" in plan[("a100", 1, 4)]
    assert plan[("cpu", 2, 2)] is None and plan[("cpu", 2, 4)] is None  # no GPU request: GPUs per node not checked
    assert last_job_id() == since  # nothing submitted


# the multi-node path: DDP's all-reduce, FSDP2's all-gather / reduce-scatter, DeepSpeed ZeRO-3's partitions
MULTI = ("naive", "naive+fsdp-full", "naive+zero3")
# The two-node sweep's model: a Llama-style decoder (grouped-query attention, SwiGLU, RMSNorm: issue 55, every
# method on the new families, hybrid sharding included); GPT-NeoX's two-node cells are the chaos soak's and
# tests/test_slurm_faults.py's.
MULTI_MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def multi_node(slurm_cluster, tmp_path_factory):
    """One sweep of 2x1 and 2x2 cells on the two-node partition `multi` (the `l40s` type of the testbed), on the
    restrictive site (conftest.restrictive_site: the QOS cap of 2 submitted jobs enforced, JobRequeue=0,
    EnforcePartLimits=NO, task/affinity), as are the module's tests after it. Its site file asks that QOS and
    lets the driver keep 4 jobs queued, more than the QOS allows (a user's other jobs count against the cap
    too): sbatch refuses some, which must wait."""
    work = tmp_path_factory.mktemp("multi")
    site = yaml.safe_load(Path(SITE).read_text())
    site["gpus"]["l40s"]["qos"] = CAP_QOS
    site["max_queued_jobs"] = 4
    (work / "site.yaml").write_text(yaml.safe_dump(site))
    sweep = {"models": [MULTI_MODEL], "gpus": ["l40s"], "nodes": [2], "gpus_per_node": [1, 2],
             "methods": [*MULTI, "naive+hsdp", "naive+zero2"]}  # fmt: skip
    cfg = write_config(work / "c.yaml", sweep=sweep, launcher={"kind": "slurm", "site": str(work / "site.yaml")},
                       benchmark=bench(3))  # fmt: skip
    with restrictive_site():  # for the module's tests that follow too (its teardown puts the testbed's back)
        since = last_job_id()
        proc = snakemake(work, "cells", "results/optimal", "--profile", PROFILE, "--configfile", str(cfg))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        yield work, since


def _most_at_once(jobs: list[dict]) -> int:
    """The most of these jobs that were in the queue (submitted, not ended) at one time, from accounting."""
    spans = [(j["Submit"], j["End"]) for j in jobs]
    return max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)


def test_a_sweep_under_a_submit_cap_waits_for_slots_and_fails_no_cell(multi_node):
    """Issue 53 item 1: on the restrictive site, nine cells (over two nodes) and the preflight under a QOS cap of 2
    submitted jobs: sbatch refuses the driver's jobs beyond the cap ("job submit limit"), and each refused cell waits
    and is submitted when a job of the sweep ends: every cell measured, none failed, never more than 2 queued.
    Before: the refusal was permanent and every cell beyond the cap failed in seconds, its retries too."""
    work, since = multi_node
    rows = subprocess.run(["sacct", "-X", "-n", "-P", "-S", "2020-01-01", "-o", "JobID,JobName,QOS,Submit,End"],
                          capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
    jobs = [dict(zip(("JobID", "JobName", "QOS", "Submit", "End"), r.split("|"), strict=True)) for r in rows]
    jobs = [j for j in jobs if j["JobID"].isdigit() and int(j["JobID"]) > since and j["JobName"].startswith("pp-")]
    cells = [j for j in jobs if "-l40s-2x" in j["JobName"]]
    assert len(cells) >= 9 and all(j["QOS"] == CAP_QOS for j in jobs), jobs
    assert _most_at_once(jobs) <= CAP, jobs
    assert slots.scheduler_cap(None, CAP_QOS) == (CAP, f"QOS {CAP_QOS} MaxSubmitJobsPerUser")  # read by sacctmgr
    results = cell_results(work)
    assert len(results) == 9 and all(r["status"] == "ok" for r in results), results  # 2x1 naive+hsdp is invalid
    logs = "\n".join(p.read_text() for p in (work / "results/cells").glob("*/*/*/*/cell.log"))
    assert "refused the job for the scheduler's submit limit" in logs  # the cap was met: back-pressure, no failure
    states = [json.loads(p.read_text()) for p in (work / "results/cells").glob("*/*/*/*/state.json")]
    assert len(states) == 9 and all(st["state"] == "done" and st["attempt"] == 1 for st in states), states


def test_waiting_jobs_cost_the_controller_one_question_per_round_not_one_per_job(slurm_cluster, tmp_path):
    """Issue 53 item 4: eight jobs waited on by eight cells' threads (the driver's `_wait_slurm`) for 12 s cost the
    controller at most one job-information call per poll round (one `squeue` for all; sdiag's counts), not one per
    job and round. Before: each waiting cell asked `scontrol show job` on its own back-off (~7 calls each)."""
    import submitit
    from pretrain_planner.launch import driver, slurm
    from pretrain_planner.launch.poller import FIRST_S
    from pretrain_planner.launch.request import JobRequest, RuleLog

    ids = []
    for i in range(8):
        out = subprocess.run(["sbatch", "--parsable", "-p", "cpu", "-t", "2", "-J", f"pp-rpc-{i}", "-o", "/dev/null",
                              "--wrap", "sleep 60"], capture_output=True, text=True, check=True)  # fmt: skip
        ids.append(out.stdout.strip().split(";")[0])
    req = JobRequest(
        fn=None, name="rpc", kind="slurm", folder=tmp_path, nodes=1, gpus_per_node=1, slurm={"site": SITE}
    )  # fmt: skip (the testbed's site file: poll_max_s 2)
    log, stopped = RuleLog(tmp_path / "wait.log"), []

    def wait(job_id: str) -> None:
        try:
            slurm._wait_slurm(submitit.SlurmJob(folder=tmp_path, job_id=job_id), req, log)
        except driver.DriverStopped:
            stopped.append(job_id)

    threads = [threading.Thread(target=wait, args=(j,)) for j in ids]
    kinds = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE")
    try:
        before, t0 = rpc_counts(), time.time()
        for t in threads:
            t.start()
        time.sleep(12)
        driver.STOP.set()
        for t in threads:
            t.join(30)
        window, after = time.time() - t0, rpc_counts()
    finally:
        driver.STOP.clear()
        subprocess.run(["scancel", *ids], check=False)
    asked = sum(after.get(k, 0) - before.get(k, 0) for k in kinds)
    assert sorted(stopped) == sorted(ids)  # every thread waited the whole window
    assert asked <= window / FIRST_S + 2, f"{asked} job-information calls in {window:.0f} s for {len(ids)} jobs"
    assert asked >= 3  # the jobs were asked about at all


@pytest.mark.parametrize("gpn", [1, 2])
@pytest.mark.parametrize("method", MULTI)
def test_a_multi_node_cell_is_one_job_over_both_nodes_with_its_ranks_placed(multi_node, method, gpn):
    """Issue 37: a 2 x G cell is one SLURM job spanning node-mn0 and node-mn1, one task per rank, the ranks meeting
    through SLURM's environment; its result records each rank's node, the layout, and its step split into
    collectives and compute, the 'interconnect' named as the loopback it is on one machine."""
    work, since = multi_node
    (r,) = [x for x in cell_results(work) if x["method"] == method and x["gpus_per_node"] == gpn]
    assert r["status"] == "ok" and r["nodes"] == 2 and r["world_size"] == 2 * gpn, r
    (job,) = wait_for(lambda: sacct(since, f"pp-{MULTI_MODEL}-l40s-2x{gpn}-{method}"), 30, "sacct")
    assert job["Partition"] == "multi" and job["NodeList"] == "node-mn[0-1]", job
    assert f"gres/gpu:l40s={2 * gpn}" in job["AllocTRES"], job
    assert _step_tasks(job["JobID"]) == 2 * gpn
    split = r["step_split"]
    assert split["nodes"] == {"node-mn0": list(range(gpn)), "node-mn1": list(range(gpn, 2 * gpn))}, split
    assert sorted(d["node"] for d in r["devices"]["ranks"]) == sorted(["node-mn0", "node-mn1"] * gpn)
    assert split["interconnect"].startswith("loopback: every rank on host"), split["interconnect"]
    assert "2 SLURM node(s)" in split["interconnect"]
    assert 0 < split["collective_s"] < r["step_time_s"] and split["syncs_per_step"] >= 1
    assert split["compute_s"] == pytest.approx(r["step_time_s"] - split["collective_s"])
    settings = r["method_settings"]
    expected = "fsdp2" if "fsdp" in method else "deepspeed" if "zero" in method else "ddp"
    assert settings["parallel"] == expected, settings.get("parallel")


def test_hybrid_sharding_runs_on_two_nodes_as_a_replica_per_node(multi_node):
    """Issue 37: a 2 x 2 `naive+hsdp` cell runs FSDP2 on a 2-D mesh (replicate over the two nodes, shard over each
    node's two ranks) as one job over both nodes; its 2 x 1 cell is invalid in the plan (nothing to shard within a
    node), with the reason."""
    work, _ = multi_node
    (r,) = [x for x in cell_results(work) if x["method"] == "naive+hsdp"]
    assert r["status"] == "ok" and (r["nodes"], r["gpus_per_node"]) == (2, 2), r
    mesh = r["method_settings"]["fsdp"]["mesh"]
    assert mesh["shape"] == [2, 2] and mesh["dims"] == ["replicate", "shard"], mesh
    assert r["method_settings"]["fsdp_policy"]["mesh"] == {"replicate": 2, "shard": 2}
    assert r["step_split"]["nodes"] == {"node-mn0": [0, 1], "node-mn1": [2, 3]}
    plan = (work / "results/plan.csv").read_text()
    assert "naive+hsdp" in plan and "hsdp shards among a node's GPUs and replicates across nodes" in plan


def test_the_exported_two_node_plan_runs_under_sbatch(multi_node):
    """Issue 37: `sbatch launch.sh` of the 2 x 1 plan the multi-node sweep exported runs its training as its header
    says: one torchrun per node via srun, the rendezvous at the first node of SLURM_JOB_NODELIST; both nodes train."""
    work, _ = multi_node
    folder = work / f"results/optimal/{MULTI_MODEL}/l40s/2x1"
    out = work / "train-2x1"
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHON", None)
    since = last_job_id()
    proc = subprocess.run(["sbatch", "--wait", "--partition", "multi", "--output", str(work / "train.out"),
                           str(folder / "launch.sh"), "--steps", "3", "--device", "cpu", "--out", str(out)],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    log = (work / "train.out").read_text() if (work / "train.out").is_file() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + log[-4000:]
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["steps"] == 3, result
    assert result["world_size"] == 2 and result["nodes"] == 2, result
    (job,) = wait_for(lambda: sacct(since, f"pp-train-{MULTI_MODEL}-l40s-2x1"), 30, "sacct")
    assert job["NodeList"] == "node-mn[0-1]" and job["State"] == "COMPLETED", job
    assert _step_tasks(job["JobID"]) == 2  # one torchrun per node


def test_the_train_stage_on_two_nodes_resumes_in_new_jobs_where_the_site_refuses_requeue(multi_node):
    """Issues 37 and 53: `pretrain-planner train` of the exported 2 x 1 plan (in the sweep's folder: its recorded
    config, the slurm launcher, CPU ranks) is one job over both nodes. On the restrictive site (JobRequeue=0) with its
    jobs not requeueable (`extra_sbatch: {no-requeue: true}` for l40s), each pre-emption signal makes it checkpoint
    and try to requeue itself, which the site refuses; the driver then submits a new job that resumes from the
    checkpoint: three jobs for two signals, every step once, in order. Before: the refused requeue failed the run."""
    work, _ = multi_node
    site_file = work / "site.yaml"
    original = site_file.read_text()
    site = yaml.safe_load(original)
    site["gpus"]["l40s"]["extra_sbatch"] = {"no-requeue": True}
    site_file.write_text(yaml.safe_dump(site))
    since = last_job_id()
    out = work / "train-stage-2x1"
    steps = out / "run/steps.jsonl"
    lines = lambda: len(steps.read_text().splitlines()) if steps.is_file() else 0  # noqa: E731
    cmd = [str(BIN / "pretrain-planner"), "train", "--plan", f"results/optimal/{MULTI_MODEL}/l40s/2x1",
           "--steps", str(steps_lasting(20)), "--out", str(out)]  # fmt: skip
    with open(work / "train-stage.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", **PACED})  # fmt: skip
    name = f"pp-train-{MULTI_MODEL}-l40s-2x1"
    signalled: list[str] = []

    def running() -> list[dict]:
        return [j for j in sacct(since, name) if j["State"] == "RUNNING" and j["JobID"] not in signalled]

    try:
        for _ in range(2):
            job = wait_for(running, 180, "the train job")[0]
            at = lines()
            wait_for(lambda at=at: lines() > at + 3, 180, "training to go on")
            subprocess.run(["scancel", "--signal", "USR2", job["JobID"]], check=True)
            signalled.append(job["JobID"])
        assert proc.wait(timeout=600) == 0, (work / "train-stage.log").read_text()[-5000:]
    finally:
        site_file.write_text(original)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    result = json.loads((out / "result.json").read_text())
    done = wait_for(lambda: [j for j in sacct(since, name) if j["State"] == "COMPLETED"], 30, "sacct to see it end")
    assert result["world_size"] == 2 and result["nodes"] == 2 and result["slurm_job_id"] == done[0]["JobID"], result
    every = sacct(since, name)
    assert len(every) == 3 and all(j["NodeList"] == "node-mn[0-1]" for j in every), every
    assert {j["JobID"] for j in every} == {*signalled, done[0]["JobID"]}
    log = (out / "launch.log").read_text()
    assert log.count("could not requeue itself (the site refused `scontrol requeue`): submitting a new job") == 2, log
    got = [json.loads(ln)["step"] for ln in steps.read_text().splitlines()]
    assert got == list(range(1, len(got) + 1)) and len(got) == result["steps"]  # resumed: none lost, none repeated
