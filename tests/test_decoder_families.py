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

from .conftest import REPO, sections
from .test_flops import counted_flops_per_sample

TINY = ["tiny-llama", "tiny-qwen3", "tiny-olmo2"]
# published runs' token counts (docs/methods.md, "Llama-style decoders")
TOKENS = {"llama-3.2-1b": 9e12, "llama-3.2-3b": 9e12, "smollm2-1.7b": 11e12, "tinyllama-1.1b": 3e12,
          "qwen3-0.6b": 36e12, "qwen3-1.7b": 36e12, "olmo-2-0425-1b": 4e12,
          # SmolLM2's nanotron configs: 512 x 2048 x 2M steps, 768 x 2048 x 2.6M ("2T" / "4T" on the model cards)
          "smollm2-135m": 2.097152e12, "smollm2-360m": 4.0894464e12}  # fmt: skip
PUBLISHED = list(TOKENS)


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
    r = catalog.model(name).recipe
    assert r.global_batch * r.steps * r.sequence_length == pytest.approx(TOKENS[name], rel=0.001)


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


# ------------------------------------------------------------------- a model of a new family is one catalog entry
_RECIPE = {"global_batch": 8, "steps": 100, "sequence_length": 64, "precision": "fp32",
           "optimizer": {"name": "adamw", "lr": 1.0e-3, "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.1},
           "schedule": {"name": "cosine", "warmup_steps": 2}, "grad_clip": 1.0}  # fmt: skip
MADE_UP = {
    # a real size to predict (about 0.5B parameters, 100B tokens: 512 x 2048 x 95,367 steps) ...
    "my-llama": {
        "family": "llama",
        "arch": {"hidden_size": 1280, "num_hidden_layers": 20, "num_attention_heads": 20, "num_key_value_heads": 5,
                 "intermediate_size": 3584, "vocab_size": 32000, "tie_word_embeddings": True,
                 "max_position_embeddings": 2048},
        "recipe": {**_RECIPE, "global_batch": 512, "steps": 95367, "sequence_length": 2048, "precision": "bf16"},
        "source": "made up for tests/test_decoder_families.py",
    },
    # ... and its shape scaled down for the CPU stand-in (6 heads, 2 kv heads, tied)
    "my-llama-tiny": {
        "family": "llama",
        "arch": {"hidden_size": 96, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
                 "intermediate_size": 224, "vocab_size": 384, "tie_word_embeddings": True,
                 "max_position_embeddings": 64},
        "recipe": _RECIPE,
        "source": "made up for tests/test_decoder_families.py",
    },
}  # fmt: skip
METHODS = ["naive", "fl", "fl+ac", "naive+zero2", "fl+zero2", "fl+ac+zero3", "fl+fsdp-full", "fl+flce"]


@pytest.fixture
def made_up(tmp_path):
    """A temporary catalog: config/models.yaml plus the made-up Llama-shaped models."""
    import yaml

    models = yaml.safe_load((REPO / "config/models.yaml").read_text())
    models["models"].update(MADE_UP)
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(models, sort_keys=False))
    return path, load_catalog(path, REPO / "config/gpus.yaml")


def _plan(catalog) -> list:
    from pretrain_planner.planning.configtypes import LauncherSection, SweepSection
    from pretrain_planner.planning.grid import expand

    sweep = SweepSection(("my-llama-tiny",), ("cpu",), (1,), (2,), tuple(METHODS))
    return expand(sweep, LauncherSection.given({"kind": "local"}), catalog)


def test_a_made_up_llama_is_planned_and_predicted_with_no_code_change(made_up, tmp_path, monkeypatch, capsys):
    """Counted exactly, planned over eight methods on the CPU stand-in, and predicted on 8 H100s from the public
    evidence (a band and the rows it rests on), with no code change: one catalog entry each."""
    from pretrain_planner.cli.parser import main

    path, catalog = made_up
    for name in MADE_UP:
        model = catalog.model(name).to_dict()
        with torch.device("meta"):
            net, _ = build_model(model, "sdpa")
        assert param_count(model) == sum(p.numel() for p in net.parameters()), name
    assert [p.cell.method for p in _plan(catalog) if p.valid] == METHODS
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--config", str(REPO / "config/config.yaml"), "--results", str(tmp_path),
                 "--models", str(path), "--model", "my-llama", "--gpu", "h100", "--count", "8"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("PREDICTION (not a measurement): my-llama on 1x8 h100: predicted from public evidence"), out
    assert "(central)" in out and re.search(r"rests on: r\d{4} \(", out), out


@pytest.mark.slow  # two gloo ranks in subprocesses (~15 s)
def test_a_made_up_llama_is_benchmarked_on_the_cpu_stand_in(made_up, tmp_path):
    """The planner's spec of one of its cells (ZeRO-2 on 2 CPU ranks; eager: no compile time) trains and times it:
    status ok."""
    import json
    import sys

    from pretrain_planner.planning.spec import cell_spec

    sys.path.insert(0, str(REPO / "benchmarks"))
    from multirank import run_ranks

    _, catalog = made_up
    cell = next(p.cell for p in _plan(catalog) if p.cell.method == "naive+zero2")
    config = {"benchmark": {"warmup_steps": 1, "timed_steps": 2, "max_micro_batch": 2, "max_spread": 50},
              "launcher": {"kind": "local", "timeout_min": 5}}  # fmt: skip
    result, steps = tmp_path / "result.json", tmp_path / "steps.jsonl"
    spec = cell_spec(cell, catalog, *sections(config), str(result), str(steps))
    out = run_ranks("tests.rank_workers:run_spec", 2, {"spec": spec}, 240)
    assert not out[0]["timed_out"] and out[0]["returncode"] == 0, out[0]["stderr"][-3000:]
    got = json.loads(result.read_text())
    assert got["status"] == "ok", got.get("reason")
    assert got["micro_batch"] == 2 and got["step_time_s"] > 0, got


@pytest.mark.parametrize("name", PUBLISHED)
def test_every_method_is_planned_for_a_published_decoder_on_h100s(catalog, name):
    """The grid rules out none of the methods for a decoder on 8 H100s (2 nodes of 4 for HSDP): Liger's own
    kernels (the family has them: liger_kernel's apply_liger_kernel_to_<model_type>), flash-attn 2, the fused head,
    every ZeRO stage and FSDP2 with and without offload."""
    from pretrain_planner.planning.grid import Cell, invalid_reason

    spec, gpu = catalog.model(name), catalog.gpus["h100"]
    assert FAMILIES[spec.family].liger
    slugs = ["naive", "fl", "fl+ac", "fl+liger", "fl+fa2", "fl+flce", "fl+zero1", "fl+zero2+off", "fl+ac+zero3+off",
             "fl+fsdp-grad", "fl+fsdp-full+off"]  # fmt: skip
    why = {s: invalid_reason(Cell(name, "h100", 1, 8, s), spec, gpu, "slurm", catalog) for s in slugs}
    why["fl+hsdp"] = invalid_reason(Cell(name, "h100", 2, 4, "fl+hsdp"), spec, gpu, "slurm", catalog)
    assert all(w is None for w in why.values()), why


@pytest.mark.skipif(
    not torch.cuda.is_available() or __import__("importlib").util.find_spec("liger_kernel") is None,
    reason="Liger's Triton kernels need a CUDA GPU and liger-kernel",
)
@pytest.mark.parametrize("name", TINY)
def test_liger_applies_its_own_kernels_to_each_decoder(catalog, name):
    """`liger` patches a decoder with Liger's own function for its model type (apply_liger_kernel_to_llama, _qwen3,
    _olmo2), not the LayerNorm swap the study's families get, and the patched model trains a step on the GPU."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    from pretrain_planner.trainer.kernels import apply_liger
    from pretrain_planner.trainer.tasks import synthetic_batch

    model = catalog.model(name).to_dict()
    net, _ = build_model(model, "sdpa")
    if net.config.model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:  # older Liger releases (Qwen3 came later)
        pytest.skip(f"the installed liger-kernel has no kernels for {net.config.model_type}")
    net = net.cuda()
    info = apply_liger(net)
    assert info["applied"] == f"apply_liger_kernel_to_{net.config.model_type}(model=...)", info
    batch = {k: v.cuda() for k, v in synthetic_batch(model, 2, torch.Generator().manual_seed(0)).items()}
    loss = net(**batch).loss
    loss.backward()
    assert torch.isfinite(loss)


# ------------------------------------------------------------------- the public evidence's Llama runs (issue 55, 4)
def _evidence_rows() -> dict[str, list[dict[str, str]]]:
    import csv

    from pretrain_planner.planning import evidence

    out: dict[str, list[dict[str, str]]] = {}
    with open(evidence.PUBLIC_CSV, newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(row["model"], []).append(row)
    return out


# The public workloads that ran a Llama-family model (torchtitan, fms-fsdp, MLPerf); the Megatron GPT 7B is GeLU.
# A workload model text that names Llama and is missing here fails test_every_llama_workload_is_checked
LLAMA_WORKLOADS = ["Llama 3 / 3.1 8B", "fms Llama 7B (Llama 2 shape)", "fms Llama 13B (Llama 2 shape)",
                   "fms Llama 34B (Code Llama shape)", "fms Llama 70B (Llama 2 shape)",
                   "MLPerf Llama 3.1 405B pre-training (Mixtral 8x22B tokenizer)", "Llama 3 70B (torchtitan)",
                   "Llama 2 13B (torchtitan)", "Llama 2 70B (torchtitan)"]  # fmt: skip


@pytest.mark.parametrize("name", LLAMA_WORKLOADS)
def test_the_evidence_reads_a_llama_run_with_the_exact_form(catalog, name):
    """Each Llama run of the public evidence is read as the llama family with its published shape (the row's own
    layers / hidden / heads / vocab agree), so a run's parameters are those of the LlamaForCausalLM transformers
    builds from it to the unit, and its FLOPs per token (what the cross-GPU model's MFU and compute time rest on)
    are torch's FLOP counter's on that model at the rows' sequence length (counted on the meta device: no memory).
    The GPT-NeoX stand-in before issue 55 fails here: its Llama 3 8B FLOPs were 8% high (no GQA), its parameters
    left the norms out."""
    from pretrain_planner.planning import evidence
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    entry = evidence._models_yaml()[name]
    assert FAMILIES[entry["family"]].config_class == "LlamaConfig", entry.get("family")
    rows = _evidence_rows()[name]
    model = evidence._public_model(rows[0], entry, catalog)
    a = model["arch"]
    for row in rows:
        shape = (int(row["n_layers"]), int(row["hidden"]), int(row["heads"]), int(row["vocab"]))
        assert shape == (a["num_hidden_layers"], a["hidden_size"], a["num_attention_heads"], a["vocab_size"]), row
    # the model built with one and with two of its layers (every layer alike): its L layers' count is the first plus
    # L - 1 times the difference, to the unit, at a tenth of the time of building and counting all of them
    layers = a["num_hidden_layers"]
    tokens = model["recipe"]["sequence_length"]
    built, flops = [], []
    for n in (1, 2):
        with torch.device("meta"):
            net, _ = build_model({**model, "arch": {**a, "num_hidden_layers": n}}, "sdpa")
        built.append(sum(p.numel() for p in net.parameters()))
        ids = torch.zeros((1, tokens), dtype=torch.long, device="meta")
        net.train()
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            net(input_ids=ids, labels=ids).loss.backward()
        flops.append(counter.get_total_flops())
    params = built[0] + (layers - 1) * (built[1] - built[0])
    runs = [r for r in evidence.public_evidence(catalog).runs if r.model == name]
    assert param_count(model) == params and all(r.params == params for r in runs)
    if not runs:  # MLPerf's 405B rows are FP8 (no rate): its shape is checked, its FLOPs are not used
        assert all("fp8" in r["precision"] for r in rows)
        return
    total = flops[0] + (layers - 1) * (flops[1] - flops[0])
    assert [r.flops for r in runs] == pytest.approx([total / tokens] * len(runs), rel=1e-6)


def test_an_evidence_entry_without_the_kv_heads_is_no_run(catalog):
    """A Llama entry of data/evidence/models.yaml that leaves out what the formulas read is not read with the config
    class's default (every head a kv head: a GQA run's FLOPs 8% high, as the stand-in had them): the row is left
    out, the reason naming the key."""
    from pretrain_planner.planning import evidence

    entry = evidence._models_yaml()["Llama 3 / 3.1 8B"]
    row = _evidence_rows()["Llama 3 / 3.1 8B"][0]
    arch = {k: v for k, v in entry["arch"].items() if k != "num_key_value_heads"}
    why = evidence.run_of_row(row, {**entry, "arch": arch}, catalog)
    assert why == "Llama 3 / 3.1 8B: models.yaml gives no num_key_value_heads for family 'llama'"
    assert isinstance(evidence.run_of_row(row, entry, catalog), evidence.Run)


def test_every_llama_workload_is_checked():
    """A Llama workload added to data/evidence/models.yaml is read with the exact form only if checked above."""
    from pretrain_planner.planning import evidence

    assert sorted(n for n in evidence._models_yaml() if "llama" in n.lower()) == sorted(LLAMA_WORKLOADS)
