"""Budget stage, inputs: plain text, JSON lines and Parquet corpora give the same documents; short_seq_prob's
shorter samples; a local Hugging Face tokenizer folder (made here, nothing downloaded)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from pretrain_planner.planning.configtypes import BudgetPrep
from pretrain_planner.trainer.data import mlm as data
from pretrain_planner.trainer.data import shards, text

from .conftest import REPO, budget_cfg

DOCS = sorted((REPO / "tests/data/corpus").glob("*.txt"))


def _lines() -> list[str]:
    return [ln.strip() for p in DOCS for ln in p.read_text().splitlines() if ln.strip()]


def test_text_jsonl_and_parquet_give_the_same_documents(tmp_path):
    import polars as pl

    docs = _lines()[:50]
    (tmp_path / "a.txt").write_text("\n".join(docs) + "\n")
    # JSON lines with the text in a configurable field; a document with newlines inside is one document
    recs = [{"id": i, "body": d} for i, d in enumerate(docs)]
    recs[3]["body"] = recs[3]["body"].replace(" ", "\n", 2)
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + "\n")
    pl.DataFrame({"id": list(range(len(docs))), "body": docs}).write_parquet(tmp_path / "c.parquet")
    plain = list(text.iter_documents([str(tmp_path / "a.txt")]))
    jsonl = list(text.iter_documents([str(tmp_path / "b.jsonl")], field="body"))
    parquet = list(text.iter_documents([str(tmp_path / "c.parquet")], field="body"))
    assert plain == docs and jsonl == docs and parquet == docs
    # the format from corpus.format over the extension
    (tmp_path / "d.data").write_text((tmp_path / "b.jsonl").read_text())
    assert list(text.iter_documents([str(tmp_path / "d.data")], fmt="jsonl", field="body")) == docs
    with pytest.raises(ValueError, match="'text' field"):
        list(text.iter_documents([str(tmp_path / "b.jsonl")]))
    with pytest.raises(ValueError, match="no column 'text'"):
        list(text.iter_documents([str(tmp_path / "c.parquet")]))


def test_prepare_data_from_jsonl_and_parquet_matches_text(tmp_path):
    import polars as pl

    docs = _lines()
    (tmp_path / "c.txt").write_text("\n".join(docs) + "\n")
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    pl.DataFrame({"text": docs}).write_parquet(tmp_path / "c.parquet")
    tok = None
    arrays = {}
    for ext in ("txt", "jsonl", "parquet"):
        sub = tmp_path / ext
        sub.mkdir()
        extra = {"tokenizer": {"path": str(tok)}} if tok else {}
        cfg = budget_cfg(sub, corpus={"files": [str(tmp_path / f"c.{ext}")]}, **extra)
        index = data.prepare_data(BudgetPrep.of(cfg), sub / "d/index.json")
        tok = tok or sub / "d/tokenizer.json"  # one tokenizer for all three (WordPiece training ties)
        arrays[ext] = (index["samples"], np.array(shards.load_shard(sub / "d", "train-00000")["input_ids"]))
    assert arrays["txt"][0] == arrays["jsonl"][0] == arrays["parquet"][0]
    assert np.array_equal(arrays["txt"][1], arrays["jsonl"][1])
    assert np.array_equal(arrays["txt"][1], arrays["parquet"][1])


def test_short_seq_prob_makes_shorter_samples(tmp_path):
    # the rule: a seeded draw per document, a target in [2, seq_len - 2]
    targets = [data.short_target(128, 0.1, 0, i) for i in range(20_000)]
    short = [t for t in targets if t is not None]
    assert len(short) / len(targets) == pytest.approx(0.1, abs=0.01)
    assert min(short) >= 2 and max(short) <= 126 and len(set(short)) > 100
    # a draw of its own per document (seed, index), not a shared stream: any order of asking gives the same targets,
    # and another seed others (a re-prepared corpus, or one prepared on other ranks, has the same samples)
    assert [data.short_target(128, 0.1, 0, i) for i in reversed(range(2000))][::-1] == targets[:2000]
    assert [data.short_target(128, 0.1, 1, i) for i in range(2000)] != targets[:2000]
    assert all(data.short_target(128, 0.0, 0, i) is None for i in range(100))
    out = data.build_samples([[10] * 40], seq_len=32, cls=2, sep=3, min_tokens=2, target=5)
    assert [len(s) for s in out] == [7] * 8, "a short-sequence document: samples of target + [CLS] + [SEP]"
    # the effect on the prepared data: more samples, shorter on average, the longest still seq_len
    lengths = {}
    for p in (0.0, 0.5):
        sub = tmp_path / str(p)
        sub.mkdir()
        cfg = budget_cfg(sub, data={"short_seq_prob": p})
        index = data.prepare_data(BudgetPrep.of(cfg), sub / "d/index.json")
        pad = index["special_ids"]["pad"]
        real = [(np.array(shards.load_shard(sub / "d", s["name"])["input_ids"][0]) != pad).sum(1)
                for s in index["splits"]["train"]]  # fmt: skip
        lengths[p] = np.concatenate(real)
    assert len(lengths[0.5]) > len(lengths[0.0])
    assert lengths[0.5].mean() < 0.9 * lengths[0.0].mean()
    assert lengths[0.5].max() == lengths[0.0].max() == 32


def _trained_tokenizer(tmp_path):
    docs = _lines()
    path = tmp_path / "trained.json"
    data.train_tokenizer([], 300, True, path, iter(docs))
    return path


def test_local_hugging_face_tokenizer_folder(tmp_path):
    """tokenizer.path: a folder saved by transformers' save_pretrained - with tokenizer.json (a fast tokenizer) or
    with vocab.txt alone (a BertTokenizer: converted to a fast one from the local files)."""
    from transformers import BertTokenizer, PreTrainedTokenizerFast

    src = _trained_tokenizer(tmp_path)
    specials = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                "mask_token": "[MASK]"}  # fmt: skip
    fast_dir = tmp_path / "hf-fast"
    PreTrainedTokenizerFast(tokenizer_file=str(src), **specials).save_pretrained(fast_dir)
    assert (fast_dir / "tokenizer.json").is_file()
    cfg = budget_cfg(tmp_path, tokenizer={"path": str(fast_dir)})
    index = data.prepare_data(BudgetPrep.of(cfg), tmp_path / "fast/index.json", tmp_path / "fast.log")
    assert "tokenizer: copied" in (tmp_path / "fast.log").read_text()
    from tokenizers import Tokenizer

    ours = Tokenizer.from_file(str(tmp_path / "fast/tokenizer.json"))
    assert ours.get_vocab() == Tokenizer.from_file(str(src)).get_vocab()
    assert index["vocab_size"] == len(ours.get_vocab())
    # vocab.txt only (a slow BERT tokenizer's folder)
    vocab = sorted(Tokenizer.from_file(str(src)).get_vocab().items(), key=lambda kv: kv[1])
    (tmp_path / "vocab.txt").write_text("".join(w + "\n" for w, _ in vocab))
    slow_dir = tmp_path / "hf-slow"  # a bert-*-uncased style folder without tokenizer.json
    slow_dir.mkdir()
    (slow_dir / "vocab.txt").write_text((tmp_path / "vocab.txt").read_text())
    (slow_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                                "do_lower_case": True}))  # fmt: skip
    cfg = budget_cfg(tmp_path, tokenizer={"path": str(slow_dir)})
    index = data.prepare_data(BudgetPrep.of(cfg), tmp_path / "slow/index.json")
    assert index["vocab_size"] == len(vocab) and index["special_ids"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3,
                                                                          "mask": 4}  # fmt: skip
    sentence = "the quick brown fox"
    converted = Tokenizer.from_file(str(tmp_path / "slow/tokenizer.json"))
    want = ours.encode(sentence, add_special_tokens=False).tokens
    assert converted.encode(sentence, add_special_tokens=False).tokens == want
    assert BertTokenizer(str(tmp_path / "vocab.txt")).tokenize(sentence) == want


def test_a_parquet_corpus_is_read_by_the_train_stages_reader(tmp_path):
    """The masked-LM preparation reads a Parquet corpus through tokens.piece_documents (one row group at a time, as
    the train stage does), with the documents it read before: nulls and empty rows skipped, a document's newlines
    made spaces, every row group in order, a missing column named; and without polars (one reader of Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = ["first doc", None, "  ", "multi\nline\r\ndoc", *[f"doc {i}" for i in range(7)]]
    pq.write_table(pa.table({"id": list(range(len(rows))), "body": rows}), tmp_path / "c.parquet", row_group_size=3)
    assert pq.ParquetFile(tmp_path / "c.parquet").num_row_groups == 4
    want = ["first doc", "multi line doc", *[f"doc {i}" for i in range(7)]]
    assert list(text.iter_documents([str(tmp_path / "c.parquet")], field="body")) == want
    with pytest.raises(ValueError, match="no column 'text'"):
        list(text.iter_documents([str(tmp_path / "c.parquet")]))
    probe = ("import sys; from pretrain_planner.trainer.data import text; "
             f"n = len(list(text.iter_documents([{str(tmp_path / 'c.parquet')!r}], field='body'))); "
             "print(n, 'polars' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == [str(len(want)), "False"], out.stderr[-2000:]
