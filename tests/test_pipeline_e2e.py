"""End to end on CPU: the real Snakemake CLI, the local submitit launcher, 1- and 2-rank gloo cells."""

from __future__ import annotations

import json

import polars as pl
import pytest

from .conftest import REPO, snakemake, write_config

pytestmark = pytest.mark.slow

MODELS = ["tiny-gptneox", "tiny-bert"]
RANKS = [1, 2]
METHODS = ["naive", "fl"]
TIMED = 3


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    work = tmp_path_factory.mktemp("e2e")
    cfg = write_config(
        work / "sweep.yaml",
        sweep={"models": MODELS, "gpus": ["cpu"], "nodes": [1], "gpus_per_node": RANKS, "methods": METHODS},
        launcher={"kind": "local", "timeout_min": 15},
        benchmark={"warmup_steps": 1, "timed_steps": TIMED, "max_micro_batch": 4},
    )
    proc = snakemake(work, "--profile", str(REPO / "cluster/local"), "--cores", "2", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return work, cfg, proc


def _cell_dirs(work):
    return [work / "results/cells" / m / "cpu" / f"1x{r}" / meth for m in MODELS for r in RANKS for meth in METHODS]


def test_every_output_exists(sweep):
    work, _, _ = sweep
    for rel in [
        "plan.csv",
        "tables/cells.parquet",
        "tables/cells.csv",
        "tables/time_to_train.csv",
        "tables/time_to_train.md",
        "plots/days_to_train.png",
        "plots/step_time_by_method.png",
    ]:
        assert (work / "results" / rel).stat().st_size > 0, rel
    for d in _cell_dirs(work):
        for name in ("result.json", "steps.jsonl", "cell.log"):
            assert (d / name).is_file(), d / name


def test_ok_cells_are_measured(sweep):
    work, _, _ = sweep
    for d in _cell_dirs(work):
        result = json.loads((d / "result.json").read_text())
        assert result["status"] == "ok", result
        assert result["step_time_s"] > 0
        assert result["step_time_p10_s"] <= result["step_time_s"] <= result["step_time_p90_s"]
        assert result["timed_steps"] == TIMED
        lines = (d / "steps.jsonl").read_text().splitlines()
        assert len(lines) == TIMED
        assert all(json.loads(ln)["time_s"] > 0 for ln in lines)
        world = result["world_size"]
        # per-rank batch 16 / world, micro-batch capped at 4: accumulation makes up the rest
        assert result["micro_batch_size"] == 4
        assert result["grad_accum_steps"] == 16 // world // 4
        settings = result["method_settings"]
        assert settings["parallel"] == ("ddp" if world == 2 else "single")
        assert settings["attn_implementation"] == ("sdpa" if result["method"] == "fl" else "eager")
        assert settings["compile"] == (result["method"] == "fl")
        assert result["training_days"] == pytest.approx(1000 * result["step_time_s"] / 86400)
        assert result["versions"]["torch"]


def test_table_picks_the_fastest_method(sweep):
    work, _, _ = sweep
    cells = pl.read_parquet(work / "results/tables/cells.parquet")
    ttt = pl.read_csv(work / "results/tables/time_to_train.csv")
    assert ttt.height == len(MODELS) * len(RANKS)
    for row in ttt.iter_rows(named=True):
        group = cells.filter(
            (pl.col("model") == row["model"])
            & (pl.col("gpus_per_node") == row["gpus_per_node"])
            & (pl.col("status") == "ok")
        )
        fastest = group.sort("step_time_s").row(0, named=True)
        assert row["best_method"] == fastest["method"]
        assert row["step_time_s"] == pytest.approx(fastest["step_time_s"])
        naive = group.filter(pl.col("method") == "naive").row(0, named=True)
        assert row["speedup_vs_naive"] == pytest.approx(naive["training_days"] / row["training_days"])
    plan = pl.read_csv(work / "results/plan.csv")
    assert plan.height == len(MODELS) * len(RANKS) * len(METHODS)


def test_rerun_does_nothing(sweep):
    work, cfg, _ = sweep
    proc = snakemake(work, "--profile", str(REPO / "cluster/local"), "--cores", "2", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr
