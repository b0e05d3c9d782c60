"""Budget stage, data preparation: static masking statistics, duplication, determinism and resume."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from pretrain_planner.budget import config as bconfig
from pretrain_planner.planning.configtypes import BudgetPrep, BudgetRecipe
from pretrain_planner.schema import ConfigError
from pretrain_planner.trainer.data import mlm as data
from pretrain_planner.trainer.data import shards

from .conftest import REPO, budget_cfg

SPECIAL = [0, 1, 2, 3, 4]  # pad unk cls sep mask
VOCAB = 500


def _ids(rng, n, seq, lengths):
    ids = rng.integers(5, VOCAB, size=(n, seq))
    ids[:, 0] = 2
    for i, n_tok in enumerate(lengths):
        ids[i, n_tok - 1] = 3
        ids[i, n_tok:] = 0
    return ids


def test_masking_statistics():
    rng = np.random.default_rng(0)
    n, seq = 4000, 64
    lengths = rng.integers(10, seq + 1, size=n)
    ids = _ids(rng, n, seq, lengths)
    out, pos, lab = data.mask_samples(ids, rng, vocab_size=VOCAB, special=SPECIAL, mask_id=4)
    n_cand = lengths - 2
    want = np.minimum(20, np.maximum(1, np.rint(n_cand * 0.15)))
    assert ((pos >= 0).sum(1) == want).all()
    valid = pos >= 0
    rows = np.nonzero(valid)[0]
    p = pos[valid].astype(int)
    assert not np.isin(ids[rows, p], SPECIAL).any(), "special tokens are never masked"
    assert (lab[valid] == ids[rows, p]).all() and (lab[~valid] == -100).all()
    gaps = np.diff(pos.astype(int), axis=1)
    assert (gaps[valid[:, 1:]] > 0).all(), "positions sorted and distinct, padding (-1) at the end"
    assert not (valid[:, 1:] & ~valid[:, :-1]).any()
    new = out[rows, p]
    frac_mask = np.mean(new == 4)
    frac_kept = np.mean(new == ids[rows, p])
    frac_random = 1 - frac_mask - frac_kept
    assert frac_mask == pytest.approx(0.8, abs=0.015)
    assert frac_random == pytest.approx(0.1, abs=0.015)
    assert frac_kept == pytest.approx(0.1, abs=0.015)
    assert not np.isin(out[rows, p][new != 4], SPECIAL).any(), "random replacements are ordinary tokens"
    untouched = np.ones_like(ids, dtype=bool)
    untouched[rows, p] = False
    assert (out[untouched] == ids[untouched]).all()
    rate = valid.sum() / n_cand.sum()
    assert rate == pytest.approx(0.15, abs=0.01)


def test_masking_cap_of_20_per_sequence():
    rng = np.random.default_rng(1)
    ids = _ids(rng, 200, 256, [256] * 200)
    _, pos, _ = data.mask_samples(ids, rng, vocab_size=VOCAB, special=SPECIAL, mask_id=4, max_predictions=20)
    assert pos.shape == (200, 20)
    assert ((pos >= 0).sum(1) == 20).all()  # 15% of 254 = 38, capped


def test_build_samples_consecutive_sentences():
    sents = [[10] * 5, [11] * 6, [12] * 20, [13] * 3]
    out = data.build_samples(sents, seq_len=16, cls=2, sep=3, min_tokens=2)
    assert all(s[0] == 2 and s[-1] == 3 and len(s) <= 16 for s in out)
    assert out[0] == [2, *[10] * 5, *[11] * 6, 3]  # sentences packed while they fit
    assert sum(len(s) - 2 for s in out) == 34  # nothing lost (the tail of 3 + 6 >= min_tokens)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("data")
    cfg = budget_cfg(tmp)
    index = data.prepare_data(BudgetPrep.of(cfg), tmp / "full/index.json", tmp / "full.log")
    return cfg, tmp, index


def test_prepare_writes_shards_and_index(prepared):
    cfg, tmp, index = prepared
    assert json.loads((tmp / "full/index.json").read_text()) == index
    assert len(index["splits"]["train"]) >= 3, "several shards: the corpus streams shard by shard"
    assert index["samples"]["train"] > 0 and index["samples"]["validation"] > 0
    frac = index["documents"]["validation"] / sum(index["documents"].values())
    assert 0.03 < frac < 0.2
    shard = shards.load_shard(tmp / "full", index["splits"]["train"][0]["name"])
    assert isinstance(shard["input_ids"], np.memmap)
    d, s, seq = shard["input_ids"].shape
    assert (d, seq) == (2, 32) and shard["positions"].shape == (2, s, 20)
    assert (shard["input_ids"][:, :, 0] == index["special_ids"]["cls"]).all()
    val = shards.load_shard(tmp / "full", index["splits"]["validation"][0]["name"])
    assert val["input_ids"].shape[0] == 1
    log = (tmp / "full.log").read_text()
    assert "tokenizer: trained" in log and "train shards" in log and "done" in log


def test_duplicates_are_masked_differently(prepared):
    _, tmp, index = prepared
    shard = shards.load_shard(tmp / "full", index["splits"]["train"][0]["name"])
    ids, pos, lab = (np.array(shard[a]) for a in ("input_ids", "positions", "labels"))
    originals = []
    for d in range(2):
        orig = ids[d].copy()
        rows, cols = np.nonzero(pos[d] >= 0)
        orig[rows, pos[d][rows, cols]] = lab[d][rows, cols]
        originals.append(orig)
    assert (originals[0] == originals[1]).all(), "the same text under each copy"
    differ = (pos[0] != pos[1]).any(axis=1).mean()
    assert differ > 0.9


def test_prepare_is_deterministic_and_resumes(prepared, monkeypatch):
    cfg, tmp, index = prepared
    # tokenizers' WordPiece training is not bit-identical across trainings (tie order of equal counts):
    # give the resumed run the same tokenizer; what is under test is the shards given a tokenizer.
    monkeypatch.setattr(
        data,
        "train_tokenizer",
        lambda files, vocab, lower, out, docs=None: shutil.copyfile(tmp / "full/tokenizer.json", out),
    )
    # a run stopped after one shard (as if killed), then restarted, gives exactly the uninterrupted result
    assert data.prepare_data(BudgetPrep.of(cfg), tmp / "resumed/index.json", tmp / "r.log", stop_after_shards=1) is None
    assert not (tmp / "resumed/index.json").exists()
    assert len(json.loads((tmp / "resumed/progress.json").read_text())["shards"]["train"]) == 1
    again = data.prepare_data(BudgetPrep.of(cfg), tmp / "resumed/index.json", tmp / "r.log")
    assert "resuming after document" in (tmp / "r.log").read_text()
    assert again == index
    for split in ("train", "validation"):
        for sh in index["splits"][split]:
            a, b = shards.load_shard(tmp / "full", sh["name"]), shards.load_shard(tmp / "resumed", sh["name"])
            for k in shards.ARRAYS:
                assert np.array_equal(a[k], b[k]), (sh["name"], k)


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="matches no file"):
        budget_cfg(tmp_path, corpus={"files": [str(tmp_path / "nothing*.txt")]})
    with pytest.raises(ConfigError, match="not a multiple"):
        budget_cfg(tmp_path, train={"global_batch": 10, "micro_batch": 4})
    with pytest.raises(ConfigError, match="train.lr"):
        budget_cfg(tmp_path, train={"lr": "fast"})


def test_default_config_is_valid():
    cfg = bconfig.load(REPO / "config/budget.yaml", REPO)
    assert cfg["model"]["family"] == "roberta-prelayernorm"
    assert len(cfg["corpus"]["files"]) == 2
    assert cfg["train"]["lr"] == 1e-3 and cfg["train"]["betas"] == [0.9, 0.98] and cfg["train"]["grad_clip"] is None


def test_catalog_model_by_name(tmp_path):
    from pretrain_planner.budget.pretrain import model_dict

    cfg = budget_cfg(tmp_path, model="bert-24h", catalog_models=str(REPO / "config/models.yaml"))
    assert cfg["model"]["family"] == "roberta-prelayernorm" and cfg["model"]["arch"]["num_hidden_layers"] == 24
    index = {"vocab_size": 30000, "seq_len": 128, "special_ids": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}}
    recipe = BudgetRecipe.of(cfg)
    m = model_dict(recipe.model, recipe.prep.tokenizer, index)
    assert m["arch"]["vocab_size"] == 30000 and m["arch"]["pad_token_id"] == 0
    assert m["arch"]["max_position_embeddings"] >= 129  # RoBERTa positions start after the padding id
    with pytest.raises(ConfigError, match="not a masked LM"):
        budget_cfg(tmp_path, model="tiny-gptneox", catalog_models=str(REPO / "config/models.yaml"))
