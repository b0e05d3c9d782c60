"""Llama-style decoders as first-class families (issue 55): llama, qwen3, olmo2 and mistral are settings of the one
transformer closed form (planning/formulas.Transformer: gated MLP, grouped-query attention, tied embeddings, norms),
checked against the model transformers builds from each catalog shape: parameters exactly, training FLOPs within 2%
of torch's FLOP counter, where the GPT-NeoX stand-in the public evidence used is off by more."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from pretrain_planner.planning import memory
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.families import FAMILIES
from pretrain_planner.planning.flops import param_count, train_flops_per_sample
from pretrain_planner.planning.formulas import Transformer
from pretrain_planner.trainer.models import build_model

from .conftest import REPO
from .test_flops import counted_flops_per_sample

TINY = ["tiny-llama", "tiny-qwen3", "tiny-olmo2"]
PUBLISHED = ["llama-3.2-1b", "llama-3.2-3b", "tinyllama-1.1b", "qwen3-0.6b", "qwen3-1.7b", "olmo-2-0425-1b"]


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")


def _mistral(catalog) -> dict:
    """Mistral has no catalog entry: tiny-llama's shape on MistralConfig (its own kv-head default is 8)."""
    return {**catalog.model("tiny-llama").to_dict(), "name": "tiny-mistral", "family": "mistral"}


def _tiny(catalog, name: str) -> dict:
    return _mistral(catalog) if name == "tiny-mistral" else catalog.model(name).to_dict()


@pytest.mark.parametrize("name", [*TINY, "tiny-mistral"])
def test_parameters_are_the_built_models_exactly(catalog, name):
    model = _tiny(catalog, name)
    torch.manual_seed(0)
    net, _ = build_model(model, "sdpa")
    assert param_count(model) == sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_shapes_count_exactly_on_the_meta_device(catalog, name):
    """The catalog's real shapes (built without memory): the closed form is their parameter count to the unit."""
    model = catalog.model(name).to_dict()
    with torch.device("meta"):
        net, _ = build_model(model, "sdpa")
    assert param_count(model) == sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize("name", [*TINY, "tiny-mistral"])
def test_training_flops_match_torchs_counter(catalog, name):
    model = _tiny(catalog, name)
    counted, by_op = counted_flops_per_sample(model)
    assert "aten.bmm" in by_op  # attention was counted
    assert train_flops_per_sample(model) == pytest.approx(counted, rel=0.02), by_op


def _gptneox_stand_in(model: dict) -> dict:
    """The public evidence's stand-in for a Llama run (data/evidence/models.yaml "Llama 3 / 3.1 8B"): GPT-NeoX with
    SwiGLU folded into a 1.5x wider MLP and every head a key/value head."""
    arch = {k: v for k, v in model["arch"].items() if k not in ("num_key_value_heads", "head_dim")}
    return {**model, "family": "gptneox", "arch": {**arch, "intermediate_size": int(1.5 * arch["intermediate_size"])}}


def test_the_gpt_neox_stand_in_misses_a_gqa_models_flops(catalog):
    """What the exact form fixes: on a grouped-query model the stand-in's count is off by more than 2%."""
    model = catalog.model("tiny-llama").to_dict()
    counted, _ = counted_flops_per_sample(model)
    stand_in = train_flops_per_sample(_gptneox_stand_in(model))
    assert abs(stand_in / counted - 1) > 0.02
    assert train_flops_per_sample(model) == pytest.approx(counted, rel=0.02)


def test_gpt_neox_is_the_same_closed_form_with_other_settings():
    """One formula, not a copy per family: the decoders differ from GPT-NeoX in settings only."""
    forms = {n: FAMILIES[n].closed_form for n in ("gptneox", "llama", "qwen3", "olmo2", "mistral")}
    assert all(type(f) is Transformer for f in forms.values())
    assert forms["gptneox"] == Transformer(tied=False, parallel_residual=True)
    assert forms["llama"] == dataclasses.replace(forms["gptneox"], parallel_residual=False, gated_mlp=True, norms=2)
    assert forms["qwen3"] == dataclasses.replace(forms["llama"], qk_norm="head")
    assert forms["olmo2"] == dataclasses.replace(forms["llama"], qk_norm="proj")


@pytest.mark.parametrize("name", PUBLISHED)
def test_a_published_run_is_its_token_count(catalog, name):
    """global_batch x steps x sequence_length is the published pre-training run (docs/methods.md)."""
    tokens = {"llama-3.2-1b": 9e12, "llama-3.2-3b": 9e12, "tinyllama-1.1b": 3e12, "qwen3-0.6b": 36e12,
              "qwen3-1.7b": 36e12, "olmo-2-0425-1b": 4e12}[name]  # fmt: skip
    r = catalog.model(name).recipe
    assert r.global_batch * r.steps * r.sequence_length == pytest.approx(tokens, rel=0.001)


def test_the_activation_bound_counts_kv_heads_and_the_gate(catalog):
    """Grouped-query k and v are narrower than hidden; a gated MLP saves gate, SiLU(gate), up and their product."""
    spec = catalog.models["tiny-llama"]
    a, b, t = spec.arch, memory.width(spec.recipe.precision), spec.recipe.sequence_length
    h, i, kv = a["hidden_size"], a["intermediate_size"], a["num_key_value_heads"] * 16
    head = memory.activation_bytes_per_sample(spec, "fl+ac")  # the head's share and each layer's input only
    layer = (memory.activation_bytes_per_sample(spec, "naive") - head) / (a["num_hidden_layers"] * t * b)
    eager = a["num_attention_heads"] * t
    assert layer == pytest.approx(8 * h - 2 * (h - kv) + 4 * i + eager - h)


def test_predict_answers_for_llama_3_2_1b(tmp_path, monkeypatch, capsys):
    """`pretrain-planner predict --model llama-3.2-1b --gpu h100 --count 8` on a fresh install: a band from the
    shipped public evidence and the rows it rests on; the run is the published 9T tokens (hundreds of days on 8)."""
    from pretrain_planner.cli.parser import main

    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--config", str(REPO / "config/config.yaml"), "--results", str(tmp_path),
                 "--model", "llama-3.2-1b", "--gpu", "h100", "--count", "8"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("PREDICTION (not a measurement): llama-3.2-1b on 1x8 h100")
    assert "(optimistic)" in out and "(central)" in out and "(pessimistic)" in out
    assert re.search(r"rests on: r\d{4} \(", out), out
    central = float(re.search(r"/ ([\d,.]+) d \(central\)", out).group(1).replace(",", ""))
    assert 100 < central < 1000, out
