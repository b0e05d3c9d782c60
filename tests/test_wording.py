"""What the commands and tables say, unit by unit (issue 56's wording list): the function that writes each line,
called in-process on made-up rows or the demo config (no sweep, no Snakemake, no torch)."""

from __future__ import annotations

import copy

import polars as pl
import yaml
from pretrain_planner.facade.pipeline import config_sources, load
from pretrain_planner.planning import losscheck
from pretrain_planner.tables import aggregate, views

from .conftest import CATALOG, COSTS, REPO, cell_result, write_set

DEMO = yaml.safe_load((REPO / "config/config.yaml").read_text())


def _when_row(segments: int) -> dict:
    return {"segments": segments, "job_limit_h": None if segments == 1 else 1.0, "restart_loss_h": 20 / 3600,
            "restart_s": 20.0, "restart_basis": "measured start-up"}  # fmt: skip


def test_one_job_loses_its_start_up_not_a_restart():
    from pretrain_planner.cli.when import segments_line

    one = segments_line(_when_row(1))
    assert "restart" not in one and "20 s of start-up" in one and "one job, no time limit" in one
    assert "lost to start-ups and restarts" in segments_line(_when_row(3))


def _pipeline(tmp_path, **sweep):
    config = copy.deepcopy(DEMO)
    config["results"] = str(tmp_path / "results")
    config["sweep"].update(sweep)
    return load(config, REPO)


def test_the_plan_counts_cells_measured_already_apart(tmp_path):
    pp = _pipeline(tmp_path)
    assert "12 cells to run, 0 invalid" in pp.summary()
    for c in pp.cells[:3]:
        path = tmp_path / "results" / c.path / "result.json"
        path.parent.mkdir(parents=True)
        path.write_text("{}")
    assert "12 cells, 9 to run and 3 measured already" in pp.summary()


def test_a_budget_target_does_not_announce_the_sweeps_cells(tmp_path):
    pp = _pipeline(tmp_path)
    said = pp.summary(["budget"])
    assert "cells to run" not in said and "none of the sweep's 12 cells runs" in said
    assert "12 cells to run" in pp.summary(["all"])
    assert "none of the sweep" in pp.summary([str(tmp_path / "results/budget/glue.md")])


def test_one_long_setting_does_not_pad_every_line(tmp_path):
    """A long value (here 40 models) is cut, and the short settings keep their own column."""
    mine = tmp_path / "mine.yaml"
    long = {"sweep": {"models": [f"pythia-160m-{i}" for i in range(40)], "gpus": ["cpu"]}}
    mine.write_text(yaml.safe_dump(long))
    config = copy.deepcopy(DEMO)
    config["sweep"]["models"] = ["tiny-gptneox"]
    pp = load(config, REPO, sources=[*config_sources([REPO / "config/config.yaml"], REPO), ("mine.yaml", long)])
    lines = pp.settings_lines()[1:]
    assert max(len(x) for x in lines) <= 150, max(lines, key=len)
    short = [x for x in lines if x.startswith("  sweep.gpus") or x.startswith("  launcher.timeout_min")]
    assert len({x.index("<-") for x in short}) == 1 and short[0].index("<-") < 60


def test_a_rate_column_names_each_rows_unit():
    headers = [h for h, _ in views.VIEWS["time_to_train"]]
    assert "tokens/s" not in headers and "throughput" in headers
    rate = dict(views.VIEWS["time_to_train"])["throughput"]
    assert rate({"tokens_per_s": 12345.0}).endswith("tokens/s")
    assert rate({"tokens_per_s": None, "samples_per_s": 575.0}).endswith("samples/s")


def test_an_empty_problems_table_says_none(tmp_path):
    plan, paths = write_set(tmp_path, [cell_result("pythia-1b", "a100", 1, 4, "fl", "ok", 20.0)])
    aggregate.build_tables(plan, paths, aggregate.table_files(str(tmp_path / "tables")), str(tmp_path / "log"),
                           CATALOG, COSTS)  # fmt: skip
    assert "None: every result file could be read." in (tmp_path / "tables/problems.md").read_text()


def test_a_method_inside_the_fastests_noise_is_a_tie_and_the_simpler_wins(tmp_path):
    """fl+ac 78.5 ms against fl 80.7 ms, each with the spread a quiet run shows: a tie, fl kept, and said so; the
    loss check's pick is the same method."""
    rows = []
    for method, step in (("fl", 0.0807), ("fl+ac", 0.0785), ("naive", 0.120)):
        r = cell_result("pythia-1b", "a100", 1, 4, method, "ok", 1.0)
        r.update(step_time_s=step, step_time_p10_s=step * 0.97, step_time_p90_s=step * 1.04)
        rows.append(r)
    plan, paths = write_set(tmp_path, rows)
    cells, _ = aggregate.cells_table(plan, paths, CATALOG)
    ttt = aggregate.time_to_train(cells).row(0, named=True)
    assert ttt["best_method"] == "fl" and ttt["tie"].startswith("tie: fl+ac 78.5 ms vs fl 80.7 ms")
    assert losscheck.picked({r["method"]: r for r in rows}) == "fl"
    body = " ".join(aggregate.markdown_body("time_to_train", pl.DataFrame([ttt])).split())
    assert "fl (tie)" in body and "the simpler method is kept" in body
    rows[1].update(step_time_s=0.070, step_time_p10_s=0.068, step_time_p90_s=0.072)  # clearly faster: no tie
    plan, paths = write_set(tmp_path / "b", rows)
    cells, _ = aggregate.cells_table(plan, paths, CATALOG)
    ttt = aggregate.time_to_train(cells).row(0, named=True)
    assert ttt["best_method"] == "fl+ac" and ttt["tie"] is None
