"""Text for the trainer's text tasks (the task registry, trainer/tasks.py): the corpus a run names (checked by
planning/corpus.py: token files or text of a known kind, never an unknown file read as text), documents read from
text files, and a generated corpus where there is none.

- Documents come from plain text (one per line), JSON lines (one per line, the text in a field), Parquet files
  (one per row, a column) or a Hugging Face datasets folder's Arrow files (a column), streamed (`iter_documents`);
  the masked-LM preparation (data/mlm.py) reads them too.
- Without data, a generated corpus: made-up words in Zipf-like frequencies (synthetic text, labelled so).
- Causal LM (GPT-NeoX/Pythia, Mamba): token files read as memmaps, or text tokenized into token shards on disk
  (data/tokens.py), cut into blocks of the recipe's sequence length (labels = inputs: the model shifts them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pretrain_planner.planning.corpus import (
    TRAIN_TOKENIZER,
    CorpusInfo,
    inspect_corpus,
    kind_of,
    tokenizer_file,
)

GENERATED_LABEL = "generated corpus (synthetic made-up-word text, not a real data set)"


def file_format(path: str, fmt: str = "auto") -> str:
    """text, jsonl, parquet or datasets (an Arrow file): `fmt` unless auto, else from the file's extension; an
    unknown extension is refused (never read as text)."""
    if fmt != "auto":
        return fmt
    kind = kind_of(Path(path))
    if kind not in ("text", "jsonl", "parquet", "datasets"):
        raise ValueError(f"{path}: not a text file of a known kind (.txt, .jsonl, .parquet, a datasets folder's "
                         f".arrow{'; token ids are for causal LMs' if kind else ''}); corpus.format names the format "
                         "of files whose extension does not")  # fmt: skip
    return kind


def _texts(path: str, fmt: str, field: str) -> Iterator[str]:
    """The raw document texts of one file, streamed (Parquet and datasets Arrow files: through the train stage's
    piece reader, tokens.piece_documents, so the two stages read a column the same way)."""
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
    elif fmt == "datasets":
        from pretrain_planner.trainer.data.tokens import piece_documents

        yield from piece_documents({"file": path}, "datasets", field)
    else:  # Parquet: one row group at a time, by the train stage's reader (trainer/data/tokens.py)
        import pyarrow.parquet as pq

        from pretrain_planner.trainer.data.tokens import piece_documents

        meta = pq.ParquetFile(path)
        if field not in meta.schema_arrow.names:
            raise ValueError(f"{path}: no column {field!r} (corpus.text_field)")
        for group in range(meta.num_row_groups):
            yield from piece_documents({"file": path, "row_group": group}, "parquet", field)


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


def corpus(
    data: str | None,
    out_dir: Path,
    seed: int,
    min_words: int,
    *,
    dtype: str | None = None,
    field: str | None = None,
    tokenizer: str | None = None,
    tokenizer_default: str | None = None,
) -> tuple[CorpusInfo, dict[str, Any]]:
    """The corpus (planning/corpus.py: a file, folder or glob of token ids or text, checked from its headers), or
    a generated corpus (a BPE trained on it unless a tokenizer is given); and how to label it in the result."""
    if data is None:
        f = generate_corpus(out_dir / "generated_corpus.txt", seed, min_words)
        tok = tokenizer_file(tokenizer) if tokenizer and tokenizer != TRAIN_TOKENIZER else TRAIN_TOKENIZER
        info = CorpusInfo("text", [str(f)], str(f), tokenizer=tok)
        return info, {"source": "generated", "synthetic": True, "label": GENERATED_LABEL, "format": "generated",
                      "files": [str(f)]}  # fmt: skip
    info = inspect_corpus(data, dtype, field, tokenizer, text_tokenizer_default=tokenizer_default)
    n = len(info.files)
    return info, {"source": "local", "synthetic": False, "label": f"{info.format} ({n} file{'s' if n > 1 else ''})",
                  "format": info.format, "path": data, "files": info.files[:20], "file_count": n,
                  "field": info.field if not info.is_tokens else None}  # fmt: skip
