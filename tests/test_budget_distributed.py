"""Budget stage on two data-parallel ranks (real gloo processes started by the local launcher): it trains,
the ranks agree, and a run whose rank 0 is killed resumes from rank 0's checkpoint on both ranks exactly."""

from __future__ import annotations

import json

import pytest
from pretrain_planner.budget import jobs
from pretrain_planner.trainer.data import mlm as data

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


def assert_kill_resume_matches(cfg, tmp, ref: str, name: str, ref_result, rel: float, abs_: float) -> None:
    """Rank 0 SIGKILLed after step 6 (last checkpoint at 4), then rerun: it resumes at step 4 and its 12 losses
    and validation loss match the uninterrupted run `ref` (the same cfg)."""
    with pytest.raises(RuntimeError, match="failed in job"):
        _run(cfg, tmp, name, kill_at_step=6)  # rank 0 dies; rank 1's next collective fails
    assert len(_steps(tmp / name / "run")) == 6 and not (tmp / name / "result.json").exists()
    resumed = _run(cfg, tmp, name)
    assert "resumed at step 4" in (tmp / name / "log").read_text()
    want, got = _steps(tmp / ref / "run"), _steps(tmp / name / "run")
    assert [s["step"] for s in got] == list(range(1, 13))
    assert [g["loss"] for g in got] == pytest.approx([w["loss"] for w in want], rel=rel, abs=abs_)
    assert resumed["val_loss"] == pytest.approx(ref_result["val_loss"], rel=rel)


def test_two_ranks_resume_after_rank0_killed(two_ranks):
    cfg, tmp, result = two_ranks
    assert_kill_resume_matches(cfg, tmp, "a", "b", result, rel=1e-5, abs_=1e-6)
