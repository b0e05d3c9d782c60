"""ConvNeXt's activation checkpointing and FSDP units per *stage*, as the "$100K" study (its src/models/convnext.py:
`ConvNextEncoderWithCheckpointing` checkpoints `stage.__call__`, `fsdp_layers_to_wrap` is `ConvNextStage`), not per
block. A real transformers ConvNeXt built from config (tiny-convnext, 2 blocks per stage), on CPU."""

from __future__ import annotations

import json

import pytest
import torch
from pretrain_planner.trainer.models import blocks, build_model

from .conftest import CATALOG, run_sweep


def tiny_convnext() -> dict:
    model = CATALOG.model("tiny-convnext").to_dict()
    model["arch"] = {**model["arch"], "depths": [2, 2, 2, 2]}
    return model


def one_step(net: torch.nn.Module, model: dict) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    size = model["recipe"]["image_size"]
    out = net(pixel_values=torch.randn(2, 3, size, size), labels=torch.tensor([1, 3]))
    out.loss.backward()
    return {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


def test_the_repeated_blocks_are_the_stages():
    torch.manual_seed(0)
    net, _ = build_model(tiny_convnext(), None)
    found = blocks(net)
    assert [n for n, _ in found] == [f"convnext.encoder.stages.{i}" for i in range(4)]
    assert all(type(m).__name__ == "CheckpointableConvNextStage" for _, m in found)


def test_checkpointing_recomputes_each_stage_whole():
    """The downsampling convolution of a stage runs again in backward (per block, it would not: it sits outside the
    blocks); every block runs twice; the gradients are those without checkpointing."""
    model = tiny_convnext()
    torch.manual_seed(0)
    plain, _ = build_model(model, None)
    torch.manual_seed(0)
    net, _ = build_model(model, None)
    net.load_state_dict(plain.state_dict())
    plain.train()
    net.train()
    net.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    stage = net.convnext.encoder.stages[1]
    calls = {"downsampling": 0, "block": 0}

    def counter(key: str):
        return lambda *_: calls.__setitem__(key, calls[key] + 1)

    stage.downsampling_layer[1].register_forward_pre_hook(counter("downsampling"))
    stage.layers[0].dwconv.register_forward_pre_hook(counter("block"))
    want, got = one_step(plain, model), one_step(net, model)
    assert calls == {"downsampling": 2, "block": 2}
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
def test_fsdp_units_are_the_stages(tmp_path):
    """One 2-rank cell (gloo) with FSDP2 and checkpointing: four FSDP units, the stages, and stage 0's first block
    runs twice per micro-batch (forward, recompute)."""
    work = run_sweep(tmp_path, ["tiny-convnext"], ["naive+ac+fsdp-full"], timeout=400)
    (path,) = work.glob("results/cells/tiny-convnext/cpu/1x2/naive+ac+fsdp-full/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok", result.get("reason")
    ms = result["method_settings"]
    assert ms["fsdp"]["sharded_modules"] == {"CheckpointableConvNextStage": 4}
    assert ms["observed"]["block"].startswith("convnext.encoder.stages.0")
    assert ms["observed"]["forward_calls_per_micro_batch"] == 2
