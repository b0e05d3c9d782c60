"""Budget stage: config/budget-24h.yaml is the published recipe (Izsak et al. 2021, its reference code's
README), read from the catalog's bert-24h and overridden by the preset only; a tiny size of it runs end to end on a
CPU."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from pretrain_planner.budget import pretrain
from pretrain_planner.planning.configtypes import BudgetPrep, BudgetRecipe
from pretrain_planner.schema import ConfigError, load_yaml, validate
from pretrain_planner.trainer.data import mlm as data

from .conftest import PRESET, REPO, preset_cfg


def test_preset_is_valid_as_shipped():
    cfg = validate(load_yaml(PRESET), "budget", PRESET)
    assert cfg["model"] == "bert-24h"
    for key in ("lr", "betas", "eps", "weight_decay", "precision", "global_batch", "budget_hours", "warmup_fraction"):
        assert key not in yaml.safe_load(PRESET.read_text())["train"], f"train.{key} comes from the catalog's recipe"


def test_preset_resolves_to_the_published_recipe(tmp_path):
    cfg = preset_cfg(tmp_path)
    tr, d, m = cfg["train"], cfg["data"], cfg["model"]
    # the model: BERT-large shape, pre-LN, no NSP (an MLM class), sparse prediction, GELU, dropout 0.1
    assert m["name"] == "bert-24h" and m["family"] == "roberta-prelayernorm"
    a = m["arch"]
    assert (a["num_hidden_layers"], a["hidden_size"], a["num_attention_heads"], a["intermediate_size"]) == (
        24, 1024, 16, 4096)  # fmt: skip
    assert a["hidden_act"] == "gelu" and a["hidden_dropout_prob"] == 0.1 and a["attention_probs_dropout_prob"] == 0.1
    assert a["sparse_prediction"] is True and a["vocab_size"] == 30528 and a["vocab_size"] % 8 == 0
    # the optimizer and schedule (from the catalog: the preset does not restate them)
    assert tr["lr"] == 1e-3 and tr["betas"] == [0.9, 0.98] and tr["eps"] == 1e-6 and tr["weight_decay"] == 0.01
    assert tr["grad_clip"] is None and tr["precision"] == "fp16"
    assert tr["warmup_fraction"] == 0.06 and tr["budget_hours"] == 24
    assert all(cfg["recipe_keys"][f"train.{k}"] == "catalog" for k in ("lr", "betas", "eps", "budget_hours"))
    # batch: 4096 = 32 per GPU x 16 accumulation x 8 GPUs
    assert tr["global_batch"] == 4096 and tr["micro_batch"] == 32
    s = cfg["setting"]
    assert (s.source, s.global_batch, s.micro_batch, s.grad_accum_steps, s.world_size) == (
        "config", 4096, 32, 16, 8)  # fmt: skip
    # data: 128 tokens, 15% masking (at most 20), 10 copies, the reference's short_seq_prob
    assert d["seq_len"] == 128 and d["mlm_probability"] == 0.15 and d["max_predictions"] == 20
    assert d["duplication_factor"] == 10 and d["short_seq_prob"] == 0.1
    assert cfg["tokenizer"]["vocab_size"] == 30522 and cfg["tokenizer"]["pad_vocab_to_multiple_of"] == 8
    # the clock, validation (denser in the first 5% and last 1%), the reference's stops, fine-tuning checkpoints
    assert tr["clock"] == "wall"
    v = tr["validation"]
    assert (v["dense_first"], v["dense_last"]) == (0.05, 0.01) and v["dense_every"] < v["every"]
    assert tr["early_stop"] == [{"after_minutes": 180, "max_loss": 6.0}]
    assert tr["loss_scale_floor"] == {"scale": 1.0, "steps": 100} and tr["stop_on_nonfinite_loss"] is True
    assert tr["finetune_checkpoints"] == [0.5, 0.9]
    # no resumable checkpoint during the run, as the reference's (--num_epochs_between_checkpoints 10000): the end's
    assert tr["checkpoint_every_s"] is None
    # the model the stage builds: the tokenizer's 30522 words padded to 30528 as the reference pads them
    index = {"vocab_size": 30522, "seq_len": 128, "special_ids": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}}
    recipe = BudgetRecipe.of(cfg)
    assert pretrain.model_dict(recipe.model, recipe.prep.tokenizer, index)["arch"]["vocab_size"] == 30528


def test_preset_file_values_override_the_catalog(tmp_path):
    cfg = preset_cfg(tmp_path, train={"lr": 5e-4, "budget_hours": 8})
    assert cfg["train"]["lr"] == 5e-4 and cfg["train"]["budget_hours"] == 8
    assert cfg["recipe_keys"]["train.lr"] == "file" and cfg["train"]["eps"] == 1e-6


TINY = {
    "model": {"base": "bert-24h", "name": "tiny-24h",
              "arch": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}},
    "tokenizer": {"vocab_size": 301},
    "data": {"seq_len": 32, "duplication_factor": 2, "samples_per_shard": 150, "docs_per_batch": 40},
    "train": {"budget_hours": 6 / 3600, "gpu": "cpu", "gpus_per_node": 1, "global_batch": 8, "micro_batch": 4,
              "precision": "fp32", "threads": 1, "checkpoint_every_s": 3, "early_stop": [],
              "validation": {"every": 0.25, "dense_every": 0.1, "dense_first": 0.1, "dense_last": 0.1,
                             "max_samples": 16}},
}  # fmt: skip


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_tiny_size_of_the_preset_runs_end_to_end(tmp_path):
    """The preset with a tiny model (`model.base: bert-24h`: the catalog's recipe, the arch's size replaced), a
    6-second wall-clock budget, on a CPU: data, pre-training, result, summary table and loss plot."""
    cfg = preset_cfg(tmp_path, **TINY)
    assert cfg["train"]["lr"] == 1e-3 and cfg["train"]["betas"] == [0.9, 0.98]  # still the recipe's
    assert cfg["model"]["arch"]["sparse_prediction"] is True and cfg["model"]["arch"]["num_hidden_layers"] == 1
    index = data.prepare_data(BudgetPrep.of(cfg), tmp_path / "data/index.json")
    assert index["vocab_size"] <= 301 and index["short_seq_prob"] == 0.1
    out = tmp_path / "pretrain"
    res = pretrain.pretrain(cfg, tmp_path / "data/index.json", out / "model", out / "result.json", out / "run",
                            out / "log", threads=1)  # fmt: skip
    assert res["stop_reason"] == "budget" and res["clock"] == "wall" and res["steps"] >= 1
    assert res["wall_s"] >= 6.0 and res["elapsed_s"] == res["wall_s"] and res["train_s"] < res["wall_s"]
    assert res["vocab_size"] % 8 == 0 and res["vocab_size"] >= res["tokenizer_vocab_size"]
    assert res["sequences"] == res["steps"] * 8
    ref = res["reference"]
    assert (ref["steps"], ref["global_batch"]) == (23_000, 4096)
    assert ref["pace_steps"] == pytest.approx(23_000 * 6 / 86400)
    assert json.loads((out / "result.json").read_text())["sequences"] == res["sequences"]
    summary = (out / "summary.md").read_text()
    assert "reference, 24 h" in summary and "23,000" in summary and re.search(rf"\| {res['steps']:,} +\|", summary)
    png = (out / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_clock_is_checked_by_the_schema(tmp_path):
    with pytest.raises(ConfigError, match=r"train.clock: 'cpu' is not one of \['wall', 'train'\]"):
        preset_cfg(tmp_path, train={"clock": "cpu"})


def test_a_catalog_recipe_the_stage_cannot_train_is_refused_naming_the_file(tmp_path):
    models = yaml.safe_load((REPO / "config/models.yaml").read_text())
    models["models"]["bert-24h"]["recipe"]["optimizer"]["name"] = "adam"
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(models))
    with pytest.raises(ConfigError, match=rf"{tmp_path}/budget.yaml: the catalog recipe's optimizer 'adam'"):
        preset_cfg(tmp_path, catalog_models=str(tmp_path / "models.yaml"))
