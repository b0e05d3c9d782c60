"""How a rank process ends. benchmarks/multirank.py (the tests' and benchmarks' ranks): a rank whose outcome is
written leaves without the interpreter's teardown (which can abort a rank that succeeded), and a rank that dies says
how (the signal, its Python traceback, its last words above repeated warnings). A job's rank (launch/rankjob.py):
one that dies by a signal leaves its Python stack in its stderr log. Real processes, about a second each."""

from __future__ import annotations

import os
import subprocess
import sys

from .conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from multirank import failure, run_ranks, stderr_tail  # noqa: E402


def test_a_rank_that_succeeded_is_not_aborted_by_the_interpreters_teardown():
    (rec,) = run_ranks("tests.rank_workers:aborts_at_exit", 1, {}, 60)
    assert rec["returncode"] == 0, failure(rec)
    assert rec["result"] == {"done": True}
    assert failure(rec) is None


def test_a_rank_ended_by_a_signal_says_which_and_what_it_said_last():
    (rec,) = run_ranks("tests.rank_workers:warns_then_aborts", 1, {"repeats": 500}, 60)
    why = failure(rec)
    assert rec["returncode"] == -6 and why is not None
    assert why.startswith("rank 0 ended by SIGABRT: no Python error"), why
    assert "last words of the rank" in why
    assert "Fatal Python error: Aborted" in why  # the rank's traceback (PYTHONFAULTHANDLER)
    assert "499 repeated lines left out" in why
    assert why.count("reduce_scatter_tensor") == 1


def test_stderr_tail_keeps_the_end_and_drops_repeats():
    text = "\n".join(["a", "b", "a", "a", "c"])
    assert stderr_tail(text) == "(2 repeated lines left out)\na\nb\nc"
    assert stderr_tail("x" * 50 + "\nend", limit=10) == "x" * 6 + "\nend"


ABORTING_JOB = """
import os
from pretrain_planner.launch.rankjob import RankJob

class Aborts(RankJob):
    def run(self):
        os.abort()

job = Aborts()
job.context = {"kind": "local"}
job()
"""


def test_a_job_rank_ended_by_a_signal_leaves_its_python_stack():
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow")}
    env.pop("PYTHONFAULTHANDLER", None)
    proc = subprocess.run([sys.executable, "-c", ABORTING_JOB], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -6
    assert "Fatal Python error: Aborted" in proc.stderr
    assert "in run" in proc.stderr, proc.stderr  # the frame that died
