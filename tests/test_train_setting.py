"""One typed setting for a stage's run (planning/runspec.TrainSetting): made once from a plan or the config, its
method parsed once, JSON only at the job's boundary; one name for the micro-batch in result and plan files (the
old key still read); the benchmark section's defaults filled once, by the planner's cell spec."""

from __future__ import annotations

import json

import pytest
from pretrain_planner.budget import config as bconfig
from pretrain_planner.planning.configtypes import BudgetRecipe
from pretrain_planner.planning.grid import Cell
from pretrain_planner.planning.methods import Method, parse
from pretrain_planner.planning.runspec import TrainSetting
from pretrain_planner.planning.spec import cell_spec
from pretrain_planner.results import parse_result, with_current_keys, write_result
from pretrain_planner.schema import section
from pretrain_planner.trainer.config import RunConfig

from .conftest import CATALOG, budget_cfg, cell_result, sections


def _plan(**measured) -> dict:
    return {"gpu": {"name": "cpu"}, "nodes": 1, "gpus_per_node": 2, "method": "fl+zero2",
            "measured": {"grad_accum_steps": 4, **measured},
            "method_settings": {"fsdp_policy": {"grad_sync": "every"}}}  # fmt: skip


def test_a_plan_is_read_once_into_a_typed_setting_and_old_plans_still_read():
    new = TrainSetting.of_plan(_plan(micro_batch=8), "p/plan.json")
    old = TrainSetting.of_plan(_plan(micro_batch_size=8), "p/plan.json")  # a plan.json of an earlier version
    assert new == old
    assert isinstance(new.method, Method) and new.method == parse("fl+zero2")
    assert (new.world_size, new.global_batch, new.source, new.grad_sync) == (2, 64, "benchmark", "every")
    assert TrainSetting.of_json(json.loads(json.dumps(new.to_json()))) == new  # the job boundary, both ways
    assert new.with_global_batch(32).grad_accum_steps == 2
    with pytest.raises(ValueError, match="not a multiple of micro-batch 8 x 2 ranks"):
        new.with_global_batch(24)


def test_the_budget_stage_resolves_its_setting_once_typed_and_hands_the_job_json(tmp_path):
    cfg = bconfig.load(budget_cfg(tmp_path, load=False, model="tiny-bert",
                                  train={"gpus_per_node": 2, "setting": "config", "micro_batch": 2}))  # fmt: skip
    setting = cfg["setting"]
    assert isinstance(setting, TrainSetting) and isinstance(setting.method, Method)
    job = BudgetRecipe.of(cfg).to_job()
    assert json.loads(json.dumps(job))["setting"] == setting.to_json()  # plain data at the boundary
    assert BudgetRecipe.of(json.loads(json.dumps(job))).setting == setting  # read back once in the job
    with pytest.raises(Exception, match="train.method"):  # a bad method is named at parse time, not in the job
        bconfig.load(budget_cfg(tmp_path, load=False, model="tiny-bert",
                                train={"setting": "config", "method": "warp9"}))  # fmt: skip


def test_result_files_name_the_micro_batch_once_and_old_results_still_read(tmp_path):
    path = tmp_path / "cells/tiny-gptneox/cpu/1x1/naive/result.json"
    path.parent.mkdir(parents=True)
    write_result(path, cell_result("tiny-gptneox", "cpu", 1, 1, "naive"))
    written = json.loads(path.read_text())
    assert "micro_batch" in written and "micro_batch_size" not in written
    legacy = {k: v for k, v in written.items() if k != "micro_batch"} | {"micro_batch_size": written["micro_batch"]}
    path.write_text(json.dumps(legacy))
    row, problem = parse_result(path)
    assert problem is None and row["micro_batch"] == written["micro_batch"]
    assert with_current_keys({"micro_batch_size": 3, "micro_batch": 4}) == {"micro_batch": 4}  # the current key wins


def test_the_benchmark_defaults_are_filled_once_by_the_cell_spec():
    config = {"benchmark": {"seed": 3}, "launcher": {"kind": "debug", "timeout_min": 5}}
    spec = cell_spec(Cell("tiny-gptneox", "cpu", 1, 1, "naive"), CATALOG, *sections(config), "r.json", "s.jsonl")
    assert spec["benchmark"] == section("config", "benchmark", {"seed": 3})
    assert RunConfig.from_spec(spec).bench.seed == 3
    del spec["benchmark"]["warmup_steps"]  # the job fills nothing in: a spec without a key is not a spec
    with pytest.raises(TypeError, match="warmup_steps"):
        RunConfig.from_spec(spec)


def test_a_slug_is_parsed_once_per_process_and_a_bad_one_always_refused():
    from pretrain_planner.schema import ConfigError
    from pretrain_planner.search.lattice import shape

    assert parse("fl+zero2+ac") is parse("fl+zero2+ac") and shape("fl+ac") is shape("fl+ac")
    for _ in range(2):  # an error is not remembered as an answer
        with pytest.raises(ConfigError, match="warp9"):
            parse("fl+warp9")
