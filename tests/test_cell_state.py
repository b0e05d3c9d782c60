"""A cell says where it stands as data: its state record (launch.state) written by the driver, rank 0's
progress lines copied into its log, one console line when it ends; `status` and `status --watch` read them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from pretrain_planner.launch import progress
from pretrain_planner.launch.cell import cell_line, run_cell
from pretrain_planner.launch.state import STATE_FILE, read_state, write_state
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.grid import Cell
from pretrain_planner.planning.spec import cell_spec
from pretrain_planner.tables import status

from .conftest import REPO, P, cell_result, sections, snakemake, write_config, write_set

EXE = Path(sys.executable).parent / "pretrain-planner"
CATALOG = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")


def _spec(folder: Path, kind: str, method: str = "naive") -> dict:
    config = {"benchmark": {"warmup_steps": 1, "timed_steps": 3, "max_micro_batch": 4, "seed": 0, "max_spread": 50},
              "launcher": {"kind": kind, "timeout_min": 5}}  # fmt: skip
    return cell_spec(Cell("tiny-gptneox", "cpu", 1, 1, method), CATALOG, *sections(config), str(folder / "result.json"),
                     str(folder / "steps.jsonl"))  # fmt: skip


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_a_local_cell_goes_submitted_running_done_with_its_job_id_and_progress(tmp_path, capfd):
    """The real local launcher: while the job runs, the record names its job and says `running` (rank 0 has
    reported), and status shows the latest progress line; at the end `done` with the result's status, the
    progress (each micro-batch trial, the last timed step) is in cell.log, and the console has one line."""
    folder = tmp_path / "cells/tiny-gptneox/cpu/1x1/naive"
    seen: list[tuple[str, str | None, str | None]] = []
    stop = threading.Event()

    def observe() -> None:
        while not stop.wait(0.1):
            rec = read_state(folder)
            if rec is not None:
                st = status.cell_state(folder)
                seen.append((rec["state"], rec.get("job_id"), st.progress if st.state == "running" else None))

    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    try:
        run_cell(_spec(folder, "local"), str(folder / "cell.log"))
    finally:
        stop.set()
        watcher.join()
    rec = read_state(folder)
    assert rec["state"] == "done" and rec["result_status"] == "ok" and rec["launcher"] == "local"
    assert rec["attempt"] == 1 and rec["job_id"] and rec["job_ids"] == [rec["job_id"]]
    assert rec["submitted_at"] and rec["running_at"] and rec["finished_at"] and rec["error"] is None
    order = [["submitted", "running", "done"].index(s) for s, _, _ in seen]
    assert order[0] == 0 and 1 in order and order == sorted(order), seen  # submitted, running, then done
    assert any(s == "running" and j == rec["job_id"] for s, j, _ in seen)  # the job's id while it ran
    assert any(p for _, _, p in seen), "status showed no progress line while the cell ran"
    log = (folder / "cell.log").read_text()
    assert "progress: rank 0 started on" in log
    assert "progress: micro-batch search trial 1: micro-batch 4 fits" in log
    assert "progress: timed step 3 of 3" in log and "(elapsed" in log
    assert status.cell_state(folder).state == "ok"
    err = capfd.readouterr().err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("cell ")]
    assert line.startswith("cell tiny-gptneox/cpu/1x1/naive: ok, micro-batch 4 x 4, step ")
    assert "tokens/s" in line


def test_a_failing_debug_cell_records_the_error_and_its_attempts(tmp_path, capfd):
    """The in-process (debug) path: a cell that raises is `failed` with the error, on the console too; the
    retry is attempt 2 and its log says what attempt 1 left."""
    folder = tmp_path / "cells/tiny-gptneox/cpu/1x1/naive"
    spec = _spec(folder, "debug")
    spec["model"]["family"] = "no-such-family"
    for attempt in (1, 2):
        with pytest.raises(Exception):  # noqa: B017 - whatever the trainer raises: the record is the subject
            run_cell(spec, str(folder / "cell.log"))
        rec = read_state(folder)
        assert rec["state"] == "failed" and rec["attempt"] == attempt and rec["launcher"] == "debug"
        assert "no-such-family" in rec["error"] and rec["job_id"] is None
    assert "state record: attempt 1 failed (no job yet): " in (folder / "cell.log").read_text()
    st = status.cell_state(folder)
    assert st.state == "failed" and "no-such-family" in st.detail
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("cell ")]
    assert len(lines) == 2 and lines[0].startswith("cell tiny-gptneox/cpu/1x1/naive: failed (")
    assert ", attempt 2)" in lines[1] and "no-such-family" in lines[1]


def test_an_in_process_sharded_cell_takes_its_rank_variables_back(tmp_path, monkeypatch):
    """A one-rank sharded cell in the driver's process (the debug launcher) starts a process group of its own and
    sets RANK, LOCAL_RANK and WORLD_SIZE for DeepSpeed; closing it takes them back, so the driver (and whatever it
    starts later: an HF Trainer, torchrun) sees no distributed run. Before, they stayed set."""
    from pretrain_planner.trainer.config import RunConfig
    from pretrain_planner.trainer.rank import close_rank, init_rank

    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    cfg = RunConfig.from_spec(_spec(tmp_path / "cell", "debug", method="fl+zero2+off"))
    env = init_rank(cfg)
    try:
        assert env.backend is not None and os.environ["WORLD_SIZE"] == "1"
    finally:
        close_rank(env)
    assert {v: os.environ.get(v) for v in ("RANK", "LOCAL_RANK", "WORLD_SIZE")} == dict.fromkeys(
        ("RANK", "LOCAL_RANK", "WORLD_SIZE"))  # fmt: skip


def test_the_driver_follows_the_job_id_and_progress_and_a_reattached_job_runs_on(tmp_path):
    """What the driver's follower does each poll, with the launcher's real registry (driver.register): a job
    re-attached to that the last driver left running is running at once; a new job is submitted until rank 0's
    first progress line, which is copied into the log."""
    from pretrain_planner.launch import driver
    from pretrain_planner.launch.cell import _Follow
    from pretrain_planner.launch.request import RuleLog
    from pretrain_planner.launch.state import StateRecord

    for job, expect in (("42", "running"), ("43", "submitted")):
        folder = tmp_path / job
        write_state(folder, "running", launcher="slurm", job_id="42", job_ids=["42"], attempt=1, running_at="T",
                    driver={"pid": 1, "host": "elsewhere"})  # fmt: skip
        record = StateRecord(folder, "slurm", "cell.log")
        assert record.previous_note() == (
            "attempt 1 was left running (job 42, slurm launcher, since T) by driver pid 1 on elsewhere, which did not "
            "finish it"
        )
        record.update("submitted")
        follow = _Follow(f"pp-test-{job}", record, folder / progress.PROGRESS_FILE, RuleLog(folder / "cell.log"))
        driver.register(f"pp-test-{job}", kind="slurm", job_id=job, what="test")
        try:
            follow.poll()
        finally:
            driver.unregister(f"pp-test-{job}")
        rec = read_state(folder)
        assert (rec["state"], rec["job_id"], rec["attempt"]) == (expect, job, 2)
        assert rec["job_ids"] == sorted({"42", job})
    (folder / progress.PROGRESS_FILE).write_text(json.dumps({"elapsed_s": 4, "units": 1, "what": "timed step 1 of 5"})
                                                 + "\n")  # fmt: skip
    follow.poll()
    assert read_state(folder)["state"] == "running"
    assert "progress: timed step 1 of 5 (elapsed 4 s)" in (folder / "cell.log").read_text()
    follow.poll()  # each line is copied once
    assert (folder / "cell.log").read_text().count("timed step 1 of 5") == 1


def test_the_console_line_of_each_outcome():
    cell = {"model": "m", "gpu": "a100", "nodes": 1, "gpus_per_node": 4, "method": "fl"}
    ok = {"status": "ok", "micro_batch": 8, "grad_accum_steps": 2, "step_time_s": 0.51234, "tokens_per_s": 1.2e5}
    line = cell_line(cell, ok, None, 42)
    assert line == "cell m/a100/1x4/fl: ok, micro-batch 8 x 2, step 0.5123 s, 120,000 tokens/s (42 s)"
    suspect = {**ok, "suspect": True, "suspect_reason": "MFU 97% above 85%"}
    assert cell_line(cell, suspect, None, 42).endswith("120,000 tokens/s, suspect: MFU 97% above 85% (42 s)")
    oom = {"status": "oom", "reason": "micro-batch 1 does not fit on every rank"}
    assert cell_line(cell, oom, None, 3) == "cell m/a100/1x4/fl: oom, micro-batch 1 does not fit on every rank (3 s)"
    noisy = {**ok, "status": "noisy", "samples_per_s": 3.0, "tokens_per_s": None, "reason": "spread 2.4 above 1.5"}
    assert cell_line(cell, noisy, None, 9) == (
        "cell m/a100/1x4/fl: noisy, micro-batch 8 x 2, step 0.5123 s, 3.0 samples/s, spread 2.4 above 1.5 (9 s)"
    )
    assert cell_line(cell, None, "job 7 did not complete: boom", 5, 2) == (
        "cell m/a100/1x4/fl: failed (5 s, attempt 2): job 7 did not complete: boom"
    )


# ------------------------------------------------------------------------------------------- progress marks


def test_progress_marks_are_rate_limited_except_the_ones_that_must_be_seen(tmp_path):
    path = tmp_path / progress.PROGRESS_FILE
    progress.mark(1, "nowhere to go")  # no file configured: nothing written, the units still counted
    assert progress.current() == 1 and not path.exists()
    progress.report_to(path)
    try:
        for k in range(1, 101):
            progress.mark(k, f"step {k}", always=k in (50, 100))
    finally:
        progress.report_to(None)
    progress.mark(101, "after")
    lines, offset = progress.read_lines(path)
    assert [e["what"] for e in lines] == ["step 1", "step 50", "step 100"]  # 100 marks well within 2 s
    assert all(e["elapsed_s"] >= 0 for e in lines) and offset == path.stat().st_size
    with open(path, "a") as fh:
        fh.write('{"what": "half a li')  # a line being written is left for the next read
    more, offset2 = progress.read_lines(path, offset)
    assert more == [] and offset2 == offset
    assert progress.last_line(path)["what"] == "step 100"


# ------------------------------------------------------------------------------------------- status and --watch


def _folder(root: Path) -> Path:
    """Cells of each recorded state: done (ok, oom), running with progress, submitted, failed, pending."""
    cells = [cell_result(P, "a100", 1, k, "fl", s, 10.0) for k, s in ((1, "ok"), (2, "oom"))]
    cells += [cell_result(P, "h100", 1, k, "fl", "ok", 10.0) for k in (1, 2, 4, 8)]
    write_set(root, cells)
    cell = root / f"cells/{P}"
    for k in (1, 2, 4, 8):
        (cell / f"h100/1x{k}/fl/result.json").unlink()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = {"pid": dead.pid, "start": 1, "host": os.uname().nodename}
    write_state(cell / "h100/1x1/fl", "running", launcher="local", job_id="31", attempt=1,
                running_at="2026-01-01T00:00:05", driver=gone)  # fmt: skip
    (cell / "h100/1x1/fl" / progress.PROGRESS_FILE).write_text(
        json.dumps({"t": 1, "elapsed_s": 3.2, "units": 1, "what": "micro-batch search trial 1: micro-batch 4 fits"})
        + "\n"
        + json.dumps({"t": 2, "elapsed_s": 9.0, "units": 2, "what": "timed step 2 of 5 (0.1 s)"})
        + "\n"
    )
    write_state(cell / "h100/1x2/fl", "submitted", launcher="slurm", job_id=None, attempt=2,
                submitted_at="2026-01-01T00:00:00")  # fmt: skip
    write_state(cell / "h100/1x4/fl", "failed", launcher="slurm", job_id="40", error="job 40 did not complete: boom")
    return root


def test_status_reads_the_state_records(tmp_path):
    root = _folder(tmp_path / "results")
    cell = root / f"cells/{P}/h100"
    running = status.cell_state(cell / "1x1/fl")
    assert running.state == "running" and running.job_id == "31"
    assert running.progress == "timed step 2 of 5 (0.1 s) (elapsed 9 s)"
    assert "job 31 (local), attempt 1, since 2026-01-01T00:00:05" in running.detail
    assert "its driver (pid" in running.detail and "has ended" in running.detail  # the driver is gone
    submitted = status.cell_state(cell / "1x2/fl")
    assert submitted.state == "submitted" and "no job id yet" in submitted.detail and "driver" not in submitted.detail
    assert status.cell_state(cell / "1x4/fl")[:3] == ("failed", None, "job 40 did not complete: boom")
    assert status.cell_state(cell / "1x8/fl").state == "pending"
    (cell / "1x8/fl/submitit").mkdir()  # no record (an older version's folder): its files say it runs
    assert status.cell_state(cell / "1x8/fl").state == "running"
    (cell / "1x8/fl" / STATE_FILE).write_text("{not json")
    assert status.cell_state(cell / "1x8/fl").state == "running"  # an unreadable record is no record


def test_the_watch_frame(tmp_path):
    root = _folder(tmp_path / "results")
    summary, cells = status.sweep_status(root, status.load_plan(root))
    assert dict(summary.select("gpu", "submitted").iter_rows())["h100"] == 1
    frame = status.watch_frame(cells, str(root), "plan.csv", 2, "driver: none", stamp="T").splitlines()
    assert frame[0] == f"sweep status of {root} at T (plan: plan.csv); every 2 s, Ctrl-C to leave"
    header = frame[2].split()
    assert header == ["gpu", "cells", "done", "running", "submitted", "pending", "failed", "pruned", "GPU-hours",
                      "spent", "/", "bound"]  # fmt: skip
    rows = {ln.split()[0]: ln.split() for ln in frame[4:8] if not ln.startswith("-")}
    assert rows["a100"][:8] == ["a100", "2", "2", "0", "0", "0", "0", "0"]
    assert rows["a100"][8:] == [f"{360 * 3 / 3600:.2f}", "/", "3.00"]  # spent 360 s x (1 + 2) GPUs, bound 1 + 2
    assert rows["h100"][:8] == ["h100", "4", "0", "1", "1", "1", "1", "0"]
    assert rows["total"][8:] == [f"{360 * 3 / 3600:.2f}", "/", "18.00"]
    text = "\n".join(frame)
    assert "done: 1 ok, 1 oom" in text
    assert f"{P}/h100/1x1/fl: running: job 31 (local)" in text and "timed step 2 of 5" in text
    assert f"{P}/h100/1x4/fl: failed: job 40 did not complete: boom" in text
    assert "nothing is running or waiting" not in text


@pytest.mark.slow  # the CLI's watch in a subprocess, on a clock
def test_watch_refreshes_until_nothing_is_left_to_do(tmp_path):
    """`status --watch` on a live folder prints frames until its last cell's result lands, then stops."""
    root = tmp_path / "results"
    write_set(root, [cell_result(P, "a100", 1, 1, "fl", "ok", 10.0)])
    folder = root / f"cells/{P}/a100/1x1/fl"
    result = (folder / "result.json").read_text()
    (folder / "result.json").unlink()
    write_state(folder, "running", launcher="local", job_id="5", attempt=1)
    proc = subprocess.Popen([str(EXE), "status", "--results", str(root), "--watch", "--every", "0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)  # fmt: skip
    time.sleep(3)  # the command starts (imports), then shows a few frames of the running cell
    assert proc.poll() is None, proc.communicate()
    (folder / "result.json").write_text(result)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    frames = out.split("sweep status of ")[1:]
    assert len(frames) >= 2
    assert f"{P}/a100/1x1/fl: running: job 5" in frames[0]
    assert "nothing is running or waiting" in frames[-1] and "running:" not in frames[-1]
    assert "\033[" not in out  # not a terminal: frames one after another, no screen clearing


@pytest.mark.slow  # the CLI's watch in a subprocess, on a clock
def test_watch_on_a_finished_sweep_shows_one_frame_and_ends(tmp_path):
    root = tmp_path / "results"
    write_set(root, [cell_result(P, "a100", 1, k, "fl", "ok", 10.0) for k in (1, 2)])
    proc = subprocess.run([str(EXE), "status", "--results", str(root), "--watch", "--every", "0.1"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("sweep status of ") == 1 and "done: 2 ok" in proc.stdout
    proc = subprocess.run([str(EXE), "status", "--results", str(root), "--watch", "--json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)  # fmt: skip
    assert proc.returncode == 1 and "--watch shows a refreshing table" in proc.stderr


# ------------------------------------------------------------------------------------------- the console


@pytest.mark.slow
def test_the_sweep_console_shows_progress_and_one_line_per_cell(tmp_path):
    """Through Snakemake with the local profile: no per-rule blocks ("Shell command: None", output and
    changed-file lists), Snakemake's progress kept, one line per finished cell."""
    profile = yaml.safe_load((REPO / "cluster/local/config.yaml").read_text())
    assert "printshellcmds" not in profile
    cfg = write_config(
        tmp_path / "c.yaml",
        sweep={"models": ["tiny-gptneox"], "gpus": ["cpu"], "gpus_per_node": [1], "methods": ["naive"]},
        launcher={"kind": "debug"},
        benchmark={"warmup_steps": 1, "timed_steps": 3, "max_micro_batch": 4, "max_spread": 50},
    )
    proc = snakemake(tmp_path, "--profile", str(REPO / "cluster/local"), "--cores", "2", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "Shell command" not in out and "localrule" not in out and "reason: Missing output" not in out
    assert "steps (100%) done" in out and "Finished jobid" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("cell ")]
    assert line.startswith("cell tiny-gptneox/cpu/1x1/naive: ok, micro-batch 4 x 4, step ")
    # the settings and plan header (~15 lines), then at most ~7 lines of Snakemake's progress for each job (the
    # per-rule blocks this test keeps out would add ~10 more each)
    jobs = int(re.search(r"of (\d+) steps \(100%\) done", out).group(1))
    assert len(out.splitlines()) < 30 + 7 * jobs, out


def test_a_time_out_is_what_submitits_own_signal_handler_says(tmp_path, monkeypatch):
    """Whether a USR2 is the time limit (requeue only on progress) or a pre-emption is submitit's rule, asked of the
    handler submitit installs (launch/rankjob.submitit_timed_out), not restated: the same answer as its
    SignalHandler.has_timed_out on both sides of its guaranteed wall time, and no time-out outside a submitit job."""
    import signal

    from pretrain_planner.launch.rankjob import submitit_timed_out
    from submitit.core.job_environment import JobEnvironment, SignalHandler
    from submitit.core.utils import DelayedSubmission, JobPaths

    usr = JobEnvironment._usr_sig()
    previous = signal.getsignal(usr)
    try:
        signal.signal(usr, signal.SIG_DFL)
        assert submitit_timed_out() is False  # no submitit handler: nothing to requeue
        delayed = DelayedSubmission(print)
        delayed._timeout_min = 60  # guaranteed wall time: min(80% of 60 min, 60 - 10 min) = 48 min
        handler = SignalHandler(None, JobPaths(tmp_path, job_id="1"), delayed)  # type: ignore[arg-type]
        signal.signal(usr, handler.checkpoint_and_try_requeue)
        for ran_min, expected in ((47.9, False), (48.1, True)):
            handler._start_time = time.time() - ran_min * 60
            assert submitit_timed_out() is expected is handler.has_timed_out()
    finally:
        signal.signal(usr, previous)


def test_the_progress_files_of_many_cells_are_read_at_a_bounded_rate(tmp_path):
    """Issue 53 item 4: sixty live cells' followers are polled by the driver's one follower thread, at most
    FOLLOW_READS_PER_S progress files a second together (a shared file system), not each cell's every FOLLOW_S.
    Before: a thread per cell, 60 x 2 reads a second."""
    from pretrain_planner.launch.cell import FOLLOW_READS_PER_S, _Follow
    from pretrain_planner.launch.request import RuleLog
    from pretrain_planner.launch.state import StateRecord

    polls, lock = [0], threading.Lock()

    class Counted(_Follow):
        def poll(self) -> None:
            with lock:
                polls[0] += 1
            super().poll()

    follows = []
    for i in range(60):
        folder = tmp_path / f"c{i}"
        record = StateRecord(folder, "slurm", "cell.log")
        record.update("submitted")
        follows.append(Counted(f"pp-rate-{i}", record, folder / progress.PROGRESS_FILE, RuleLog(folder / "cell.log")))
    for f in follows:
        f.start()
    time.sleep(4)
    for f in follows:
        f.finish()
    during = polls[0] - len(follows)  # finish polls each once more
    assert 0 < during <= 60 + 4 * FOLLOW_READS_PER_S, during  # a first round of all, then the bounded rate
