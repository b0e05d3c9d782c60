"""The FLOPs formula behind MFU, checked against torch's FLOP counter on tiny models and against
the H200 measurements for Pythia-1B (workflow/pretrain_planner/data/evidence/sources.md, here-h200).

torch.utils.flop_counter counts matrix products, convolutions and the fused SDPA kernels of CUDA; the
CPU flash-attention kernel (`_scaled_dot_product_flash_attention_for_cpu`) has no formula there, so the
count runs under the MATH SDPA back-end, where attention is two batched matrix products the counter sees.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from pretrain_planner.planning.catalog import load_catalog, load_models
from pretrain_planner.planning.flops import mfu, param_count, train_flops_per_sample
from pretrain_planner.schema import ConfigError
from pretrain_planner.trainer.models import build_model
from pretrain_planner.trainer.tasks import synthetic_batch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
MODELS_YAML = ROOT / "config" / "models.yaml"
GPUS_YAML = ROOT / "config" / "gpus.yaml"

# The formula excludes the input embedding; for ViT that is the patch projection, a convolution.
INPUT_EMBEDDING_OPS = {"aten.convolution", "aten.convolution_backward"}

TINY_VIT = {
    "family": "vit",
    "arch": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "image_size": 32,
        "patch_size": 8,
        "num_labels": 10,
    },
    "recipe": {
        "global_batch": 16,
        "steps": 10,
        "image_size": 32,
        "precision": "fp32",
        "optimizer": {"name": "adamw", "lr": 1.0e-3},
    },
}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(MODELS_YAML, GPUS_YAML)


def _load_one(tmp_path: Path, name: str, entry: dict) -> dict:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": {name: entry}}))
    return load_models(path)[name].to_dict()


def counted_flops_per_sample(model: dict) -> tuple[float, dict[str, int]]:
    """Forward + backward of one sample, counted; returns (total without the input embedding, by op)."""
    torch.manual_seed(0)
    net, used = build_model(model, "sdpa")
    if model["family"] != "mamba":
        assert used == "sdpa"
    net.train()
    batch = synthetic_batch(model, 1, torch.Generator().manual_seed(0))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        net(**batch).loss.backward()
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}
    assert sum(by_op.values()) == counter.get_total_flops()
    return float(sum(n for op, n in by_op.items() if op not in INPUT_EMBEDDING_OPS)), by_op


@pytest.mark.parametrize("name", ["tiny-gptneox", "tiny-bert"])
def test_formula_matches_counter_text(catalog, name):
    model = catalog.model(name).to_dict()
    counted, by_op = counted_flops_per_sample(model)
    assert "aten.bmm" in by_op  # attention was counted
    formula = train_flops_per_sample(model)
    assert formula == pytest.approx(counted, rel=0.05), by_op


def test_formula_matches_counter_vit(tmp_path):
    model = _load_one(tmp_path, "tiny-vit", TINY_VIT)
    counted, by_op = counted_flops_per_sample(model)
    assert "aten.bmm" in by_op and "aten.convolution" in by_op
    formula = train_flops_per_sample(model)
    assert formula == pytest.approx(counted, rel=0.05), by_op


def test_tiny_gptneox_formula_exact(catalog):
    """h 64, 2 layers, FFN 256, vocab 512, 128 tokens: 6 x (2 x 49,152 + 32,768) + 12 x 2 x 64 x 128 per token."""
    per_token = 6 * (2 * (4 * 64 * 64 + 2 * 64 * 256) + 64 * 512) + 12 * 2 * 64 * 128
    assert train_flops_per_sample(catalog.model("tiny-gptneox").to_dict()) == per_token * 128


def test_mamba_formula_counts_the_projections(tmp_path):
    """For Mamba the formula is the projections (matrix products) only; the scan and conv are left out."""
    entry = {
        "family": "mamba",
        "arch": {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 512, "state_size": 16, "expand": 2},
        "recipe": {
            "global_batch": 16,
            "steps": 10,
            "sequence_length": 64,
            "precision": "fp32",
            "optimizer": {"name": "adamw", "lr": 1.0e-3},
        },
    }
    model = _load_one(tmp_path, "tiny-mamba", entry)
    _, by_op = counted_flops_per_sample(model)
    projections = by_op.get("aten.mm", 0) + by_op.get("aten.addmm", 0)
    assert train_flops_per_sample(model) == pytest.approx(projections, rel=0.01), by_op


def test_pythia_1b_per_token(catalog):
    """The H200 measurements (sources.md here-h200): Pythia-1B costs about 6.26 GFLOP per token to train."""
    model = catalog.model("pythia-1b").to_dict()
    per_token = train_flops_per_sample(model) / 2048
    assert per_token == pytest.approx(6.26e9, rel=0.01)


def test_pythia_1b_parameters_past_the_input_embedding(catalog):
    """The formula's 6 x params term: 908.8M parameters past the input embedding (sources.md here-h200)."""
    model = catalog.model("pythia-1b").to_dict()
    with torch.device("meta"):
        net, _ = build_model(model, "sdpa")
    params = sum(p.numel() for p in net.parameters()) - net.get_input_embeddings().weight.numel()
    assert params == pytest.approx(908.8e6, rel=0.001)
    attention = 12 * 16 * 2048 * 2048
    formula_params = (train_flops_per_sample(model) / 2048 - attention) / 6
    assert formula_params == pytest.approx(params, rel=0.002)  # biases and norms are left out


def test_pythia_sizes_scale(catalog):
    names = ["pythia-160m", "pythia-410m", "pythia-1b", "pythia-1.4b", "pythia-2.8b", "pythia-6.9b", "pythia-12b"]
    flops = [train_flops_per_sample(catalog.model(n).to_dict()) for n in names]
    assert flops == sorted(flops)
    assert len(set(flops)) == len(flops)


def test_mfu():
    assert mfu(1e15, 1.0, 4, 312) == pytest.approx(1e15 / (4 * 312e12))
    assert mfu(2e15, 2.0, 1, 989) == pytest.approx(1e15 / 989e12)


@pytest.mark.parametrize(
    ("flops", "step", "peak"), [(1e15, 1.0, None), (None, 1.0, 312), (1e15, None, 312), (1e15, 0.0, 312)]
)
def test_mfu_unknown_is_none(flops, step, peak):
    assert mfu(flops, step, 4, peak) is None


def test_mfu_with_catalog_peaks(catalog):
    assert mfu(1e15, 1.0, 1, catalog.gpu("cpu").peak_for("bf16")) is None
    assert mfu(1e15, 1.0, 1, catalog.gpu("h100").peak_for("bf16")) == pytest.approx(1e15 / 989e12)


def test_arch_without_intermediate_size_is_refused(tmp_path):
    """The formula must never fall back to a guess: a missing arch key the formula reads is a config error."""
    entry = {**TINY_VIT, "arch": {k: v for k, v in TINY_VIT["arch"].items() if k != "intermediate_size"}}
    with pytest.raises(ConfigError, match=r"models\.tiny-vit\.arch: missing intermediate_size"):
        _load_one(tmp_path, "tiny-vit", entry)


def test_sparse_prediction_counts_the_head_on_masked_tokens_only(catalog):
    dense = catalog.model("bert-24h").to_dict()
    assert dense["arch"]["sparse_prediction"] is True
    full = {**dense, "arch": {**dense["arch"], "sparse_prediction": False}}
    arch, seq = dense["arch"], dense["recipe"]["sequence_length"]
    head_share = 6 * arch["hidden_size"] * arch["vocab_size"] * seq * (1 - dense["recipe"]["mlm_probability"])
    assert train_flops_per_sample(full) - train_flops_per_sample(dense) == pytest.approx(head_share)


# ------------------------------------------------------------------- every family, model FLOPs only (issue 17)


def _stage_sizes(arch: dict, image: int) -> list[int]:
    """ConvNeXt's feature-map side per stage: the stem's stride 4, then 2 per downsampling."""
    return [image // 4 // 2**i for i in range(len(arch["depths"]))]


def convnext_macs_by_hand(arch: dict, image: int) -> tuple[float, float]:
    """(every multiply-accumulate of one forward, those of the stem): an enumeration of the layers, written
    apart from planning/flops.py (stem 4x4/4, per block a 7x7 depthwise conv and two 1x1 linear layers of
    width 4C, a 2x2/2 downsampling before stages 1-3, the classifier)."""
    widths, depths, sides = arch["hidden_sizes"], arch["depths"], _stage_sizes(arch, image)
    stem = 3 * widths[0] * 4 * 4 * sides[0] ** 2
    total = stem
    for i, (c, d, s) in enumerate(zip(widths, depths, sides, strict=True)):
        if i:
            total += widths[i - 1] * c * 2 * 2 * s * s
        total += d * s * s * (c * 7 * 7 + c * 4 * c + 4 * c * c)
    return float(total + widths[-1] * arch["num_labels"]), float(stem)


def test_every_catalog_model_has_a_closed_form(catalog):
    """No family falls back to torch's counter (which counts recomputation and miscounts depthwise convs)."""
    for name, spec in catalog.models.items():
        value = train_flops_per_sample(spec.to_dict())
        assert value is not None and value > 0, name


def test_convnext_xl_closed_form(catalog):
    """Khandelwal et al. 2024: ConvNeXt-XL is ~3.66e11 training FLOPs per 224-px sample (torch's counter says
    ~1.09e12)."""
    spec = catalog.model("convnext-xlarge-22k").to_dict()
    macs, stem = convnext_macs_by_hand(spec["arch"], 224)
    assert train_flops_per_sample(spec) == pytest.approx(6 * macs - 2 * stem)  # the stem has no input gradient
    assert train_flops_per_sample(spec) == pytest.approx(3.66e11, rel=0.005)


def test_convnext_formula_matches_the_counted_forward(catalog):
    """The counter's forward is right for grouped convs: formula = 3 x forward (backward = 2 x forward), less the
    stem's input gradient. Its backward is not: the depthwise weight gradient is counted once per channel."""
    model = catalog.model("tiny-convnext").to_dict()
    torch.manual_seed(0)
    net, _ = build_model(model, None)
    net.train()
    batch = synthetic_batch(model, 1, torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as fwd:
        loss = net(**batch).loss
    forward = fwd.get_total_flops()
    macs, stem = convnext_macs_by_hand(model["arch"], model["recipe"]["image_size"])
    assert forward == pytest.approx(2 * macs, rel=1e-6)
    assert train_flops_per_sample(model) == pytest.approx(3 * forward - 2 * stem, rel=1e-6)
    with FlopCounterMode(display=False) as both:
        loss = net(**batch).loss
        loss.backward()
    assert both.get_total_flops() > 1.05 * train_flops_per_sample(model)  # the counter's grouped-conv quirk


def test_convnext_param_count(catalog):
    """ConvNeXt-XL: ~350M parameters with a 1k head (Liu et al. 2022, Table 9), +43M for the 22k head."""
    spec = catalog.model("convnext-xlarge-22k").to_dict()
    head = 2048 * 21841
    assert param_count(spec) - head + 2048 * 1000 == pytest.approx(350e6, rel=0.01)


def _transformer_by_hand(layers: int, h: int, ffn: int, tokens: int, head: float) -> float:
    """2 x m x n x k per matmul, forward; x 3 for training: q, k, v, o (4 h^2), the MLP (2 h ffn), QK^T and AV
    (2 x tokens x h each) per token and layer, and the head."""
    per_token_fwd = layers * (2 * 4 * h * h + 2 * 2 * h * ffn + 2 * 2 * tokens * h) + 2 * head
    return 3 * per_token_fwd * tokens


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("pythia-1b", lambda a, r: _transformer_by_hand(16, 2048, 8192, 2048, 2048 * 50304)),
        ("roberta-large", lambda a, r: _transformer_by_hand(24, 1024, 4096, 512, 1024 * 50265)),
        ("vit-large-in21k", lambda a, r: _transformer_by_hand(24, 1024, 4096, 197, 1024 * 21841 / 197)),
        # Mamba-2.8B per token: in_proj h->2*2h, out_proj 2h->h, x_proj 2h->(160+32), dt_proj 160->2h; LM head
        ("mamba-2.8b", lambda a, r: 6 * 4096 * (64 * (2560 * 10240 + 5120 * 2560 + 5120 * 192 + 160 * 5120)
                                                + 2560 * 50280)),
        ("convnext-xlarge-22k", lambda a, r: 6 * convnext_macs_by_hand(a, 224)[0]
                                             - 2 * convnext_macs_by_hand(a, 224)[1]),
    ],
)  # fmt: skip
def test_every_family_against_an_independent_closed_form(catalog, name, expected):
    spec = catalog.model(name).to_dict()
    assert train_flops_per_sample(spec) == pytest.approx(expected(spec["arch"], spec["recipe"]), rel=1e-9)


def test_the_study_headlines_through_the_suspect_check(catalog):
    """Khandelwal et al. 2024: Pythia-1B on 4 x A100 in 17.57 days implies ~99% of the A100's dense bf16 peak; on
    2 x RTX 3090 in 108 days more than 100% of the 3090's. Our cells would mark both `suspect` (the schema's 85%)."""
    from pretrain_planner.planning.flops import suspect
    from pretrain_planner.schema import default

    limit = default("config", "benchmark.suspect_mfu")
    model = catalog.model("pythia-1b")
    per_step = train_flops_per_sample(model.to_dict()) * model.recipe.global_batch
    verdicts = {}
    for gpu, count, days in (("a100", 4, 17.57), ("rtx3090", 2, 108.0), ("h100", 4, 8.0)):
        step = days * 86400 / model.recipe.steps
        util = mfu(per_step, step, count, catalog.gpu(gpu).peak_for("bf16"))
        verdicts[gpu] = (util, *suspect(util, limit))
    assert verdicts["a100"][0] == pytest.approx(0.99, abs=0.01) and verdicts["a100"][1]
    assert verdicts["rtx3090"][0] > 1.0 and verdicts["rtx3090"][1]
    assert "exceeds 85%" in verdicts["rtx3090"][2]
    assert verdicts["h100"][0] == pytest.approx(0.686, abs=0.01) and not verdicts["h100"][1]  # 69% of 989
