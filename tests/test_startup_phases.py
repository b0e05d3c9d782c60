"""What a restart costs, measured (issue 38 §1): a benchmark cell's start-up phases in result.json (`startup`), a
train run's and a budget run's per process start (`starts`, kept across a kill and a resume) with their checkpoint
writes and reads (`checkpoint`), and the cells table's `startup_s` / `compile_s` (null for an older result). Tiny
models on CPU, real processes; seconds each."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from pretrain_planner import layout
from pretrain_planner.budget import pretrain
from pretrain_planner.planning.configtypes import BudgetPrep
from pretrain_planner.tables import aggregate
from pretrain_planner.trainer import startup
from pretrain_planner.trainer.data import mlm as data

from .conftest import REPO, budget_cfg, cell_result, steps_of, write_plan, write_set

pytestmark = pytest.mark.slow  # training runs in real processes, killed and resumed

PHASES = ("process_to_rank_s", "model_build_s", "method_wrap_s", "data_ready_s", "compile_s")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "workflow")}


def assert_phases(up: dict) -> None:
    """Every phase a number >= 0, total_s their sum, the rule written out."""
    assert set(PHASES) <= set(up), up
    assert all(isinstance(up[k], float) and up[k] >= 0 for k in PHASES), up
    assert up["total_s"] == pytest.approx(sum(up[k] for k in PHASES))
    assert up["rule"] and "compile_s" in up["rule"]


def disk_bytes(run_dir: Path) -> int:
    ds = run_dir / layout.DEEPSPEED_CHECKPOINTS
    shards = sum(p.stat().st_size for p in ds.rglob("*") if p.is_file()) if ds.is_dir() else 0
    return (run_dir / layout.CHECKPOINT).stat().st_size + shards


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    """tiny-gptneox naive on 2 gloo ranks, each its own process as a local job's (benchmarks/multirank.py), through
    run_rank; its result.json in a cell folder of results/cells."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from multirank import run_ranks

    root = tmp_path_factory.mktemp("cell") / "results"
    folder = root / "cells/tiny-gptneox/cpu/1x2/naive"
    payload = {"model": "tiny-gptneox", "method": "naive", "result": str(folder / "result.json"),
               "steps": str(folder / "steps.jsonl")}  # fmt: skip
    out = run_ranks("tests.rank_workers:run_cell", 2, payload, 300)
    for rank in out:
        assert rank["returncode"] == 0 and not rank["timed_out"], (rank.get("error"), rank["stderr"][-3000:])
    return root, json.loads((folder / "result.json").read_text())


def test_a_cell_records_its_start_up_phases(cell):
    _, result = cell
    assert result["status"] in ("ok", "noisy"), result.get("reason")
    up = result["startup"]
    assert_phases(up)
    # the rank's own process: its start from /proc, so the interpreter and torch's import come before the rank
    assert up["process_start"] == "proc" and up["process_to_rank_s"] > 0
    assert up["model_build_s"] > 0 and up["method_wrap_s"] > 0  # the first build, timed in methodbuild.build
    assert up["compile_s"] == pytest.approx(up["compile_trial_s"] + up["first_step_extra_s"])
    assert up["total_s"] < result["wall_time_s"] + up["process_to_rank_s"]


def test_the_cells_table_has_start_up_and_compile_seconds_and_tolerates_old_results(cell, tmp_path):
    _, result = cell
    old = cell_result("tiny-gptneox", "cpu", 1, 1, "naive")  # an older result.json: no `startup`
    assert "startup" not in old
    odd = cell_result("tiny-gptneox", "cpu", 1, 1, "fl", startup={"total_s": "?"})
    plan, paths = write_set(tmp_path / "results", [old, odd, result])
    cells, problems = aggregate.cells_table(plan, paths)
    assert problems.is_empty(), problems
    assert cells.schema["startup_s"] == pl.Float64 and cells.schema["compile_s"] == pl.Float64
    by = {(r["gpus_per_node"], r["method"]): r for r in cells.iter_rows(named=True)}
    assert by[(2, "naive")]["startup_s"] == pytest.approx(result["startup"]["total_s"])
    assert by[(2, "naive")]["compile_s"] == pytest.approx(result["startup"]["compile_s"])
    assert by[(1, "naive")]["startup_s"] is None and by[(1, "naive")]["compile_s"] is None  # old: null, no error
    assert by[(1, "fl")]["startup_s"] is None  # not a number: null
    # the files: cells.csv reads the columns back as seconds; cells.md shows them
    out = aggregate.table_files(str(tmp_path / "tables"))
    aggregate.build_tables(plan, paths, out, str(tmp_path / "aggregate.log"))
    back = aggregate.read_table(out["cells_csv"])
    assert back.schema["startup_s"] == pl.Float64 and back["startup_s"].drop_nulls().len() == 1
    assert back["startup_s"].drop_nulls()[0] == pytest.approx(result["startup"]["total_s"])
    heads = [c.strip() for ln in Path(out["cells_md"]).read_text().splitlines() if ln.startswith("| model")
             for c in ln.strip("|").split("|")]  # fmt: skip
    assert "start-up" in heads and "compile" in heads  # (a wide table goes on below itself)


def train(plan: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pretrain_planner.train", str(plan), "--out", str(out), "--threads", "1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300, cwd=out.parent)


def test_a_train_run_killed_and_resumed_records_both_starts_and_its_checkpoints(tmp_path):
    """tiny-gptneox, 4 steps, a checkpoint every 2: SIGKILLed after step 3 (last checkpoint at 2), rerun: two starts,
    the second at the checkpoint's step with the read's seconds; the writes' count, seconds and bytes on disk."""
    plan = write_plan(tmp_path / "plan", "tiny-gptneox")
    out = tmp_path / "out"
    args = ("--steps", "4", "--checkpoint-every-steps", "2", "--warmup-steps", "1")
    killed = train(plan, out, *args, "--kill-at-step", "3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    done = train(plan, out, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed at step 2" in (out / layout.TRAIN_LOG).read_text()
    res = json.loads((out / "result.json").read_text())
    assert res["starts_at_step"] == [0, 2]  # the old key still there
    first, second = res["starts"]
    assert (first["step"], second["step"]) == (0, 2)
    assert first["read_s"] is None and second["read_s"] > 0
    for s in (first, second):
        assert_phases({**s, "rule": startup.RUN_RULE})
        assert s["process_start"] == "proc" and s["process_to_rank_s"] > 0  # `python -m`: the run's own process
        assert s["model_build_s"] > 0 and s["data_ready_s"] > 0 and s["first_step_s"] > 0
    up = res["startup"]  # the last start's
    assert_phases(up)
    assert up["step"] == 2 and up["read_s"] == second["read_s"] and up["total_s"] == pytest.approx(second["total_s"])
    steps = steps_of(out)
    assert up["steady_step_s"] == pytest.approx(startup.steady_step(steps, {1, 3}))
    assert second["compile_s"] == pytest.approx(max(0.0, second["first_step_s"] - up["steady_step_s"]))
    ck = res["checkpoint"]
    # step 2 (first process), step 4 and the end's (second): the one resumed from was not timed
    assert (ck["writes"], ck["writes_timed"], ck["reads"]) == (3, 2, 1)
    assert ck["write_s"] > 0 and ck["write_total_s"] == pytest.approx(2 * ck["write_s"])
    assert ck["read_s"] == pytest.approx(second["read_s"])
    assert ck["bytes"] == disk_bytes(out / layout.TRAIN_RUN) and ck["bytes"] > 0
    assert ck["write_gb_s"] == pytest.approx(ck["bytes"] / ck["write_s"] / 1e9)
    # the calendar's extrapolation of a checkpoint (12 bytes per parameter of the family's formula, which leaves out
    # biases and norms) is within 10% of the bytes on disk (measured: 1.97 MB predicted, 2.03 MB written)
    from pretrain_planner.planning.calendar import checkpoint_bytes
    from pretrain_planner.planning.flops import param_count

    from .conftest import CATALOG

    predicted = checkpoint_bytes(param_count(CATALOG.model("tiny-gptneox").to_dict()))
    assert abs(predicted / ck["bytes"] - 1) < 0.10, (predicted, ck["bytes"])
    md = (out / layout.THROUGHPUT_MD).read_text()
    assert "## What a restart costs" in md and re.search(r"\| checkpoint_bytes +\|", md) and "2 start(s)" in md
    csv = (out / layout.THROUGHPUT_CSV).read_text()
    assert "\ncheckpoint_bytes," in csv and "\nstartup_s," in csv


def test_a_budget_run_preempted_and_resumed_records_both_starts_and_its_checkpoints(tmp_path):
    """The budget stage (in this process: the clock starts at pretrain, not at pytest's start): SIGTERM after step 5,
    checkpoint after step 6, resumed there."""
    cfg = budget_cfg(tmp_path, train={"budget_hours": 8 / 3600, "checkpoint_every_s": None,
                                      "finetune_checkpoints": []})  # fmt: skip
    data.prepare_data(BudgetPrep.of(cfg), tmp_path / "data/index.json")
    d = tmp_path / "run"

    def run(**kw):
        return pretrain.pretrain(cfg, tmp_path / "data/index.json", d / "model", d / "result.json", d / "run",
                                 d / "log", threads=1, **kw)  # fmt: skip

    with pytest.raises(SystemExit, match="checkpoint saved"):
        run(kill_at_step=5, kill_signal=signal.SIGTERM)
    res = run()
    assert "resumed at step 6" in (d / "log").read_text() and res["steps"] == 8
    first, second = res["starts"]
    assert (first["step"], second["step"]) == (0, 6) and first["read_s"] is None and second["read_s"] > 0
    assert first["process_start"] == second["process_start"] == "pretrain"
    assert_phases(res["startup"])
    assert res["startup"]["compile_s"] == 0.0 and "fake clock" in res["startup"]["rule"]
    ck = res["checkpoint"]
    assert (ck["writes"], ck["writes_timed"]) == (2, 1) and res["checkpoints"] == 2  # the signal's and the end's
    assert ck["bytes"] == disk_bytes(d / "run") and ck["read_s"] == pytest.approx(second["read_s"])
    assert "One checkpoint: " in (d / "summary.md").read_text()
