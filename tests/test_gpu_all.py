"""The GPU run's machinery (issue 28) where it can be seen on a CPU: the worker processes stopped at a cell's cap
or the part's deadline and replaced after a crash (real worker processes, a real SIGKILL), the GPU time plan
(within TOTAL_S, every part predicted), and prepare_gpu_deps.sh's check of what would be carried."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpucheck.cells import Settings  # noqa: E402
from gpucheck.plans import Plan  # noqa: E402
from gpucheck.runner import Runner  # noqa: E402

# never ends by itself (every test stops it): a count of steps would fit some CPU and not another (issue 22)
LONG = Plan("tiny-gptneox/naive", "tiny-gptneox", "naive", 2, timed_steps=100_000)
INSTANT = Plan("tiny-gptneox/fl+fa2", "tiny-gptneox", "fl+fa2", 2, run_invalid=True, expect_unsupported=True)


def _runner(tmp_path: Path, caps: dict[str, float] | None = None) -> tuple[Runner, list[dict]]:
    s = Settings(smoke=True, gpu="cpu", warmup_steps=1, timed_steps=3, accum_factor=2, threads=1,
                 cells_dir=str(tmp_path / "cells"))  # fmt: skip
    records: list[dict] = []
    runner = Runner(tmp_path, s, sys.executable, str(REPO / "config/models.yaml"), str(REPO / "config/gpus.yaml"),
                    lambda msg: None, records.append, caps or {})  # fmt: skip
    return runner, records


def _started(rows: Path, label: str, timeout_s: float = 120) -> int:
    """The pid of the worker once it has started `label` (its rows file says so)."""
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if rows.is_file():
            for line in rows.read_text().splitlines():
                ev = json.loads(line)
                if ev["event"] == "start" and ev["label"] == label:
                    return ev["pid"]
        time.sleep(0.1)
    raise AssertionError(f"{label} never started")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow  # worker processes that train
def test_a_cell_past_its_cap_is_stopped_and_the_rest_run_in_a_fresh_process(tmp_path):
    runner, records = _runner(tmp_path, caps={LONG.label: 3.0})
    t0 = time.time()
    runner.run([[LONG, INSTANT]], deadline=t0 + 240)
    first, second = records
    assert first["label"] == LONG.label and first["status"] == "timeout" and "past its cap of 3 s" in first["reason"]
    assert time.time() - t0 < 100  # it did not run its steps
    assert second["label"] == INSTANT.label and second["status"] == "unsupported"
    killed = _started(tmp_path / "worker01.rows.jsonl", LONG.label)
    assert second["pid"] != killed and not _alive(killed)
    assert (
        json.loads((Path(runner.settings.cells_dir) / "tiny-gptneox_naive" / "record.json").read_text())["status"]
        == "timeout"
    )  # fmt: skip  (what a fallback reads)


@pytest.mark.slow  # worker processes that train
def test_a_crashed_worker_leaves_a_record_and_the_rest_run(tmp_path):
    """A worker killed by a signal while a cell runs (as the out-of-memory killer or a CUDA abort would end it)."""
    runner, records = _runner(tmp_path)

    def kill_it() -> None:
        os.kill(_started(tmp_path / "worker01.rows.jsonl", LONG.label), signal.SIGKILL)

    threading.Thread(target=kill_it, daemon=True).start()
    runner.run([[LONG, INSTANT]], deadline=time.time() + 240)
    first, second = records
    assert first["status"] == "crashed" and "signal 9" in first["reason"], first
    assert "worker_log_tail" in first
    assert second["status"] == "unsupported" and (tmp_path / "worker02.job.json").is_file()


@pytest.mark.slow  # worker processes that train
def test_the_part_deadline_stops_and_skips(tmp_path):
    runner, records = _runner(tmp_path)
    runner.run([[LONG], [INSTANT]], deadline=time.time() + 12, min_start_s=5)
    by = {r["label"]: r for r in records}
    assert by[LONG.label]["status"] in ("timeout", "skipped")  # stopped in its cell (or before, on a slow machine)
    assert "the part's time ran out" in by[LONG.label]["reason"]
    assert by[INSTANT.label]["status"] == "skipped" and "time ran out" in by[INSTANT.label]["reason"]


def test_gpu_time_plan_fits_the_command(tmp_path):
    """The GPU plan, printed without a GPU: every part with a prediction; the parts that fit by their budgets end
    within TOTAL_S; flash-attn's absence said up front."""
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu_all.py"), "--plan-only", "--out",
                           str(tmp_path / "out"), "--work", str(tmp_path / "work")], capture_output=True, text=True,
                          timeout=120, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    parts = summary["parts"]
    assert list(parts) == ["env", "p2_1b", "p2_410m", "p1_1b", "p5_train", "p4_status", "p4_probes", "p6_loss", "p2_cg"]
    assert all(st["predicted_s"] > 0 for st in parts.values())
    assert max(st["ends_by_s"] for st in parts.values()) <= 540
    assert sum(parts[p]["budget_s"] for p in ("env", "p2_1b", "p2_410m", "p1_1b", "p5_train")) <= 540
    assert "no flash-attn wheel" in proc.stdout


def _dist(target: Path, name: str, version: str, requires: str = "") -> None:
    d = target / f"{name}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Name: {name}\nVersion: {version}\n{requires}")


def _tree_mib() -> float:
    """The working tree as the script sizes it (files git tracks or would: what the device tool carries)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, text=True,
                           cwd=REPO, check=True).stdout  # fmt: skip
    return sum((REPO / p).stat().st_size for p in files.split("\0") if p and (REPO / p).is_file()) / 2**20


@pytest.mark.parametrize(("core", "extra_mib", "want"), [("2.50.5", 0, 0), ("2.41.0", 0, 2), ("2.50.5", 4, 1)])
def test_prepare_check_reports_the_pair_and_the_size(tmp_path, core, extra_mib, want):
    """The limit is the tree's size rounded up plus 2 MiB (the tree grows with the project: a fixed limit failed once
    it passed 4 MiB): the dist-infos fit, 4 MiB more do not."""
    target = tmp_path / "gpu-deps"
    _dist(target, "pydantic", "2.14.4", "Requires-Dist: pydantic-core==2.50.5\n")
    _dist(target, "pydantic_core", core)
    _dist(target, "liger_kernel", "0.8.5")
    if extra_mib:
        (target / "big.bin").write_bytes(b"\0" * (extra_mib * 2**20))
    limit = str(math.ceil(_tree_mib()) + 2)
    env = {**os.environ, "GPU_DEPS_DIR": str(target), "CARRY_LIMIT_MIB": limit,
           "DS_WHEEL_CACHE": str(tmp_path / "none"), "PYDANTIC_VERSION": "2.14.4"}  # fmt: skip
    proc = subprocess.run(["bash", str(REPO / "benchmarks/prepare_gpu_deps.sh"), "--check"], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=60)  # fmt: skip
    assert proc.returncode == want, proc.stdout + proc.stderr
    assert "none cached: ZeRO cells will be unsupported" in proc.stdout  # a warning, not the end
    assert ("a matching pair" in proc.stdout) is (core == "2.50.5")
    assert ("TOO BIG" in proc.stdout) is bool(extra_mib)
    assert "liger-kernel                 0.8.5" in proc.stdout


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_gpu_check_runs_a_selection(tmp_path):
    """gpu_check.py, the status sweep on its own, on the same pieces: a selected cell, its report and records."""
    out = tmp_path / "gpu_check.md"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu_check.py"), "--smoke", "--cells", "fl+fa2",
                           "--out", str(out), "--cells-dir", str(tmp_path / "cells")], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (rec,) = json.loads(out.with_suffix(".json").read_text())["cells"]
    assert rec["label"] == "tiny-gptneox/fl+fa2" and rec["status"] == "unsupported"
    text = out.read_text()  # the reason may sit in a numbered note under the table (tables/markdown.py)
    assert "| tiny-gptneox/fl+fa2 " in text and "fa2: flash-attn runs on CUDA GPUs only" in text, text


@pytest.mark.slow  # worker processes that train
def test_a_stopped_command_stops_its_workers_and_packs(tmp_path):
    """SIGTERM (gpu_all.sh's hard stop) in the middle of a part: the cell in flight is recorded `stopped`, no worker
    survives (they run in sessions of their own), and $OUT holds what there was."""
    out, work = tmp_path / "out", tmp_path / "work"
    cmd = [sys.executable, str(REPO / "benchmarks/gpu_all.py"), "--smoke", "--parts", "p4_status", "--out", str(out),
           "--work", str(work)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        worker = _started(work / "p4_status" / "worker01.rows.jsonl", "tiny-gptneox/naive", timeout_s=300)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 124
    finally:
        proc.kill()
    summary = json.loads((out / "summary.json").read_text())
    st = summary["parts"]["p4_status"]
    assert st["status"] == "stopped" and summary["parts"]["env"]["status"] == "done"
    stopped = [r for r in st["records"] if r["status"] == "stopped"]
    assert stopped and all("stopped while it ran" in r["reason"] for r in stopped)
    time.sleep(1)
    assert not _alive(worker)
