"""FSDP2 and activation checkpointing end to end on CPU: 2 gloo ranks through the real Snakemake pipeline.

One Snakemake run measures tiny-bert (fp32) with DDP, activation checkpointing, FSDP2 in both modes, FSDP2 + CPU
offload and one compiled FSDP2 cell (and test_deepspeed.py's ZeRO cells: one sweep for both, tests/conftest.py
`methods_sweep`); the tests check that each method was in effect (the evidence in method_settings) and that the
losses of the timed steps agree across methods.
"""

from __future__ import annotations

import json

import pytest

from .conftest import SHARDING_METHODS as METHODS
from .conftest import TIMED, cell, leftover_processes, losses

pytestmark = pytest.mark.slow

MODEL = "tiny-bert"  # fp32 recipe: losses agree across methods to float rounding


@pytest.fixture(scope="module")
def sweep(methods_sweep):
    return methods_sweep


def test_every_cell_ran(sweep):
    for method in METHODS:
        result, steps = cell(sweep, MODEL, method)
        assert result["status"] == "ok", (method, result.get("reason"))
        assert (result["micro_batch"], result["grad_accum_steps"]) == (4, 2)
        assert len(steps) == TIMED and all(s["time_s"] > 0 for s in steps)


def test_ddp_baseline(sweep):
    s = cell(sweep, MODEL, "naive")[0]["method_settings"]
    assert s["parallel"] == "ddp"
    assert s["observed"]["forward_calls_per_micro_batch"] == 1  # no recompute without checkpointing


def test_activation_checkpointing_recomputes(sweep):
    s = cell(sweep, MODEL, "naive+ac")[0]["method_settings"]
    assert s["activation_checkpointing"] is True
    # the checkpointed block's first layer runs in the forward and again in the backward's recompute
    assert s["observed"]["block"].startswith("bert.encoder.layer.0")
    assert s["observed"]["forward_calls_per_micro_batch"] == 2


@pytest.mark.parametrize(
    ("method", "reshard", "after_forward"),
    [
        ("naive+fsdp-grad", False, "unsharded"),
        ("naive+fsdp-full", True, "sharded"),
        ("naive+fsdp-full+off", True, "sharded"),
    ],
)
def test_fsdp2_shards_parameters(sweep, method, reshard, after_forward):
    s = cell(sweep, MODEL, method)[0]["method_settings"]
    assert s["parallel"] == "fsdp2"
    f = s["fsdp"]
    assert f["reshard_after_forward"] is reshard
    assert f["sharded_modules"] == {"BertLayer": 2} and f["root"] == "BertForMaskedLM"
    assert "bert.embeddings" in f["left_to_root"]  # tied with the MLM decoder: one FSDP group (the root's)
    # every parameter is a DTensor sharded on dim 0 across the 2 ranks: each holds about half
    assert f["dtensor_params"] == f["params"] > 0
    assert f["placements"] == ["(Shard(dim=0),)"]
    assert f["local_numel"] < f["global_numel"]
    assert f["sharded_param_fraction"] == pytest.approx(0.5, abs=0.01)
    assert f["mixed_precision"] is None  # fp32 recipe
    # reshard_after_forward in effect: the block's parameters right after its forward
    assert s["observed"]["param_state_after_forward"] == after_forward
    assert s["observed"]["forward_calls_per_micro_batch"] == 1
    if method.endswith("+off"):
        assert f["offload"] == {"policy": "CPUOffloadPolicy", "pin_memory": False}
        assert f["param_devices"] == ["cpu"]
    else:
        assert f["offload"] is None


def test_compiled_fsdp2(sweep):
    s = cell(sweep, MODEL, "fl+fsdp-full")[0]["method_settings"]
    assert s["compile"] is True and s["attn_implementation"] == "sdpa"
    assert s["fsdp"]["compile"] == "per block, before sharding"
    assert s["fsdp"]["sharded_param_fraction"] == pytest.approx(0.5, abs=0.01)
    assert s["observed"] is None  # no probe hooks inside compiled graphs


def test_losses_agree_across_methods(sweep):
    """Same seed, same data, same weights on every method: the timed steps' losses agree."""
    reference = losses(cell(sweep, MODEL, "naive")[1])
    assert reference[-1] < reference[0]  # it trains
    for method in METHODS[1:]:
        got = losses(cell(sweep, MODEL, method)[1])
        # eager attention: float rounding only; fl: SDPA attention and its own dropout stream
        rel = 1e-2 if method.startswith("fl") else 1e-4
        assert got == pytest.approx(reference, rel=rel), method


def test_recorded_settings_are_the_exported_ones(sweep):
    """Issue 16: every cell recorded planning.settings' values as applied, and the sweep's exported plan for the
    setting holds its fastest cell's settings."""
    from .conftest import assert_recorded_is_exported

    for method in METHODS:
        assert_recorded_is_exported(sweep, MODEL, method, 2)
    plan = json.loads((sweep / "results/optimal" / MODEL / "cpu/1x2/plan.json").read_text())
    recorded = cell(sweep, MODEL, plan["method"])[0]["method_settings"]
    assert {k: recorded[k] for k in plan["method_settings"]} == plan["method_settings"]


def test_no_process_left(sweep):
    assert leftover_processes(str(sweep)) == []
