"""benchmarks/suite_time.py reads what tests/conftest.py records of a run (each test phase's start, end and worker)
and a CPU sampler's file: a made-up run of two workers whose answers are known (which worker ends last, the longest
unit, each unit's CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import suite_time  # noqa: E402

T0 = 1_000_000.0


def _phase(nodeid: str, worker: str, start: float, stop: float, when: str = "call") -> dict:
    return {"nodeid": nodeid, "when": when, "outcome": "passed", "worker": worker, "start": T0 + start,
            "stop": T0 + stop, "duration": stop - start}  # fmt: skip


def _write(folder: Path) -> None:
    """gw0: test_a.py 0-100 s (setup 0-90 of it), then test_b.py 100-130; gw1: the first SLURM testbed cluster's
    modules, 0-150 s in two modules; a session of 2 workers from T0 - 10 to T0 + 155."""
    phases = [
        _phase("tests/test_a.py::test_1", "gw0", 0, 90, "setup"), _phase("tests/test_a.py::test_1", "gw0", 90, 100),
        _phase("tests/test_b.py::test_2", "gw0", 100, 130),
        _phase("tests/test_slurm.py::test_3", "gw1", 0, 60),
        _phase("tests/test_calendar_slurm.py::test_4", "gw1", 60, 150),
    ]  # fmt: skip
    start, stop = {"session": {"start": T0 - 10, "markexpr": "slow", "workers": 2}}, {"session": {"stop": T0 + 155}}
    lines = [start, *phases, stop]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "slow.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_report_names_the_critical_path_and_the_longest_unit(tmp_path):
    _write(tmp_path / "times")
    (run,) = [r for r in (suite_time.read(tmp_path / "times", s) for s in suite_time.SUBSETS) if r is not None]
    assert run.wall_s == 165
    units = {u.name: u for u in run.units()}
    assert set(units) == {"tests/test_a.py", "tests/test_b.py", "the SLURM testbed"}  # one cluster's modules: one unit
    assert units["the SLURM testbed"].stop - units["the SLURM testbed"].start == 150
    text = suite_time.report([run], "made up", 5)
    assert "Critical path: worker gw1 ended last, 2 min 40 s after the start" in text, text
    assert "Longest unit (the floor of the wall time on any number of workers): the SLURM testbed, 2 min 30 s" in text
    assert "The first test started 10 s after the session" in text
    assert "- 100 `tests/test_a.py::test_1`" in text  # setup + call


def test_cpu_goes_to_the_test_its_processes_worker_ran(tmp_path):
    """A rank process started under gw0 (its worker in its environment) during test_a, the xdist worker gw1 itself
    (no worker in its own environment: its child tells it) during test_3, a daemon: by kind, never a test's."""
    _write(tmp_path / "times")
    run = suite_time.read(tmp_path / "times", "slow")
    samples = [
        {"proc": "10:1", "ppid": 1, "comm": "python", "cmd": "python -u -c import sys;exec(eval(sys.stdin.readline()))",
         "worker": None, "t": T0 - 9, "cpu0": 5.0},
        {"proc": "11:2", "ppid": 10, "comm": "python", "cmd": "python -m multirank x", "worker": "gw1", "t": T0 + 1,
         "cpu0": 0.5},
        {"proc": "20:3", "ppid": 1, "comm": "python", "cmd": "python -u -m submitit.core._submit /x", "worker": "gw0",
         "t": T0 + 5, "cpu0": 1.0},
        {"proc": "30:4", "ppid": 1, "comm": "slurmctld", "cmd": "slurmctld", "worker": "gw1", "t": T0 - 9, "cpu0": 3.0},
        {"t": T0 + 20, "d": {"20:3": 4.0, "10:1": 2.0, "30:4": 0.5}},
        {"t": T0 + 120, "d": {"10:1": 1.5}},
    ]  # fmt: skip
    path = tmp_path / "cpu.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in samples))
    by_unit, by_kind, _span = suite_time.cpu_by_unit(path, [run])
    assert by_unit["tests/test_a.py"] == 5.0  # the rank: 1 s when first seen + 4 s later
    assert by_unit["the SLURM testbed"] == 0.5 + 2.0 + 1.5  # gw1's child when first seen, the worker itself twice
    assert by_unit["no test: SLURM testbed daemons"] == 0.5  # the daemon's CPU before the sampler started: not counted
    assert by_kind["ranks (training, benchmark, check)"] == 5.5 and by_kind["pytest workers"] == 3.5
