"""The GPU benchmark scripts' CPU smoke modes: the same code paths as on the GPU, on tiny models.

gpu_check runs every method (naive, fl, fl+ac, flce, cstep, ZeRO-1/2/3 (+off), FSDP2 grad/full (+off) at
world size 1, the GPU-only parts that must say `unsupported` on a CPU, the OOM back-off through a
forced OOM, and issue 14's two-rank cells on gloo); accuracy runs its measure-then-sustain comparison. Each
must exit 0 and write its report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def _run(script: str, tmp_path: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "benchmarks" / script), "--smoke", *args]
    # TMPDIR stays: inductor's cache lives there, and a warm cache halves the one compile (cstep's)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def test_gpu_check_smoke_runs_every_method(tmp_path):
    import gpu_check

    out = tmp_path / "gpu_check.md"
    proc = _run("gpu_check.py", tmp_path, "--out", str(out), "--cells-dir", str(tmp_path / "cells"), timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads(out.with_suffix(".json").read_text())
    cells = {c["label"]: c for c in data["cells"]}
    for method, _, _ in gpu_check.METHODS:
        rec = cells[f"tiny-gptneox/{method}"]
        want = "unsupported" if method in gpu_check.GPU_ONLY else "ok"
        assert rec["status"] == want, (method, rec.get("reason"), rec.get("error"), rec.get("result", {}).get("reason"))
        assert rec["checks"] and all(ok for _, ok in rec["checks"]), (method, rec["checks"])
    for plan in gpu_check.MULTI_SMOKE:  # two ranks: the forced OOM on rank 1 agreed, the fixes' evidence checked
        rec = cells[plan.label]
        assert rec["status"] == "ok", (plan.label, rec.get("reason"), rec.get("error"))
        assert rec["checks"] and all(ok for _, ok in rec["checks"]), (plan.label, rec["checks"])
        assert rec["result"]["world_size"] == 2
    oom = cells["tiny-gptneox/naive OOM probe"]["result"]["micro_batch_trials"]
    assert [t["fits"] for t in oom] == [False, False, True]
    kernels = {c["result"]["method_settings"]["attention_kernel"] for c in data["cells"] if c["status"] == "ok"}
    assert {"eager (matmul + softmax)", "sdpa:flash (CPU)"} <= kernels
    assert data["honesty"]["status"] == "ok"
    report = out.read_text()
    assert "| attention kernel |" in report and "tiny-gptneox/fl+zero3+off" in report
    # the table printed at the end, one row per cell
    assert sum(line.startswith("| tiny-") for line in proc.stdout.splitlines()) == len(data["cells"])


def test_accuracy_smoke(tmp_path):
    out = tmp_path / "accuracy.md"
    proc = _run(
        "accuracy.py", tmp_path, "--out", str(out), "--cells-dir", str(tmp_path / "cells"), "--steps", "4", timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads(out.with_suffix(".json").read_text())
    (rec,) = data["records"]
    assert rec["status"] == "ok", rec
    assert rec["sustained"]["steps"] == 4 and rec["sustained"]["mean_step_s"] > 0
    assert rec["error"] == pytest.approx(rec["predicted"]["step_time_s"] / rec["sustained"]["mean_step_s"] - 1)
    assert "| tiny-gptneox | naive | ok | 2 x 2 |" in out.read_text()
