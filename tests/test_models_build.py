"""Every model builds from config/models.yaml with transformers classes and the published size; the
24-hour BERT's sparse prediction; ConvNeXt's activation checkpointing; one real training step of each tiny
stand-in through the trainer's entry point.

The reference models are built on the meta device: shapes and parameter counts, no memory, no time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import transformers as tf
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.grid import Cell, invalid_reason
from pretrain_planner.planning.spec import cell_spec
from pretrain_planner.trainer.models import build_model, kernel_info
from pretrain_planner.trainer.tasks import synthetic_batch

from .conftest import sections

ROOT = Path(__file__).resolve().parents[1]

# Total parameters, with their sources. Pythia: the "Total Params" column of EleutherAI's Pythia README
# (github.com/EleutherAI/pythia). Its 6.9B and 12B checkpoints pad the vocabulary to 50,432 and 50,688; the
# study (and config/models.yaml) uses 50,304 for every size, 1.0M and 3.9M parameters fewer (< 0.04%).
PYTHIA_TOTAL = {
    "pythia-160m": 162_322_944,
    "pythia-410m": 405_334_016,
    "pythia-1b": 1_011_781_632,
    "pythia-1.4b": 1_414_647_808,
    "pythia-2.8b": 2_775_208_960,
    "pythia-6.9b": 6_857_302_016,
    "pythia-12b": 11_846_072_320,
}
# RoBERTa-large: 355M (fairseq README; RobertaModel with its pooler is 355,359,744). The MLM model has the
# LM head (dense + LayerNorm + decoder bias; decoder tied) instead of the pooler: 355,412,057.
ROBERTA_LARGE = 355.36e6
# Mamba-2.8B: 2.77B (state-spaces/mamba-2.8b-hf model card: d_model 2560, 64 layers, tied embeddings).
MAMBA_2_8B = 2.77e9
# ConvNeXt-XL: 350M with the ImageNet-1k head (Liu et al. 2022, Table 1; timm convnext_xlarge 350.20M);
# the 21,841-class ImageNet-22k head replaces 2048 x 1000 + 1000 with 2048 x 21841 + 21841.
CONVNEXT_XL_1K = 350.2e6
CONVNEXT_22K_HEAD = 2048 * 21841 + 21841
# ViT-L/16: 304M without a classifier (google/vit-large-patch16-224-in21k, ViTModel incl. its 1.05M pooler;
# timm vit_large_patch16_224 304.33M with a 1k head); ViTForImageClassification has no pooler and a
# 21,841-class head.
VIT_L_16 = 304e6
VIT_22K_HEAD = 1024 * 21841 + 21841
# BERT-large (bert-large-uncased BertModel): 335,141,888. The 24-hour BERT differs exactly by: 130 positions
# instead of 512, 1 token type instead of 2, the pre-LN encoder's final LayerNorm, and the MLM head (dense +
# LayerNorm + decoder bias over 30,522 words; decoder tied) in place of the pooler (dense) = 334,784,314; and the
# vocabulary padded to a multiple of 8 as the reference pads it (30,528: 6 more word embeddings and decoder biases).
BERT_LARGE = 335_141_888
BERT_24H = BERT_LARGE - (512 - 130) * 1024 - 1024 + 2 * 1024 + (2 * 1024 + 30522) + 6 * (1024 + 1)


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(ROOT / "config/models.yaml", ROOT / "config/gpus.yaml")


def _meta(catalog, name: str) -> torch.nn.Module:
    spec = catalog.model(name)
    attn = None if spec.family in ("mamba", "convnext") else "sdpa"
    with torch.device("meta"):
        net, _ = build_model(spec.to_dict(), attn)
    return net


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", list(PYTHIA_TOTAL))
def test_pythia_parameter_counts(catalog, name):
    net = _meta(catalog, name)
    assert isinstance(net, tf.GPTNeoXForCausalLM)
    assert _count(net) == pytest.approx(PYTHIA_TOTAL[name], rel=0.001)
    if name not in ("pythia-6.9b", "pythia-12b"):  # same vocabulary as the checkpoints: exact
        assert _count(net) == PYTHIA_TOTAL[name]
    if name == "pythia-1b":  # sources.md here-h200: 908.8M past the input embedding
        past = _count(net) - net.get_input_embeddings().weight.numel()
        assert past == pytest.approx(908.8e6, rel=0.001)


def test_roberta_large_parameters(catalog):
    net = _meta(catalog, "roberta-large")
    assert type(net) is tf.RobertaForMaskedLM
    assert _count(net) == pytest.approx(ROBERTA_LARGE, rel=0.001)


def test_mamba_parameters(catalog):
    net = _meta(catalog, "mamba-2.8b")
    assert isinstance(net, tf.MambaForCausalLM)
    assert _count(net) == pytest.approx(MAMBA_2_8B, rel=0.005)


def test_convnext_xlarge_22k_parameters(catalog):
    net = _meta(catalog, "convnext-xlarge-22k")
    assert isinstance(net, tf.ConvNextForImageClassification)
    assert _count(net.classifier) == CONVNEXT_22K_HEAD
    assert _count(net) - CONVNEXT_22K_HEAD + 2048 * 1000 + 1000 == pytest.approx(CONVNEXT_XL_1K, rel=0.001)
    assert _count(net) == pytest.approx(392.9e6, rel=0.001)


def test_vit_large_in21k_parameters(catalog):
    net = _meta(catalog, "vit-large-in21k")
    assert isinstance(net, tf.ViTForImageClassification)
    assert _count(net.classifier) == VIT_22K_HEAD
    assert _count(net) - VIT_22K_HEAD == pytest.approx(VIT_L_16, rel=0.005)


def test_bert_24h_is_pre_layernorm_bert_large_with_sparse_prediction(catalog):
    """Izsak et al. 2021: BERT-large shape, pre-LayerNorm, MLM only, sparse prediction."""
    net = _meta(catalog, "bert-24h")
    assert isinstance(net, tf.RobertaPreLayerNormForMaskedLM)  # pre-LN; no NSP head
    assert type(net).__name__.endswith("WithSparsePrediction")
    assert _count(net) == BERT_24H
    assert _count(net) == pytest.approx(335e6, rel=0.005)
    assert "sparse_prediction" not in net.config.to_dict()  # a builder option, not a config key


def test_every_model_in_the_catalog_builds(catalog):
    for name in catalog.models:
        assert _count(_meta(catalog, name)) > 0, name


# ------------------------------------------------------------------------- sparse prediction

TINY_PRELN = {
    "name": "tiny-preln",
    "family": "roberta-prelayernorm",
    "task": "masked_lm",
    "arch": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "vocab_size": 512,
        "max_position_embeddings": 130,
        "type_vocab_size": 1,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    },
    "recipe": {"sequence_length": 128, "mlm_probability": 0.15},
}


def _pair(family: str = "roberta-prelayernorm"):
    """(sparse, dense) tiny masked LMs of `family` with the same weights."""
    model = {**TINY_PRELN, "family": family}
    torch.manual_seed(0)
    sparse, _ = build_model({**model, "arch": {**model["arch"], "sparse_prediction": True}}, "eager")
    dense, _ = build_model(model, "eager")
    dense.load_state_dict(sparse.state_dict())
    assert isinstance(sparse, type(dense)) and type(sparse) is not type(dense)
    return sparse, dense


@pytest.mark.parametrize("family", ["roberta-prelayernorm", "bert"])
def test_sparse_prediction_same_loss_and_gradients_as_dense(family):
    sparse, dense = _pair(family)
    batch = synthetic_batch(TINY_PRELN, 4, torch.Generator().manual_seed(0))
    out_s, out_d = sparse(**batch), dense(**batch)
    assert out_s.loss.item() == pytest.approx(out_d.loss.item(), rel=1e-5)
    out_s.loss.backward()
    out_d.loss.backward()
    for (name, p_s), p_d in zip(sparse.named_parameters(), dense.parameters(), strict=True):
        assert torch.allclose(p_s.grad, p_d.grad, atol=1e-6), name


def test_sparse_prediction_head_sees_only_masked_rows():
    sparse, dense = _pair()
    assert type(dense) is tf.RobertaPreLayerNormForMaskedLM
    batch = synthetic_batch(TINY_PRELN, 4, torch.Generator().manual_seed(1))
    masked = int((batch["labels"] != -100).sum())
    assert 0 < masked < batch["labels"].numel() // 4  # about 15%
    seen = {}
    for tag, net in (("sparse", sparse), ("dense", dense)):
        net.lm_head.register_forward_pre_hook(lambda mod, args, tag=tag: seen.__setitem__(tag, tuple(args[0].shape)))
        out = net(**batch)
        seen[tag + "_logits"] = tuple(out.logits.shape)
    assert seen["sparse"] == (masked, 64)
    assert seen["sparse_logits"] == (masked, 512)
    assert seen["dense"] == (4, 128, 64)
    # without labels there is nothing to select: every position's logits, like the dense model
    plain = sparse(input_ids=batch["input_ids"])
    assert plain.loss is None and tuple(plain.logits.shape) == (4, 128, 512)


def test_sparse_prediction_with_activation_checkpointing():
    sparse, dense = _pair()
    batch = synthetic_batch(TINY_PRELN, 2, torch.Generator().manual_seed(2))
    sparse.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    sparse.train()
    dense.train()
    assert sparse(**batch).loss.item() == pytest.approx(dense(**batch).loss.item(), rel=1e-5)


def test_sparse_prediction_only_for_masked_lm():
    model = {
        "name": "x",
        "family": "gptneox",
        "task": "causal_lm",
        "arch": {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 64},
    }
    model["arch"]["sparse_prediction"] = True
    with pytest.raises(ValueError, match="sparse_prediction is for masked-LM families"):
        build_model(model, "eager")


# ------------------------------------------------------------------------- ConvNeXt checkpointing


def test_convnext_activation_checkpointing_recomputes_each_block(catalog):
    model = catalog.model("tiny-convnext").to_dict()
    torch.manual_seed(0)
    net, attn = build_model(model, None)
    assert attn is None
    net.train()
    batch = synthetic_batch(model, 2, torch.Generator().manual_seed(0))
    calls = []
    for stage in net.convnext.encoder.stages:
        stage.layers[0].dwconv.register_forward_pre_hook(lambda *_: calls.append(1))
    loss = net(**batch).loss
    loss.backward()
    grads = [p.grad.clone() for p in net.parameters()]
    assert len(calls) == 4
    net.zero_grad()
    calls.clear()
    net.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    loss_ac = net(**batch).loss
    loss_ac.backward()
    assert len(calls) == 8  # every block ran again in backward
    assert loss_ac.item() == pytest.approx(loss.item(), rel=1e-6)
    for g, p in zip(grads, net.parameters(), strict=True):
        assert torch.allclose(g, p.grad, atol=1e-6)


# ------------------------------------------------------------------------- kernels


def test_kernel_info(catalog):
    assert kernel_info(catalog.model("pythia-160m").to_dict()) == {}
    info = kernel_info(catalog.model("mamba-2.8b").to_dict())
    assert set(info) >= {"mamba_ssm_version", "causal_conv1d_version", "mamba_fast_kernels", "mamba_path"}
    assert isinstance(info["mamba_fast_kernels"], bool)
    if info["mamba_ssm_version"] is None:
        assert info["mamba_fast_kernels"] is False and info["mamba_ssm_error"] == "not installed"
    json.dumps(info)  # goes into result.json


# ------------------------------------------------------------------------- one real step of each tiny model


@pytest.mark.slow  # a training run (one cell through run_rank)
@pytest.mark.parametrize("name", ["tiny-vit", "tiny-convnext", "tiny-mamba"])
def test_tiny_model_trains_one_step_through_run_rank(catalog, tmp_path, name):
    from pretrain_planner.trainer.run import run_rank

    config = {
        "benchmark": {"warmup_steps": 0, "timed_steps": 1, "max_micro_batch": 2, "seed": 0},
        "launcher": {"kind": "debug", "timeout_min": 5},
    }
    cell = Cell(name, "cpu", 1, 1, "naive")
    assert invalid_reason(cell, catalog.model(name), catalog.gpu("cpu"), "debug", catalog) is None
    spec = cell_spec(cell, catalog, *sections(config), str(tmp_path / "result.json"), str(tmp_path / "steps.jsonl"))
    spec["model"]["recipe"]["global_batch"] = 4  # 2 micro-batches of 2: real gradient accumulation
    run_rank(spec)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "ok", result.get("reason")
    assert (result["micro_batch"], result["grad_accum_steps"]) == (2, 2)
    assert math.isfinite(result["final_loss"])
    assert result["step_time_s"] > 0
    assert result["flops_per_step"] and result["flops_per_step"] > 0
    steps = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert len(steps) == 1
