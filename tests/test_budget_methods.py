"""Budget stage with the benchmark's sharded methods on two gloo ranks (the trainer's FSDP2 and DeepSpeed ZeRO,
applied through budget/method.py): they train, record what was applied (the sharded fraction), and an FSDP2
run whose rank 0 is killed resumes from rank 0's full-state checkpoint. A method part that cannot run on CPU
fails at job start, naming train.method."""

from __future__ import annotations

import os
import re

import pytest
from pretrain_planner.budget import pretrain
from pretrain_planner.planning.configtypes import BudgetPrep
from pretrain_planner.trainer.data import mlm as data
from pretrain_planner.trainer.methodbuild import MethodError

from .conftest import assert_kill_resume_matches, budget_cfg, budget_steps, run_budget

pytestmark = pytest.mark.slow


def _cfg(tmp, method):
    # global batch 8 = micro-batch 2 x accumulation 2 x 2 ranks; 12 fake 1 s steps, checkpoint every 4
    return budget_cfg(tmp, train={"gpus_per_node": 2, "micro_batch": 2, "method": method, "setting": "config"})


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("methods")
    data.prepare_data(BudgetPrep.of(_cfg(tmp, "fl")), tmp / "data/index.json")
    return tmp


@pytest.fixture(scope="module")
def fsdp(prepared):
    cfg = _cfg(prepared, "fl+fsdp-grad")
    return cfg, run_budget(cfg, prepared, "fsdp")


def test_fsdp_grad_trains_sharded(fsdp):
    _, result = fsdp
    ms = result["method_settings"]
    assert result["world_size"] == 2 and result["steps"] == 12 and result["stop_reason"] == "budget"
    assert result["loss_last"] < result["loss_first"], "loss goes down"
    assert ms["method"] == "fl+fsdp-grad" and ms["parallel"] == "fsdp2" and ms["not_applied"] == []
    assert ms["fsdp"]["reshard_after_forward"] is False and ms["fsdp"]["sharded_modules"]
    assert ms["fsdp"]["sharded_param_fraction"] == pytest.approx(0.5, abs=0.02)  # each rank holds half
    assert ms["observed"]["param_state_after_forward"] == "unsharded"  # fsdp-grad keeps a block gathered after forward
    assert ms["weight_decay_groups"] and ms["optimizer"] == "AdamW"
    assert (prepared_dir(result) / "model/model.safetensors").is_file()


def prepared_dir(result):
    from pathlib import Path

    return Path(result["model_dir"]).parent


def test_fsdp_resume_after_rank0_killed(fsdp, prepared):
    cfg, result = fsdp
    assert_kill_resume_matches(cfg, prepared, "fsdp", "fsdp-b", result, rel=1e-4, abs_=1e-5)


def test_zero2_trains_sharded(prepared):
    cfg = _cfg(prepared, "fl+zero2")
    result = run_budget(cfg, prepared, "zero2")
    ms = result["method_settings"]
    assert result["steps"] == 12 and result["loss_last"] < result["loss_first"], "loss goes down"
    assert ms["parallel"] == "deepspeed" and ms["deepspeed"]["zero_stage"] == 2 and ms["not_applied"] == []
    assert ms["deepspeed"]["optimizer_state_fraction"] == pytest.approx(0.5, abs=0.02)
    assert (prepared / "zero2/run/deepspeed/step12").is_dir()  # the engine's own checkpoint, named by checkpoint.pt


@pytest.mark.parametrize(
    ("method", "reason"),
    [
        ("fl+fa2", "fa2: flash-attn runs on CUDA GPUs only"),
        ("fl+liger", "liger: Liger's Triton kernels run on CUDA GPUs only"),
        ("fl+cg", "cg: CUDA graphs need a CUDA GPU"),
        ("fl+off", "offload needs a sharding method"),
    ],
)
def test_method_that_cannot_run_fails_at_start(prepared, method, reason):
    cfg = budget_cfg(prepared, train={"method": method, "setting": "config"})
    d = prepared / f"bad-{method}"
    with pytest.raises(MethodError, match=re.escape(f"train.method {method!r}") + ".*" + re.escape(reason)):
        pretrain.pretrain(cfg, prepared / "data/index.json", d / "model", d / "result.json", d / "run", d / "log")
    assert not (d / "run/steps.jsonl").exists()


def test_one_rank_extras_and_offload_in_process(prepared):
    """flce (the chunked fused head on CPU) + cstep (the compiled optimizer step, its LR a tensor set per step),
    and FSDP2 with CPU offload on one rank (its process group in-process): trained and recorded."""
    for method, name in (("fl+flce+cstep", "flce-cstep"), ("fl+fsdp-grad+off", "fsdp-off")):
        cfg = budget_cfg(prepared, train={"method": method, "setting": "config"})
        d = prepared / name
        res = pretrain.pretrain(cfg, prepared / "data/index.json", d / "model", d / "result.json", d / "run",
                                d / "log", threads=2)  # fmt: skip
        ms = res["method_settings"]
        assert res["steps"] == 12 and res["loss_last"] < res["loss_first"] < 6, (method, res)
        assert ms["method"] == method and ms["not_applied"] == []
        if "cstep" in method:
            assert ms["compile_optimizer_step"] == "optimizer.step" and "ChunkedLinearCrossEntropy" in ms[
                "method_parts"]["fused_ce"]  # fmt: skip
            lrs = [s["lr"] for s in budget_steps(d / "run")]
            assert lrs[0] == 0.0 and lrs[1] > lrs[-1] > 0  # the schedule reached the compiled step
        else:
            assert ms["parallel"] == "fsdp2" and ms["fsdp"]["offload"]["policy"] == "CPUOffloadPolicy"
            assert (d / "model/model.safetensors").is_file()
    # the in-process group's variables are taken back: later code (e.g. TrainingArguments) sees no distributed run
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE"} & set(os.environ)
