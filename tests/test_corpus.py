"""The train stage's corpus (issue 54): formats detected and checked when the run is planned, with one line for
anything unreadable (planning/corpus.py); text tokenized shard by shard into token files on disk, resumable and
cached by content; token files read as memmapped blocks; the sample order bounded in memory and exact after a
resume (trainer/data/tokens.py, sampler.py). Tiny files in tmp_path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pretrain_planner import cli
from pretrain_planner.planning import corpus
from pretrain_planner.trainer.data import sampler, text, tokens

from .conftest import CATALOG, REPO, snakemake, write_config, write_plan

GPT = CATALOG.model("tiny-gptneox").to_dict()
WORDS = ("ka", "lo", "mi", "nu", "ter", "sa")
DOCS = [f"Document {i} tells of {WORDS[i % 6]} and {i * 7} things." for i in range(300)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> str:
    """A byte-level BPE of 300 tokens trained on DOCS (no download), as the trainer trains one."""
    from pretrain_planner.trainer.data.tokens import byte_level_bpe

    path = byte_level_bpe(DOCS, 300, tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return str(path)


def write_corpus(folder, kind: str, n_tokens: int = 4000) -> str:
    """A corpus of `kind` in `folder`: token ids (npy, bin uint16) or DOCS as text (jsonl folder, parquet,
    datasets folder, txt)."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(0).integers(0, 500, n_tokens)
    if kind == "npy":
        np.save(folder / "tokens.npy", ids.astype(np.uint16))
        return str(folder / "tokens.npy")
    if kind == "bin":
        ids.astype(np.uint16).tofile(folder / "tokens.bin")
        return str(folder / "tokens.bin")
    if kind == "jsonl":
        for k in range(2):
            with open(folder / f"part{k}.jsonl", "w") as fh:
                fh.writelines(json.dumps({"body": d}) + "\n" for d in DOCS[k::2])
        return str(folder)
    if kind == "parquet":
        import polars as pl

        pl.DataFrame({"body": DOCS}).write_parquet(folder / "c.parquet")
        return str(folder / "c.parquet")
    if kind == "datasets":
        import datasets

        datasets.disable_progress_bars()
        datasets.Dataset.from_dict({"body": DOCS}).save_to_disk(str(folder / "ds"))
        return str(folder / "ds")
    (folder / "c.txt").write_text("\n".join(DOCS) + "\n")
    return str(folder / "c.txt")


# -------------------------------------------------------------------------------- detection and refusals (plan time)
FORMATS = [("npy", "npy tokens"), ("bin", "bin tokens (uint16)"), ("jsonl", "jsonl"), ("parquet", "parquet"),
           ("datasets", "datasets"), ("txt", "text")]  # fmt: skip


@pytest.mark.parametrize(("kind", "fmt"), FORMATS)
def test_each_format_is_detected_from_its_headers(tmp_path, tok, kind, fmt):
    data = write_corpus(tmp_path, kind)
    dtype = "uint16" if kind == "bin" else None
    field = "body" if kind in ("jsonl", "parquet", "datasets") else None
    info = corpus.check_train_data(GPT, data, dtype, field, None if dtype or kind == "npy" else tok)
    assert info is not None and info.format == fmt
    assert info.tokens == (4000 if kind in ("npy", "bin") else None)
    assert len(info.files) == (2 if kind == "jsonl" else 1)
    if kind == "parquet":
        assert info.documents == len(DOCS)


def refusal(tmp_path, data: str, **kw) -> str:
    with pytest.raises(ValueError) as exc:
        corpus.check_train_data(GPT, data, kw.get("dtype"), kw.get("field"), kw.get("tokenizer"))
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_refusals_are_one_line_naming_the_fix(tmp_path, tok):
    npy = write_corpus(tmp_path / "n", "npy")
    assert "--tokenizer apply to text only" in refusal(tmp_path, npy, tokenizer=tok)
    assert "data_field" in refusal(tmp_path, npy, field="body")
    (tmp_path / "c.zip").write_bytes(b"PK\x03\x04")
    assert "unknown kind (.zip)" in refusal(tmp_path, str(tmp_path / "c.zip"))
    (tmp_path / "empty").mkdir()
    assert "an empty folder" in refusal(tmp_path, str(tmp_path / "empty"))
    b = write_corpus(tmp_path / "b", "bin")
    assert "uint16, uint32, int32" in refusal(tmp_path, b)
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 7)
    assert "not a whole number of uint16" in refusal(tmp_path, str(tmp_path / "odd.bin"), dtype="uint16")
    txt = write_corpus(tmp_path / "t", "txt")
    assert "needs a tokenizer" in refusal(tmp_path, txt)
    pq = write_corpus(tmp_path / "p", "parquet")
    assert "no column 'text'" in refusal(tmp_path, pq, tokenizer=tok)
    assert "not a tokenizers JSON" in refusal(tmp_path, pq, field="body", tokenizer=txt)
    big = tmp_path / "big.npy"
    np.save(big, np.array([1, 2, 600], dtype=np.int32))
    assert "token id 600 (on a sample) is not below the model's vocabulary 512" in refusal(tmp_path, str(big))
    (tmp_path / "mixed").mkdir()
    np.save(tmp_path / "mixed/a.npy", np.arange(3))
    (tmp_path / "mixed/b.txt").write_text("x\n")
    assert "several kinds (1 npy, 1 text)" in refusal(tmp_path, str(tmp_path / "mixed"))


def test_a_masked_lm_reads_text_and_trains_its_wordpiece_unless_given_one(tmp_path):
    """tiny-bert: text without a tokenizer is fine (its WordPiece is trained, as before); token ids are refused; a
    tokenizer folder with vocab.txt only passes (data/mlm.py converts it)."""
    bert = CATALOG.model("tiny-bert").to_dict()
    info = corpus.check_train_data(bert, write_corpus(tmp_path / "j", "jsonl"), None, "body", None)
    assert info is not None and info.format == "jsonl" and info.tokenizer == corpus.TRAIN_TOKENIZER
    with pytest.raises(ValueError, match="masked LM"):
        corpus.check_train_data(bert, write_corpus(tmp_path / "n", "npy"), None, None, None)
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab/vocab.txt").write_text("[PAD]\n[UNK]\n")
    txt = write_corpus(tmp_path / "t", "txt")
    assert corpus.check_train_data(bert, txt, None, None, str(tmp_path / "vocab")).tokenizer == str(tmp_path / "vocab")


def test_a_hugging_face_tokenizer_folder_is_its_tokenizer_json(tmp_path, tok):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf/tokenizer.json").write_text(Path(tok).read_text())
    assert corpus.tokenizer_file(str(tmp_path / "hf")) == str(tmp_path / "hf/tokenizer.json")
    (tmp_path / "sp").mkdir()
    with pytest.raises(ValueError, match="a folder without tokenizer.json"):
        corpus.tokenizer_file(str(tmp_path / "sp"))


def test_cli_refuses_at_plan_time_with_one_line(tmp_path, capsys, monkeypatch, tok):
    """`pretrain-planner train --data tokens.npy --tokenizer ...`, a .zip, an empty folder: one line, no job run,
    no output folder made."""
    monkeypatch.chdir(tmp_path)
    write_plan(tmp_path / "plan", "tiny-gptneox")
    npy = write_corpus(tmp_path / "n", "npy")
    (tmp_path / "c.zip").write_bytes(b"PK")
    (tmp_path / "empty").mkdir()
    for args in (["--data", npy, "--tokenizer", tok], ["--data", str(tmp_path / "c.zip")],
                 ["--data", str(tmp_path / "empty")]):  # fmt: skip
        rc = cli.main(["train", "--plan", str(tmp_path / "plan"), "--launcher", "debug", "--steps", "2", "--out",
                       str(tmp_path / "out"), *args])  # fmt: skip
        err = capsys.readouterr().err.strip()
        assert rc == 1 and len(err.splitlines()) == 1 and "--data" in err, err
        assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a Snakemake subprocess (about 10 s)
def test_dry_run_refuses_the_train_data_with_one_line(tmp_path):
    (tmp_path / "c.zip").write_bytes(b"PK")
    cfg = write_config(tmp_path / "c.yaml", sweep={"models": ["tiny-gptneox"], "gpus": ["cpu"], "methods": ["naive"]},
                       train={"data": str(tmp_path / "c.zip")})  # fmt: skip
    (tmp_path / "results/optimal/tiny-gptneox/cpu/1x1").mkdir(parents=True)
    write_plan(tmp_path / "results/optimal/tiny-gptneox/cpu/1x1", "tiny-gptneox")
    proc = snakemake(tmp_path, "-n", "results/train/tiny-gptneox/cpu/1x1/result.json", "--configfile", str(cfg))
    assert proc.returncode != 0
    assert "c.zip: a file of an unknown kind (.zip)" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


# -------------------------------------------------------------------------------- tokenizing, reading, the order
def test_text_is_tokenized_into_shards_resumable_and_cached_by_content(tmp_path, tok, monkeypatch):
    """A jsonl folder cut into pieces of 2 KB: one shard each, the same ids as tokenizing the documents in one
    go; a shard removed (a killed run) is redone alone; the same content under another name is the cache."""
    from tokenizers import Tokenizer

    monkeypatch.setattr(tokens, "PIECE_BYTES", 2048)
    data = write_corpus(tmp_path / "c", "jsonl")
    info = corpus.check_train_data(GPT, data, None, "body", tok)
    files, dtype, man = tokens.tokenize_corpus(info, 512, tmp_path / "d", workers=1)
    assert len(files) > 4 and dtype == "uint16" and man["documents"] == len(DOCS)
    t = Tokenizer.from_file(tok)
    eos = t.token_to_id("<|endoftext|>")
    docs = [json.loads(ln)["body"] for f in info.files for ln in Path(f).read_text().splitlines()]
    want = [i for enc in t.encode_batch(docs, add_special_tokens=False) for i in [*enc.ids, eos]]
    got = np.concatenate([np.fromfile(f, dtype=dtype) for f in files])
    assert got.tolist() == want and man["tokens"] == len(want)
    # a killed run: the manifest not written, one shard's .json gone: only that shard is tokenized again
    folder = Path(files[0]).parent
    (folder / "corpus.json").unlink()
    (folder / "shard-00002.json").unlink()
    before = {f: Path(f).stat().st_mtime_ns for f in files}
    files2, _, man2 = tokens.tokenize_corpus(info, 512, tmp_path / "d", workers=1)
    changed = [f for f in files2 if Path(f).stat().st_mtime_ns != before[f]]
    assert [Path(f).name for f in changed] == ["shard-00002.bin"] and man2["tokens"] == len(want)
    # the same content moved elsewhere: the same cache key, nothing tokenized
    moved = tmp_path / "moved"
    (tmp_path / "c").rename(moved)
    info3 = corpus.check_train_data(GPT, str(moved), None, "body", tok)
    files3, _, man3 = tokens.tokenize_corpus(info3, 512, tmp_path / "d", workers=1)
    assert files3 == files2 and man3["fingerprint"] == man2["fingerprint"]
    # other content: another key
    with open(moved / "part0.jsonl", "a") as fh:
        fh.write(json.dumps({"body": "one more"}) + "\n")
    info4 = corpus.check_train_data(GPT, str(moved), None, "body", tok)
    assert tokens.tokenize_corpus(info4, 512, tmp_path / "d", workers=1)[2]["fingerprint"] != man2["fingerprint"]


def test_a_run_killed_while_tokenizing_resumes_at_the_unfinished_shards(tmp_path, tok, monkeypatch):
    """The third piece dies half-written (its .bin.part there, no manifest): the next run keeps shards 0-1 as they
    are and writes the rest; the result is the uninterrupted one's."""
    monkeypatch.setattr(tokens, "PIECE_BYTES", 2048)
    info = corpus.check_train_data(GPT, write_corpus(tmp_path / "c", "txt"), None, None, tok)
    whole = tokens.tokenize_corpus(info, 512, tmp_path / "whole", workers=1)
    real = tokens._tokenize_piece

    def dies_at_third(job):
        if job["name"] == "shard-00002":
            Path(job["folder"], "shard-00002.bin.part").write_bytes(b"\x01")
            raise KeyboardInterrupt("killed")
        return real(job)

    monkeypatch.setattr(tokens, "_tokenize_piece", dies_at_third)
    with pytest.raises(KeyboardInterrupt):
        tokens.tokenize_corpus(info, 512, tmp_path / "d", workers=1)
    folder = next((tmp_path / "d").glob("tokens-*"))
    assert sorted(p.name for p in folder.glob("*.json")) == ["shard-00000.json", "shard-00001.json"]
    kept = {p.name: p.stat().st_mtime_ns for p in folder.glob("shard-0000[01].bin")}
    monkeypatch.setattr(tokens, "_tokenize_piece", real)
    files, _, man = tokens.tokenize_corpus(info, 512, tmp_path / "d", workers=1)
    assert {p.name: p.stat().st_mtime_ns for p in folder.glob("shard-0000[01].bin")} == kept
    assert man["tokens"] == whole[2]["tokens"] and not list(folder.glob("*.part"))
    got = [np.fromfile(f, np.uint16).tolist() for f in files]
    assert got == [np.fromfile(f, np.uint16).tolist() for f in whole[0]]


def test_the_content_fingerprint_is_of_content_not_name_or_time(tmp_path):
    """Whole files in a small corpus; sampled chunks in one over the budget (here 0 bytes): a copy elsewhere or a
    touched file is the same corpus, an edit inside a sampled chunk is not."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(bytes(range(256)) * 64)
    b.write_bytes(a.read_bytes())
    for kw in ({}, {"budget": 0, "chunk": 256, "samples": 4}):
        fp = corpus.content_fingerprint([str(a)], **kw)
        assert corpus.content_fingerprint([str(b)], **kw) == fp
        b.touch()
        assert corpus.content_fingerprint([str(b)], **kw) == fp
        data = bytearray(b.read_bytes())
        data[0] ^= 1
        b.write_bytes(bytes(data))
        assert corpus.content_fingerprint([str(b)], **kw) != fp
        b.write_bytes(a.read_bytes())


def test_pieces_are_tokenized_by_parallel_workers(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(tokens, "PIECE_BYTES", 4096)
    info = corpus.check_train_data(GPT, write_corpus(tmp_path / "c", "txt"), None, None, tok)
    one = tokens.tokenize_corpus(info, 512, tmp_path / "one", workers=1)
    two = tokens.tokenize_corpus(info, 512, tmp_path / "two", workers=2)
    assert one[2]["tokens"] == two[2]["tokens"] and len(one[0]) >= 2
    for a, b in zip(one[0], two[0], strict=True):
        assert np.fromfile(a, np.uint16).tolist() == np.fromfile(b, np.uint16).tolist()


def test_token_shards_read_as_blocks_without_concatenating(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(10, dtype=np.int32))
    np.arange(100, 107, dtype=np.uint32).tofile(tmp_path / "b.bin")
    blocks = tokens.TokenBlocks([str(tmp_path / "a.npy")], None, 4)
    assert len(blocks) == 2 and blocks[np.array([1, 0])].tolist() == [[4, 5, 6, 7], [0, 1, 2, 3]]
    two = tokens.TokenBlocks([str(tmp_path / "b.bin"), str(tmp_path / "b.bin")], "uint32", 3)
    assert len(two) == 4 and two[np.array([2, 3])].tolist() == [[100, 101, 102], [103, 104, 105]]
    assert two[np.array([0])].dtype == np.int64


def test_large_sample_orders_are_windowed_exact_and_resumable(monkeypatch):
    """Above WINDOW samples an epoch is a permutation made of windows (memory O(n / WINDOW + WINDOW)): every sample
    once per epoch; a sampler restored from a checkpoint's (epoch, offset) continues the same order; two ranks'
    slices are disjoint."""
    monkeypatch.setattr(sampler, "WINDOW", 16)
    n = 100
    s = sampler.IndexSampler(n, 5)
    epoch = np.concatenate([s.take(7) for _ in range(15)])[:n]
    assert sorted(epoch.tolist()) == list(range(n)) and epoch.tolist() != list(range(n))
    a = sampler.IndexSampler(n, 5)
    a.take(37)
    b = sampler.IndexSampler(n, 5)
    b.load_state(json.loads(json.dumps(a.state())))
    assert a.take(150).tolist() == b.take(150).tolist()
    batch = sampler.IndexSampler(n, 5).take(8)
    assert not set(batch[:4].tolist()) & set(batch[4:].tolist())


def test_an_unknown_extension_is_never_read_as_text(tmp_path):
    """The budget stage's documents too: a .npy named as a corpus file is refused (it was read as text)."""
    np.save(tmp_path / "t.npy", np.arange(5))
    with pytest.raises(ValueError, match="not a text file of a known kind"):
        list(text.iter_documents([str(tmp_path / "t.npy")]))


def test_the_plan_time_check_imports_no_torch():
    code = ("import sys; from pretrain_planner.planning import corpus; from pretrain_planner.train import jobs; "
            "assert 'torch' not in sys.modules and 'tokenizers' not in sys.modules")  # fmt: skip
    env = {"PYTHONPATH": str(REPO / "workflow")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
