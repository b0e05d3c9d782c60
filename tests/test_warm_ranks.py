"""Local CPU ranks forked from a warm interpreter (launcher.warm_ranks, launch/warm.py): a rank starts with torch,
transformers and the trainer already imported (~4 s of a core each saved), and otherwise as a fresh process would:
the driver's environment and directory, its own pid recorded, its result and exit seen by submitit's controller,
its start-up counting the imports it did not pay, and no rank outliving its client (the controller's task)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from pretrain_planner.launch.executor import run_job
from pretrain_planner.launch.hostpool import alive, descendants
from pretrain_planner.launch.request import JobFailed, JobRequest, RuleLog
from pretrain_planner.planning.configtypes import LauncherSection

from .launch_jobs import Sleeps, WhereAmI


def _request(tmp_path, fn, **launcher) -> JobRequest:
    return JobRequest(fn=fn, name="t", kind="local", folder=tmp_path / "submitit", gpus_per_node=2,
                      record=tmp_path / "local_job.json", timeout_min=5,
                      launcher=LauncherSection.given(launcher))  # fmt: skip


@pytest.mark.slow  # rank processes
def test_warm_ranks_start_imported_and_otherwise_as_fresh_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("PP_WARM_PROBE", "the driver's")
    log = tmp_path / "job.log"
    warm = run_job(_request(tmp_path / "warm", WhereAmI()), RuleLog(log), "warm ranks", log).values
    cold = run_job(_request(tmp_path / "cold", WhereAmI(), warm_ranks=False), RuleLog(log), "cold", log).values
    assert len(warm) == len(cold) == 2
    for w, c in zip(warm, cold, strict=True):
        assert w["torch_loaded"] and not c["torch_loaded"], (w, c)  # forked after the imports / a fresh process
        assert w["probe"] == c["probe"] == "the driver's" and w["cwd"] == c["cwd"] == os.getcwd()
        assert float(w["preload"]) > 0.5 and c["preload"] is None  # what its start-up adds back
    assert warm[0]["ppid"] == warm[1]["ppid"] != cold[0]["ppid"]  # one server forked both


@pytest.mark.slow  # rank processes
def test_a_warm_rank_ends_with_its_client(tmp_path):
    """The controller's last resort is SIGKILL to its task (the client), which cannot forward its own death: the
    rank, a child of the server, notices within a second and ends itself."""
    req = _request(tmp_path, Sleeps())
    log = tmp_path / "job.log"
    failed: list[BaseException] = []

    def go() -> None:
        try:
            run_job(req, RuleLog(log), "sleepers", log)
        except (JobFailed, RuntimeError) as exc:
            failed.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    end = time.time() + 120
    ranks = []
    while time.time() < end and len(ranks) < 2:
        ranks = [json.loads(p.read_text()) for p in sorted((tmp_path / "local_ranks").glob("rank*.json"))]
        time.sleep(0.3)
    assert len(ranks) == 2, "the ranks did not start"
    record = json.loads((tmp_path / "local_job.json").read_text())
    clients = [p for p in descendants(int(record["controller_pid"])) if p not in {r["pid"] for r in ranks}]
    assert clients and not {r["pid"] for r in ranks} & set(descendants(int(record["controller_pid"])))
    for pid in clients:
        os.kill(pid, signal.SIGKILL)
    t0 = time.time()
    while time.time() - t0 < 10 and any(alive(r["pid"], r["start"]) for r in ranks):
        time.sleep(0.2)
    assert not any(alive(r["pid"], r["start"]) for r in ranks), "a rank outlived its client"
    t.join(60)
    assert failed, "the job should have failed: its ranks were killed"


def test_two_messages_sent_back_to_back_are_read_one_at_a_time():
    """A rank that ends at once has its end sent right behind its pid: the client reads the pid, then the end (a
    read of whatever had arrived took both, and the pid did not parse)."""
    import socket

    from pretrain_planner.launch import warm

    a, b = socket.socketpair()
    with a, b:
        warm._send(a, {"pid": 12})
        warm._send(a, {"code": 3})
        assert warm._recv(b) == ({"pid": 12}, [])
        assert warm._recv(b) == ({"code": 3}, [])
        a.close()
        assert warm._recv(b) == (None, [])  # the server gone
