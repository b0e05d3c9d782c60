"""The driver's guard on every way of running Snakemake (issue 26): the `snakemake` script, `python -m snakemake`,
Snakemake's Python API and a profile that sets `dryrun:`. Whichever it is, a run that executes jobs takes the driver
lock (a second driver is refused), moves a damaged result aside and ends what a killed driver left running; a dry
run changes nothing and says what the next run will do. No torch: the target is results/plan.csv."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pretrain_planner.launch import driver
from pretrain_planner.launch.hostpool import start_time

from .conftest import BIN, REPO, write_config

CELL = "results/cells/tiny-gptneox/cpu/1x1/naive"
TARGET = "results/plan.csv"

API_SCRIPT = """
import sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, DAGSettings, ExecutionSettings, OutputSettings, ResourceSettings

snakefile, work, cfg, target = sys.argv[1:5]
with SnakemakeApi(OutputSettings()) as api:
    wf = api.workflow(resource_settings=ResourceSettings(cores=1), snakefile=Path(snakefile), workdir=Path(work),
                      config_settings=ConfigSettings(configfiles=[Path(cfg)]))
    wf.dag(DAGSettings(targets={target})).execute_workflow(executor="local",
                                                            execution_settings=ExecutionSettings(use_threads=True))
"""


def _command(style: str, work: Path, cfg: Path) -> list[str]:
    common = ["-s", str(REPO / "Snakefile"), "-d", str(work), "--configfile", str(cfg), "-c1", "--force-use-threads"]
    if style == "script":
        return [str(BIN / "snakemake"), *common, TARGET]
    if style == "module":
        return [sys.executable, "-m", "snakemake", *common, TARGET]
    if style == "api":
        (work / "api_run.py").write_text(API_SCRIPT)
        return [sys.executable, str(work / "api_run.py"), str(REPO / "Snakefile"), str(work), str(cfg), TARGET]
    if style == "dryrun-profile":
        profile = work / "dry-profile"
        profile.mkdir(exist_ok=True)
        (profile / "config.yaml").write_text("dryrun: true\ncores: 1\n")
        return [str(BIN / "snakemake"), *common, "--profile", str(profile), TARGET]
    raise ValueError(style)


def _run(style: str, work: Path, cfg: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PP_HOST_LOCKS": str(work / "host-locks")}
    return subprocess.run(_command(style, work, cfg), cwd=work, capture_output=True, text=True, env=env, timeout=300)


def _setup(work: Path) -> Path:
    """A one-cell sweep whose cell has a truncated result.json beside its steps (a damaged result), and a local
    job record left by a killed driver whose rank (a `sleep`) still runs."""
    cfg = write_config(work / "c.yaml", sweep={"models": ["tiny-gptneox"], "gpus": ["cpu"], "methods": ["naive"]},
                       launcher={"kind": "local"})  # fmt: skip
    cell = work / CELL
    cell.mkdir(parents=True)
    (cell / "result.json").write_text('{"status": "ok", "model": "tiny-g')
    (cell / "steps.jsonl").write_text('{"step": 1}\n')
    return cfg


def _orphan(work: Path) -> subprocess.Popen:
    """A rank left running by a driver that died: recorded in local_job.json as the local launcher does."""
    rank = subprocess.Popen(["sleep", "300"], start_new_session=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    cell = work / CELL
    (cell / "local_ranks").mkdir(exist_ok=True)
    (cell / "local_ranks/rank0.json").write_text(json.dumps({"pid": rank.pid, "start": start_time(rank.pid),
                                                             "job_id": "4242"}))  # fmt: skip
    (cell / "local_job.json").write_text(json.dumps({"job_id": "4242", "controller_pid": None, "driver_pid": dead.pid,
                                                     "driver_start": 1, "host": socket.gethostname()}))  # fmt: skip
    return rank


STYLES = ["script", "module", "api", "dryrun-profile"]


@pytest.mark.slow  # Snakemake in a subprocess
@pytest.mark.parametrize("style", STYLES)
def test_a_second_driver_is_refused_however_snakemake_is_run(tmp_path, style):
    """A live driver holds results/ (its lock file and record, as `acquire` leaves them): an executing run is
    refused, naming it, and touches nothing; a dry run is not refused and moves nothing."""
    cfg = _setup(tmp_path)
    results = tmp_path / "results"
    holder = subprocess.Popen(["sleep", "120"])
    lock = open(results / driver.LOCKFILE, "a")  # noqa: SIM115 - held for the test
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (results / driver.RECORD).write_text(json.dumps({
            "pid": holder.pid, "pid_start": start_time(holder.pid), "host": socket.gethostname(), "argv": ["snakemake"],
            "started_at": "earlier", "heartbeat": time.time(), "token": "theirs"}))  # fmt: skip
        proc = _run(style, tmp_path, cfg)
    finally:
        lock.close()
        holder.kill()
        holder.wait()
    out = proc.stdout + proc.stderr
    assert (tmp_path / CELL / "result.json").is_file(), "nothing is moved while another driver works"
    if style == "dryrun-profile":
        assert proc.returncode == 0, out[-3000:]
        assert "another driver" not in out and "the next run (not a dry run) moves it aside" in out, out[-3000:]
        assert not (tmp_path / TARGET).exists()
    else:
        assert proc.returncode != 0, out[-3000:]
        assert f"another driver is working on results: pid {holder.pid}" in out, out[-3000:]
        assert not (tmp_path / TARGET).exists()


@pytest.mark.slow  # Snakemake in a subprocess
@pytest.mark.parametrize("style", STYLES)
def test_repair_and_orphan_clean_up_however_snakemake_is_run(tmp_path, style):
    """No other driver: an executing run moves the damaged result to damaged/<time>/ (WHY.txt), ends the dead
    driver's rank and leaves no driver record behind; a dry run only says what the next run will do."""
    cfg = _setup(tmp_path)
    rank = _orphan(tmp_path)
    try:
        proc = _run(style, tmp_path, cfg)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        moved = list((tmp_path / CELL / "damaged").glob("*/WHY.txt"))
        if style == "dryrun-profile":
            assert not moved and (tmp_path / CELL / "result.json").is_file()
            assert "the next run (not a dry run) moves it aside" in out, out[-3000:]
            assert rank.poll() is None and not (tmp_path / TARGET).exists()
        else:
            assert len(moved) == 1 and "result.json" in moved[0].read_text(), out[-3000:]
            assert not (tmp_path / CELL / "result.json").exists()
            assert f"damaged result in {tmp_path / CELL}" in out or "damaged result in results/cells" in out
            assert "ended a job an earlier driver left running" in out, out[-3000:]
            rank.wait(timeout=10)
            assert (tmp_path / TARGET).is_file()
        assert not (tmp_path / "results" / driver.RECORD).exists()  # released (or never taken: a dry run)
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()


def test_which_executors_run_jobs():
    """What the guard reads: the executor plugin Snakemake passes to Workflow.execute and its process mode."""
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry
    from snakemake_interface_executor_plugins.settings import ExecMode

    class Workflow:
        def __init__(self, mode):
            self.is_main_process = mode == ExecMode.DEFAULT

    registry = ExecutorPluginRegistry()
    local, dry, touch = (registry.get_plugin(n) for n in ("local", "dryrun", "touch"))
    assert driver.executing(Workflow(ExecMode.DEFAULT), local)
    assert not driver.executing(Workflow(ExecMode.DEFAULT), dry)
    assert not driver.executing(Workflow(ExecMode.DEFAULT), touch)
    assert not driver.executing(Workflow(ExecMode.SUBPROCESS), local)  # a job's own Snakemake process
    assert not driver.executing(Workflow(ExecMode.DEFAULT), None)  # --unlock, --lint, --report: nothing executes


# A stop signal landing while the main thread holds Snakemake's scheduler lock: JobScheduler.schedule holds it while
# it selects jobs, and JobScheduler.exit_gracefully (Snakemake's SIGTERM handler, the real function here) takes it.
STOP_SCRIPT = """
import functools, os, signal, threading, time, types
from snakemake.scheduling.job_scheduler import JobScheduler
from pretrain_planner.launch import driver

scheduler = types.SimpleNamespace(_lock=threading.Lock(), _open_jobs=threading.Semaphore(0), _user_kill=None)
signal.signal(signal.SIGTERM, functools.partial(JobScheduler.exit_gracefully, scheduler))
driver.install_stop_handlers()
driver.install_stop_handlers()  # a second onstart changes nothing
driver.register("pp-cell", kind="slurm", job_id="42", what="cell")


def cell():  # a cell waiting on its SLURM job leaves at once on STOP
    driver.STOP.wait()
    driver.unregister("pp-cell")


threading.Thread(target=cell).start()
with scheduler._lock:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)
    print("stop set in the main thread:", driver.STOP.is_set(), flush=True)
print("snakemake's handler ran:", scheduler._open_jobs.acquire(timeout=20), scheduler._user_kill, flush=True)
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
    print("no KeyboardInterrupt", flush=True)
except KeyboardInterrupt:
    print("Ctrl-C: KeyboardInterrupt", flush=True)
"""


@pytest.mark.slow  # Snakemake in a subprocess
def test_a_stop_signal_while_snakemake_holds_its_scheduler_lock_still_stops_the_driver(tmp_path):
    """SIGTERM handled while the main thread holds the scheduler's lock: the handler set STOP at once, named the
    SLURM job it left queued (as it was when the signal came: its cell's thread leaves at once), and Snakemake's
    own handler ran (the driver stops) instead of waiting for ever on its own thread: a handler that takes that
    lock itself would wait on the thread it interrupted and never return; Ctrl-C still raises KeyboardInterrupt."""
    script = tmp_path / "stop.py"
    script.write_text(STOP_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO / "workflow")})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["stop set in the main thread: True", "snakemake's handler ran: True graceful",
                                        "Ctrl-C: KeyboardInterrupt"], proc.stdout  # fmt: skip
    assert "stopping on request" in proc.stderr and "left queued on SLURM (1)" in proc.stderr, proc.stderr
    assert "pp-cell (job 42)" in proc.stderr, proc.stderr
    assert proc.stderr.count("stopping on request") == 1, proc.stderr  # said once, not again at Ctrl-C
