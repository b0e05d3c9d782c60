"""Adaptive search end to end on CPU: the real Snakemake CLI, the checkpoint rounds, the local launcher.

One working directory, two runs. First the adaptive sweep (tiny models x 1, 2 ranks x six methods): its
probes are the default CPU sweep's cells (naive, fl), trained for real; the checkpoint then prunes the
rest. Then the exhaustive default sweep over the same results: every cell it needs is there, so it only
rebuilds the tables, and replaying the search on those measured results must pick the same optimum.
The runs are tests/conftest.py's `adaptive_sweep`: tests/test_pipeline_e2e.py's default sweep goes on in their
folder, its naive and fl cells measured by these probes; the tests here read a copy taken before it.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from pretrain_planner import search as search
from pretrain_planner.tables import aggregate
from pretrain_planner.tables.aggregate import parse_result

from .conftest import ADAPTIVE_METHODS as METHODS
from .conftest import ADAPTIVE_MODELS as MODELS
from .conftest import ADAPTIVE_RANKS as RANKS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(adaptive_sweep):
    """dry, first (adaptive), again (adaptive), second (exhaustive): the runs; tables and status after the first;
    work: a copy of the results folder after the second."""
    return adaptive_sweep


def test_dry_run_shows_both_bounds(runs):
    err = runs["dry"].stderr
    assert "pretrain-planner plan: 20 cells to run, 4 invalid" in err  # the exhaustive upper bound
    assert "adaptive search: 4 settings, 8 probe cells first; expected about 8 of the 20 cells" in err
    assert "checkpoint" in runs["dry"].stdout + err


def test_checkpoint_expands_the_dag(runs):
    work, log = runs["work"], runs["first"].stdout + runs["first"].stderr
    assert "search_round" in log and "search_done" in log
    for model in MODELS:
        for r in RANKS:
            folder = work / f"results/search/{model}/cpu/1x{r}"
            first = json.loads((folder / "round0.json").read_text())
            assert sorted(first["run"]) == ["fl", "naive"] and not first["pruned"]
            final = json.loads((folder / "search.json").read_text())
            assert final["done"] and final["round"] == 1 and sorted(final["ran"]) == ["fl", "naive"]
            # every other valid method is pruned with its reason (the micro-batch cap is reached)
            valid = set(final["methods"])
            assert set(final["pruned"]) == valid - {"naive", "fl"}
            for m, why in final["pruned"].items():
                assert why.startswith(f"{m}: ") and "already fits micro-batch 4" in why, why
            for m in valid - {"naive", "fl"}:
                assert not (work / f"results/cells/{model}/cpu/1x{r}/{m}").exists()
            for m in ("naive", "fl"):
                assert (work / f"results/cells/{model}/cpu/1x{r}/{m}/result.json").is_file()


def test_tables_are_complete(runs):
    cells, cost = runs["tables"]["cells"], runs["tables"]["benchmark_cost"]
    assert cells.height == len(MODELS) * len(RANKS) * len(METHODS)
    counts = dict(cells.group_by("status").len().iter_rows())
    assert counts == {"ok": 8, "pruned": 12, "invalid": 4}, counts
    pruned = cells.filter(pl.col("status") == "pruned")
    assert pruned["reason"].str.contains("cannot fit a larger micro-batch").all()
    assert cost.height == len(MODELS) * len(RANKS)
    assert (cost["strategy"] == "adaptive").all() and (cost["methods_run"] == 2).all()
    assert (cost["gpu_hours_spent"] > 0).all()
    assert (cost["gpu_hours_max_run"] < cost["gpu_hours_max_exhaustive"]).all()
    report = runs["tables"]["report"]
    assert "## Benchmark cost" in report and "The adaptive search ran 8 cells and pruned 12" in report


def test_status_shows_pruned_cells_and_gpu_hours(runs):
    proc = runs["status"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pruned" in proc.stdout
    assert "adaptive search: 12 of 20 cells pruned" in proc.stdout
    assert "benchmark GPU-hours spent" in proc.stdout and "exhaustive upper bound of" in proc.stdout


def test_rerun_does_nothing(runs):
    proc = runs["again"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_exhaustive_run_reuses_the_cells(runs):
    log = runs["second"].stdout + runs["second"].stderr
    assert "benchmark_cell" not in log and "search_round" not in log


def test_replay_on_the_default_cpu_sweep_picks_the_same_optimum(runs):
    """The exhaustive default sweep's real results, fed to the search: same fastest method per setting."""
    work = runs["work"]
    cells = pl.read_parquet(work / "results/tables/cells.parquet")
    assert (cells["status"] == "ok").sum() == 8
    ttt = aggregate.time_to_train(cells)
    plan = aggregate.read_plan(work / "results/plan.csv")
    for row in ttt.iter_rows(named=True):
        mine = plan.filter(
            (pl.col("model") == row["model"]) & (pl.col("gpus_per_node") == row["gpus_per_node"]) & pl.col("valid")
        )
        methods = tuple(mine["method"])
        st = search.Setting(row["model"], "cpu", 1, row["gpus_per_node"], methods, 16 // row["gpus_per_node"], 4)
        table = {}
        for m in methods:
            result, problem = parse_result(
                work / f"results/cells/{row['model']}/cpu/1x{row['gpus_per_node']}/{m}/result.json"
            )
            assert problem is None
            table[m] = search.Observation.of(result, st.world_size)
        rep = search.replay(st, table)
        chosen = cells.filter(
            (pl.col("model") == row["model"]) & (pl.col("gpus_per_node") == row["gpus_per_node"])
            & pl.col("method").is_in(rep.ran)
        )  # fmt: skip
        best = aggregate.time_to_train(chosen).row(0, named=True)
        assert best["best_method"] == row["best_method"]
        assert best["training_days"] <= row["training_days"] * 1.02
        assert rep.gpu_hours <= rep.gpu_hours_exhaustive
