"""Budget stage on two data-parallel ranks (real gloo processes started by the local launcher): it trains,
the ranks agree, and a run whose rank 0 is killed resumes from rank 0's checkpoint on both ranks exactly."""

from __future__ import annotations

import json

import pytest
from pretrain_planner.budget import data, jobs

from .test_budget_data import budget_cfg

pytestmark = pytest.mark.slow
LOCAL = {"kind": "local", "timeout_min": 10, "slurm": None}


def _steps(run_dir):
    return [json.loads(ln) for ln in (run_dir / "steps.jsonl").read_text().splitlines()]


def _run(cfg, tmp, name, **kw):
    d = tmp / name
    return jobs.pretrain(cfg, LOCAL, str(tmp / "data/index.json"), str(d / "model"), str(d / "result.json"),
                         str(d / "run"), str(d / "log"), threads=2, **kw)  # fmt: skip


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    # global batch 8 = micro-batch 2 x accumulation 2 x 2 ranks
    cfg = budget_cfg(tmp, train={"gpus_per_node": 2, "micro_batch": 2})
    data.prepare_data(cfg, tmp / "data/index.json")
    return cfg, tmp, _run(cfg, tmp, "a")


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
    with pytest.raises(RuntimeError, match="failed in job"):
        _run(cfg, tmp, "b", kill_at_step=6)  # rank 0 dies; rank 1's next all-reduce fails
    assert len(_steps(tmp / "b/run")) == 6 and not (tmp / "b/result.json").exists()
    resumed = _run(cfg, tmp, "b")
    assert "resumed at step 4" in (tmp / "b/log").read_text()
    want, got = _steps(tmp / "a/run"), _steps(tmp / "b/run")
    assert [s["step"] for s in got] == list(range(1, 13))
    assert [g["loss"] for g in got] == pytest.approx([w["loss"] for w in want], rel=1e-5, abs=1e-6)
    assert resumed["val_loss"] == pytest.approx(result["val_loss"], rel=1e-5)
