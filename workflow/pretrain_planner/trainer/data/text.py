"""Text for the trainer's text tasks (the task registry, trainer/tasks.py): documents read from local files, a
generated corpus where there is none, and causal-LM token blocks.

- Documents come from plain text (one per line), JSON lines (one per line, the text in a field) or Parquet files
  (one per row, a column), streamed (`iter_documents`); the masked-LM preparation (data/mlm.py) reads them too.
- Without data, a generated corpus: made-up words in Zipf-like frequencies (synthetic text, labelled so).
- Causal LM (GPT-NeoX/Pythia, Mamba): a tokenizer from a local `tokenizers` file or a byte-level BPE trained here on
  the corpus (at most the model's vocabulary); documents joined with the end token and packed into blocks of the
  recipe's sequence length (labels = inputs: the model shifts them).
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pretrain_planner.runlog import fingerprint

GENERATED_LABEL = "generated corpus (synthetic made-up-word text, not a real data set)"


JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


def file_format(path: str, fmt: str = "auto") -> str:
    """text, jsonl or parquet: `fmt` unless auto, else from the file's extension (anything unknown is text)."""
    if fmt != "auto":
        return fmt
    name = path.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return "text"


def _texts(path: str, fmt: str, field: str) -> Iterator[str]:
    """The raw document texts of one file, streamed (Parquet: one row group's column at a time)."""
    if fmt == "text":
        with open(path, encoding="utf-8", errors="replace") as fh:
            yield from fh
    elif fmt == "jsonl":
        with open(path, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    text = rec[field]
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"{path}:{n}: not a JSON object with a {field!r} field (corpus.text_field): "
                                     f"{type(exc).__name__}: {exc}") from None  # fmt: skip
                if text is not None:
                    yield str(text)
    else:
        import polars as pl

        try:
            lazy = pl.scan_parquet(path).select(pl.col(field).cast(pl.Utf8))
            for frame in lazy.collect_batches() if hasattr(lazy, "collect_batches") else [lazy.collect()]:
                yield from (t for t in frame.get_column(field).to_list() if t is not None)
        except pl.exceptions.ColumnNotFoundError:
            raise ValueError(f"{path}: no column {field!r} (corpus.text_field)") from None


def iter_documents(files: list[str], fmt: str = "auto", field: str = "text") -> Iterator[str]:
    """Every non-empty document of every file, in order, streamed: a line of a text file, a record's `field` of a
    JSON-lines file, a row's `field` column of a Parquet file (newlines inside a document become spaces)."""
    for path in files:
        for text in _texts(path, file_format(path, fmt), field):
            text = text.strip()
            if "\n" in text or "\r" in text:  # a JSON / Parquet document: one line
                text = " ".join(text.split())
            if text:
                yield text


def generate_corpus(path: Path, seed: int, min_words: int) -> Path:
    """A deterministic text file of made-up words (one document per line, sentences ending in '.'), at least
    `min_words` words."""
    rng = np.random.default_rng([seed, 7])
    syll = ["ka", "lo", "mi", "nu", "ter", "sa", "vo", "ri", "pe", "dun", "ax", "el", "or", "ti", "qua", "zen"]
    words = sorted({"".join(rng.choice(syll, size=rng.integers(1, 4))) for _ in range(3000)})
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()
    lines, n = [], 0
    while n < min_words:
        sents = []
        for _ in range(int(rng.integers(3, 12))):
            k = int(rng.integers(4, 16))
            sents.append(" ".join(rng.choice(words, size=k, p=p)).capitalize() + ".")
            n += k
        lines.append(" ".join(sents))
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:  # kept as it is: a resumed run's data fingerprint holds
        path.write_text(text)
    return path


def text_files(data: str | None, out_dir: Path, seed: int, min_words: int) -> tuple[list[str], dict[str, Any]]:
    """The corpus files (a file, a folder of .txt files or a glob), or a generated corpus; and how to label it."""
    if data is None:
        f = generate_corpus(out_dir / "generated_corpus.txt", seed, min_words)
        return [str(f)], {"source": "generated", "synthetic": True, "label": GENERATED_LABEL, "files": [str(f)]}
    p = Path(data)
    files = sorted(str(x) for x in p.rglob("*.txt")) if p.is_dir() else sorted(glob.glob(data))
    if not files:
        raise FileNotFoundError(f"--data {data}: no text files")
    return files, {"source": "local text", "synthetic": False, "label": f"local text ({len(files)} files)",
                   "files": files}  # fmt: skip


def _train_bpe(files: list[str], vocab_size: int, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(iter_documents(files), trainer)
    tok.save(str(out))
    return tok


def causal_lm_tokens(
    files: list[str], tokenizer: str | None, vocab_size: int, seq_len: int, data_dir: Path
) -> tuple[np.ndarray, dict[str, Any]]:
    """Blocks (n, seq_len) of token ids: the documents joined with the end-of-text token, packed. Cached in
    data_dir (tokens.npy with the fingerprint of the files, tokenizer and sizes)."""
    from tokenizers import Tokenizer

    data_dir.mkdir(parents=True, exist_ok=True)
    fp = fingerprint([(f, Path(f).stat().st_size, Path(f).stat().st_mtime) for f in files], tokenizer, vocab_size,
                     seq_len)  # fmt: skip
    meta_path, tok_path, arr_path = data_dir / "tokens.json", data_dir / "tokenizer.json", data_dir / "tokens.npy"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if meta.get("fingerprint") == fp:
        return np.load(arr_path, mmap_mode="r"), meta
    if tokenizer:
        tok = Tokenizer.from_file(tokenizer)
        how = f"from {tokenizer}"
    else:
        tok = _train_bpe(files, min(vocab_size, 32000), tok_path)
        how = f"byte-level BPE trained on the corpus ({tok.get_vocab_size()} tokens)"
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"the tokenizer has {tok.get_vocab_size()} tokens, the model's vocabulary {vocab_size}")
    ends = [tok.token_to_id(t) for t in ("<|endoftext|>", "</s>", "[SEP]", "<eos>")]
    eos = next((i for i in ends if i is not None), None)
    ids: list[int] = []
    docs = list(iter_documents(files))
    for k in range(0, len(docs), 1000):
        for enc in tok.encode_batch(docs[k : k + 1000], add_special_tokens=False):
            ids.extend(enc.ids)
            if eos is not None:
                ids.append(eos)
    n = len(ids) // seq_len
    if n < 1:
        raise ValueError(f"the corpus has {len(ids)} tokens: fewer than one sequence of {seq_len}")
    blocks = np.asarray(ids[: n * seq_len], dtype=np.int32).reshape(n, seq_len)
    np.save(arr_path, blocks)
    meta = {"fingerprint": fp, "tokenizer": how, "tokenizer_vocab": tok.get_vocab_size(), "tokens": len(ids),
            "blocks": n, "seq_len": seq_len,
            "packing": "documents joined with the end token, cut into blocks"}  # fmt: skip
    meta_path.write_text(json.dumps(meta, indent=1))
    return blocks, meta
