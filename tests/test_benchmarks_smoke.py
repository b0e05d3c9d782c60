"""The GPU benchmark scripts' CPU smoke modes: the same code paths as on the GPU, on tiny models.

`SMOKE=1 bash benchmarks/gpu_all.sh` is the whole GPU run rehearsed (issue 28): the time plan first, every part in
its own processes (P2 the levers with their fallback, P1 a sustained run, P5 the train stage from an exported plan
with polars and Snakemake made unimportable, P4 every method and the probes, P6 the lever cells' loss check), four
files in $OUT rewritten after every part. accuracy.py runs its measure-then-sustain comparison.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpucheck import losscheck, report  # noqa: E402
from gpucheck import plans as P  # noqa: E402

pytestmark = pytest.mark.slow  # minutes of training subprocesses: not in the everyday subset


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One whole rehearsal, as a user types it; (stdout, $OUT, summary.json)."""
    tmp = tmp_path_factory.mktemp("gpu_all")
    out = tmp / "out"
    # TMPDIR stays: inductor's cache lives there, and a warm cache halves the one compile (cstep's)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SMOKE": "1", "OUT": str(out)}
    proc = subprocess.run(["bash", str(REPO / "benchmarks/gpu_all.sh"), "--work", str(tmp / "work")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1500)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    return proc.stdout, out, json.loads((out / "summary.json").read_text())


def _records(summary: dict, part: str) -> dict[str, dict]:
    return {r["label"]: r for r in summary["parts"][part]["records"]}


def test_time_plan_first_and_what_comes_back(smoke):
    stdout, out, summary = smoke
    plan_at, first_part = stdout.index("time plan"), stdout.index("=== env")
    assert plan_at < first_part
    plan = stdout[plan_at:first_part]
    for name, st in summary["parts"].items():
        assert re.search(rf"\]\s+{name}\s+\S+\s+\d+\s+\d+\s+\d+\s", plan), name  # budget, predicted, ends by
        assert st["status"] == "done", (name, st.get("reason"), st.get("error"))
        assert st["predicted_s"] > 0 and st["actual_s"] >= 0
    assert "known before running: fa2 -> unsupported" in stdout[:first_part]
    # at most 8 files come back, each a plain name, none over 16 MiB, no folder
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu_all.log", "reports.tgz", "summary.json", "summary.md"]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f) and (out / f).stat().st_size < 16 * 2**20 for f in files)
    with tarfile.open(out / "reports.tgz") as tar:
        names = set(tar.getnames())
    for part in summary["parts"]:
        assert f"gpu_all/{part}/report.json" in names, part
    assert summary["meta"]["finished"] and "## P2" in (out / "summary.md").read_text()


def test_levers_fall_back_and_p1_sustains_them(smoke):
    _, _, summary = smoke
    for part, tag in (("p2_1b", " [1b]"), ("p2_410m", " [410m]")):
        recs = _records(summary, part)
        first, fallback = recs[f"tiny-gptneox{tag}/fl+liger+flce"], recs[f"tiny-gptneox{tag}/fl+flce"]
        assert first["status"] == "unsupported" and "liger" in first["result"]["reason"]  # Liger: CUDA only
        assert fallback["status"] == "ok" and all(ok for _, ok in fallback["checks"]), fallback["checks"]
        assert first["pid"] != fallback["pid"]  # the risky first in a process of its own
    (rec,) = summary["parts"]["p1_1b"]["records"]
    assert rec["status"] == "ok" and rec["of"] == "tiny-gptneox [1b]/fl+flce"
    assert rec["sustained"]["steps"] == 4 and rec["sustained"]["mean_step_s"] > 0
    ratio = rec["predicted"]["step_time_s"] / rec["sustained"]["mean_step_s"]
    assert rec["prediction_error"] == pytest.approx(ratio - 1)


def test_train_stage_from_an_exported_plan_without_polars_or_snakemake(smoke):
    _, _, summary = smoke
    assert any("polars, snakemake" in note for note in summary["meta"]["known_before"])
    (rec,) = summary["parts"]["p5_train"]["records"]
    assert rec["status"] == "ok", rec
    assert rec["of"] == "tiny-gptneox [410m]/fl+flce" and rec["export"]["best_method"] == "fl+flce"
    assert rec["trained_steps"] == 6 and rec["throughput"]["steps_timed"] == 4  # 2 warm-up steps left out
    assert rec["settings_differences"] == []  # the plan ran exactly the measured settings
    measured = _records(summary, "p2_410m")["tiny-gptneox [410m]/fl+flce"]["result"]
    assert rec["throughput"]["prediction"]["step_time_s"] == measured["step_time_s"]
    assert rec["ratio"] == pytest.approx(rec["throughput"]["step_time_s"] / measured["step_time_s"])


def test_every_method_and_the_probes(smoke):
    _, _, summary = smoke
    recs = _records(summary, "p4_status")
    for method, _, _, suffix in P.STATUS_METHODS:
        if suffix:
            continue
        rec = recs[f"tiny-gptneox/{method}"]
        want = "unsupported" if method in P.GPU_ONLY else "ok"
        assert rec["status"] == want, (method, rec.get("reason"), rec.get("result", {}).get("reason"))
        assert rec["checks"] and all(ok for _, ok in rec["checks"]), (method, rec["checks"])
    for label in ("tiny-gptneox/fl+zero3 x2 one GPU per task", "tiny-bert/fl+flce"):
        assert recs[label]["status"] == "ok" and all(ok for _, ok in recs[label]["checks"]), recs[label]
    # the risky paths each in a process of its own, the rest shared
    risky = {recs[f"tiny-gptneox/{m}"]["pid"] for m in ("fl+liger", "fl+cstep", "fl+cg")}
    safe = {recs[f"tiny-gptneox/{m}"]["pid"] for m in ("naive", "fl", "fl+zero1", "fl+fsdp-full")}
    assert len(risky) == 3 and len(safe) == 1 and not risky & safe
    kernels = {r["result"]["method_settings"]["attention_kernel"] for r in recs.values() if r["status"] == "ok"}
    assert {"eager (matmul + softmax)", "sdpa:flash (CPU)"} <= kernels
    probes = _records(summary, "p4_probes")
    oom = probes["tiny-gptneox/naive OOM probe"]["result"]["micro_batch_trials"]
    assert [t["fits"] for t in oom] == [False, False, True]
    assert probes["timing honesty"]["status"] == "ok"
    assert _records(summary, "p2_cg")["tiny-gptneox/fl+liger+flce+cg"]["status"] == "unsupported"


def test_the_lever_cells_train_the_same_model_as_naive(smoke):
    """P6 (issue 39): each lever that runs here is `same` as naive, and passes its check; the GPU-only ones are
    `unsupported` with the reason."""
    _, out, summary = smoke
    recs = _records(summary, "p6_loss")
    for lever in ("fl+flce", "fl+cstep"):
        rec = recs[f"tiny-gptneox/{lever} vs naive"]
        assert rec["loss"] == "same" and rec["checks"] == [[losscheck.SAME_CHECK, True]], rec
        assert rec["band_runs"] >= 1  # naive's half-micro-batch variant at least
    for lever in ("fl+liger", "fl+cg", P.LEVERS):
        rec = recs[f"tiny-gptneox/{lever} vs naive"]
        assert rec["status"] == "unsupported" and "CUDA" in rec["reason"], rec
    assert "## P6" in (out / "summary.md").read_text()


def test_a_lever_that_trains_another_model_fails_its_check(tmp_path, monkeypatch):
    """The check can fail: fl+flce's learning rate doubled (the trainer's test fault) is `differs`, its check
    fails, and gpu_all would mark the part `problems`."""
    import time

    from pretrain_planner.planning.catalog import load_catalog
    from pretrain_planner.planning.losscheck import FAULT_ENV

    monkeypatch.setenv(FAULT_ENV, "fl+flce=lr_x2")
    plan = losscheck.LossPlan("tiny-gptneox", ("fl+flce",), 2, 8, 6, compile_model=False, fp32=True)
    catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    (rec,) = losscheck.run_loss_check(plan, catalog, "cpu", 2, tmp_path, time.time() + 300)
    assert rec["loss"].startswith("differs") and rec["checks"] == [(losscheck.SAME_CHECK, False)], rec
    assert report.failed(rec)


def test_accuracy_smoke(tmp_path):
    out = tmp_path / "accuracy.md"
    cmd = [sys.executable, str(REPO / "benchmarks/accuracy.py"), "--smoke", "--out", str(out), "--cells-dir",
           str(tmp_path / "cells"), "--steps", "4"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads(out.with_suffix(".json").read_text())
    (rec,) = data["records"]
    assert rec["status"] == "ok", rec
    assert rec["sustained"]["steps"] == 4 and rec["sustained"]["mean_step_s"] > 0
    assert rec["error"] == pytest.approx(rec["predicted"]["step_time_s"] / rec["sustained"]["mean_step_s"] - 1)
    from .demo_results import md_cells

    rows = [md_cells(ln) for ln in out.read_text().splitlines() if ln.startswith("| tiny-gptneox ")]
    assert [r[:4] for r in rows] == [["tiny-gptneox", "naive", "ok", "2 x 2"]], rows
