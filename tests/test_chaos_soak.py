"""The chaos soak's short version (benchmarks/chaos_soak.py --short, issue 26): a 6-cell sweep with a budget
pre-training and a train-stage run on the SLURM testbed, first fault-free, then under a few seeded random faults
(driver kills, node failures, daemon restarts, scancel, requeue, a rank killed, a result truncated) with the budget
and train jobs drilled; every count must come out exact and nothing may be left running. About 5-10 minutes. On the
restrictive site (issue 53: --restrictive, cluster/testbed/daemon.sh profile restrictive): QOS limits enforced with
a100's jobs under a cap of 2 submitted jobs (the driver allowed 4: sbatch refuses some, which wait), JobRequeue=0,
EnforcePartLimits=NO, tasks bound to their CPUs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import PACE_S, REPO

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_short_chaos_soak_loses_nothing(slurm_cluster, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the soak stops SLURM daemons (cluster/testbed/daemon.sh): it needs root")
    out = tmp_path / "chaos_soak.md"
    cmd = [sys.executable, str(REPO / "benchmarks/chaos_soak.py"), "--short", "--work", str(tmp_path / "work"),
           "--out", str(out), "--pace", str(PACE_S), "--restrictive"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    report = out.read_text() if out.is_file() else ""
    assert proc.returncode == 0, report + proc.stderr[-6000:]
    assert "- result mismatches: 0" in report, report
    assert "mismatch (" not in report
    assert "- site: restrictive" in report, report
