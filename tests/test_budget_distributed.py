"""Budget stage on two data-parallel ranks (real gloo processes started by the local launcher): it trains,
the ranks agree, and a run whose rank 0 is killed resumes from rank 0's checkpoint on both ranks exactly."""

from __future__ import annotations

import pytest
from pretrain_planner.planning.configtypes import BudgetPrep
from pretrain_planner.trainer.data import mlm as data

from .conftest import assert_kill_resume_matches, budget_cfg, run_budget

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    # global batch 8 = micro-batch 2 x accumulation 2 x 2 ranks
    cfg = budget_cfg(tmp, train={"gpus_per_node": 2, "micro_batch": 2})
    data.prepare_data(BudgetPrep.of(cfg), tmp / "data/index.json")
    return cfg, tmp, run_budget(cfg, tmp, "a")


def test_two_ranks_train_data_parallel(two_ranks):
    cfg, tmp, result = two_ranks
    assert result["world_size"] == 2 and result["global_batch"] == 8
    assert (result["micro_batch"], result["grad_accum_steps"]) == (2, 2)
    assert result["setting"]["source"] == "config" and result["method_settings"]["parallel"] == "ddp"
    assert result["steps"] == 12 and result["stop_reason"] == "budget"  # fake clock: both ranks' 1 s steps
    assert result["loss_last"] < result["loss_first"], "loss goes down"
    log = (tmp / "a/log").read_text()
    assert "submitted local job" in log and "2 processes" in log and "batch 8 = 2 x 2 x 2 ranks" in log
    assert {p.name.split("_")[1] for p in (tmp / "a/submitit").glob("*_log.out")} == {"0", "1"}  # one per rank


def test_two_ranks_resume_after_rank0_killed(two_ranks):
    cfg, tmp, result = two_ranks
    assert_kill_resume_matches(cfg, tmp, "a", "b", result, rel=1e-5, abs_=1e-6)
