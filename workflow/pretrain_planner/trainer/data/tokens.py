"""A causal LM's corpus as token ids on disk, at any size: text tokenized piece by piece into .bin shards, and token
files (the user's or ours) read as memmaps cut into blocks. The process's memory does not grow with the corpus:
documents are streamed in batches, ids are appended to the shard file, blocks are read by index. Torch-free.

- `tokenize_corpus`: a text corpus (planning/corpus.py's CorpusInfo) cut into pieces (a text or JSON-lines file by
  byte ranges of `PIECE_BYTES` ending at a line, a Parquet row group, a datasets Arrow file), each piece tokenized
  by a worker process into `shard-{k:05d}.bin` with a manifest `shard-{k:05d}.json` written once the shard is
  whole (a killed run resumes: finished shards are skipped), progress on stderr, the folder keyed by the corpus's
  content and the tokenizer's (`tokens-{key}/`: another run on the same corpus, wherever it lies, reuses it).
- `TokenBlocks`: N token files (1-D or 2-D .npy, raw .bin of a dtype) as one sequence of blocks of `seq_len`
  (each file's tail shorter than a block is left out): no concatenation into memory.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from pretrain_planner.planning.corpus import TRAIN_TOKENIZER, CorpusInfo, content_fingerprint
from pretrain_planner.runlog import fingerprint

PIECE_BYTES = 64 << 20  # a text / JSON-lines piece: what one worker tokenizes into one shard
BATCH_DOCS = 512  # documents per encode_batch: the memory a worker holds at once
END_TOKENS = ("<|endoftext|>", "</s>", "[SEP]", "<eos>")


# ------------------------------------------------------------------------------------------------ documents
def _clean(text: Any) -> str | None:
    if text is None:
        return None
    text = str(text).strip()
    if "\n" in text or "\r" in text:  # a JSON / Parquet / Arrow document: one line
        text = " ".join(text.split())
    return text or None


def _line_pieces(f: str) -> list[dict[str, Any]]:
    """Byte ranges of about PIECE_BYTES, each ending at a line end (found by reading one line past the mark)."""
    size = Path(f).stat().st_size
    cuts = [0]
    with open(f, "rb") as fh:
        for mark in range(PIECE_BYTES, size, PIECE_BYTES):
            if mark <= cuts[-1]:
                continue
            fh.seek(mark)
            fh.readline()
            if fh.tell() < size:
                cuts.append(fh.tell())
    cuts.append(size)
    return [{"file": f, "start": a, "end": b} for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def pieces(info: CorpusInfo) -> list[dict[str, Any]]:
    """The corpus cut into pieces a worker tokenizes into one shard each, in corpus order."""
    out: list[dict[str, Any]] = []
    for f in info.files:
        if info.kind in ("text", "jsonl"):
            out += _line_pieces(f)
        elif info.kind == "parquet":
            import pyarrow.parquet as pq

            out += [{"file": f, "row_group": g} for g in range(pq.ParquetFile(f).num_row_groups)]
        else:
            out.append({"file": f})
    return out


def piece_documents(piece: dict[str, Any], kind: str, field: str) -> Iterator[str]:
    """The non-empty documents of one piece, streamed (a line, a record's field, a row's column)."""
    f = piece["file"]
    if kind in ("text", "jsonl"):
        with open(f, "rb") as fh:
            fh.seek(piece["start"])
            pos, n = piece["start"], 0
            while pos < piece["end"]:
                raw = fh.readline()
                if not raw:
                    break
                pos += len(raw)
                n += 1
                line = raw.decode("utf-8", errors="replace")
                if kind == "text":
                    text = _clean(line)
                else:
                    if not line.strip():
                        continue
                    try:
                        text = _clean(json.loads(line)[field])
                    except (ValueError, KeyError, TypeError) as exc:
                        raise ValueError(f"{f} (line {n} after byte {piece['start']}): not a JSON object with a "
                                         f"{field!r} field (train.data_field): {exc}") from None  # fmt: skip
                if text:
                    yield text
    elif kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(f)
        for batch in pf.iter_batches(batch_size=BATCH_DOCS, row_groups=[piece["row_group"]], columns=[field]):
            yield from (t for t in map(_clean, batch.column(0).to_pylist()) if t)
    else:  # a datasets Arrow file (an IPC stream), read batch by batch (not memory-mapped: bounded resident memory)
        import pyarrow as pa

        with pa.OSFile(f, "rb") as src:
            reader = pa.ipc.open_stream(src)
            col = reader.schema.get_field_index(field)
            for batch in reader:
                yield from (t for t in map(_clean, batch.column(col).to_pylist()) if t)


def corpus_documents(info: CorpusInfo) -> Iterator[str]:
    for piece in pieces(info):
        yield from piece_documents(piece, info.kind, info.field)


# ------------------------------------------------------------------------------------------------ tokenizing
def token_dtype(vocab: int) -> str:
    return "uint16" if vocab <= 1 << 16 else "uint32"


def end_token(tok: Any) -> int | None:
    ids = [tok.token_to_id(t) for t in END_TOKENS]
    return next((i for i in ids if i is not None), None)


def _tokenize_piece(job: dict[str, Any]) -> dict[str, Any]:
    """One piece into `{name}.bin` (written as `.part`, renamed when whole) and its manifest `{name}.json`."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(job["tokenizer"])
    folder, name, eos, dtype = Path(job["folder"]), job["name"], job["eos"], job["dtype"]
    part, n_tokens, n_docs, top = folder / f"{name}.bin.part", 0, 0, 0
    with open(part, "wb") as out:
        batch: list[str] = []

        def flush() -> None:
            nonlocal n_tokens, n_docs, top
            for enc in tok.encode_batch(batch, add_special_tokens=False):
                ids = enc.ids + ([eos] if eos is not None else [])
                arr = np.asarray(ids, dtype=dtype)
                arr.tofile(out)
                n_tokens += len(ids)
                top = max(top, max(ids, default=0))
            n_docs += len(batch)
            batch.clear()

        for doc in piece_documents(job["piece"], job["kind"], job["field"]):
            batch.append(doc)
            if len(batch) >= BATCH_DOCS:
                flush()
        if batch:
            flush()
    os.replace(part, folder / f"{name}.bin")
    manifest = {"name": name, "piece": job["piece"], "tokens": n_tokens, "documents": n_docs, "max_id": top}
    tmp = folder / f"{name}.json.part"
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, folder / f"{name}.json")
    return manifest


def _finished(folder: Path, name: str, dtype: str) -> dict[str, Any] | None:
    """A shard's manifest when the shard is whole (its .bin has the manifest's tokens), else None."""
    m, b = folder / f"{name}.json", folder / f"{name}.bin"
    if not (m.is_file() and b.is_file()):
        return None
    rec = json.loads(m.read_text())
    return rec if b.stat().st_size == rec["tokens"] * np.dtype(dtype).itemsize else None


def workers_here() -> int:
    """Worker processes: the cores this process may use (its affinity: a SLURM task's cpus)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _progress(done: int, total: int, tokens: int, t0: float, out: Any = None) -> None:
    out = out or sys.stderr
    end = "\r" if out.isatty() and done < total else "\n"
    out.write(f"tokenizing the corpus: {done}/{total} shards, {tokens / 1e6:.1f} M tokens, "
              f"{time.monotonic() - t0:.0f} s{end}")  # fmt: skip
    out.flush()


def byte_level_bpe(documents: Iterable[str], vocab_size: int, out: Path) -> Path:
    """A byte-level BPE (GPT-2's alphabet, the end token `<|endoftext|>`) of at most `vocab_size` tokens trained on
    `documents` (streamed), saved at `out` (written aside, then renamed: a killed run leaves no half file)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(documents, trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    tok.save(str(tmp))
    os.replace(tmp, out)
    return out


def train_tokenizer(info: CorpusInfo, vocab_size: int, out: Path) -> Path:
    """A byte-level BPE trained on the corpus's documents (streamed), at most `vocab_size` tokens (asked for with
    train.tokenizer: train); kept at `out`, which a rerun on the same corpus reuses."""
    if out.is_file():
        return out
    return byte_level_bpe(corpus_documents(info), vocab_size, out)


def tokenize_corpus(
    info: CorpusInfo, vocab_size: int, data_dir: Path, workers: int | None = None, progress: Any = None
) -> tuple[list[str], str, dict[str, Any]]:
    """The text corpus as .bin token shards under data_dir/tokens-{key}/ (see the module's docstring): (the shard
    files, their dtype, the manifest: tokens, documents, tokenizer, fingerprint)."""
    from tokenizers import Tokenizer

    data_dir.mkdir(parents=True, exist_ok=True)
    content = content_fingerprint(info.files)
    if info.tokenizer == TRAIN_TOKENIZER:
        tok_path = train_tokenizer(info, min(vocab_size, 32000), data_dir / f"tokenizer-{content}.json")
        how = "byte-level BPE trained on the corpus"
    else:
        tok_path, how = Path(str(info.tokenizer)), f"from {info.tokenizer}"
    tok = Tokenizer.from_file(str(tok_path))
    vocab = tok.get_vocab_size()
    if vocab > vocab_size:
        raise ValueError(f"the tokenizer {tok_path} has {vocab} tokens, the model's vocabulary {vocab_size}")
    eos, dtype = end_token(tok), token_dtype(vocab)
    key = fingerprint(content, content_fingerprint([str(tok_path)]), info.kind, info.field, dtype, eos)
    folder = data_dir / f"tokens-{key}"
    manifest_path = folder / "corpus.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        return [str(folder / f"{s['name']}.bin") for s in manifest["shards"]], dtype, manifest
    folder.mkdir(parents=True, exist_ok=True)
    work = pieces(info)
    names = [f"shard-{k:05d}" for k in range(len(work))]
    done = {n: m for n in names if (m := _finished(folder, n, dtype)) is not None}
    common = {"folder": str(folder), "tokenizer": str(tok_path), "eos": eos, "dtype": dtype, "kind": info.kind,
              "field": info.field}  # fmt: skip
    jobs = [{"piece": p, "name": n, **common} for p, n in zip(work, names, strict=True) if n not in done]
    t0 = time.monotonic()
    tokens = sum(m["tokens"] for m in done.values())
    n_workers = max(1, min(workers or workers_here(), len(jobs)))
    if n_workers == 1:
        results: Iterator[dict[str, Any]] = map(_tokenize_piece, jobs)
        pool = None
    else:  # spawn: no fork of a process that may hold threads (torch, tokenizers)
        pool = ProcessPoolExecutor(n_workers, mp_context=get_context("spawn"))
        results = pool.map(_tokenize_piece, jobs)
    try:
        for m in results:
            done[m["name"]] = m
            tokens += m["tokens"]
            _progress(len(done), len(names), tokens, t0, progress)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    shards = [{"name": n, "tokens": done[n]["tokens"], "documents": done[n]["documents"]} for n in names]
    manifest = {"fingerprint": key, "content": content, "tokenizer": how, "tokenizer_file": str(tok_path),
                "tokenizer_vocab": vocab, "end_token": eos, "dtype": dtype, "tokens": tokens,
                "documents": sum(s["documents"] for s in shards), "max_id": max((done[n]["max_id"] for n in names),
                default=0), "shards": shards}  # fmt: skip
    tmp = folder / "corpus.json.part"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, manifest_path)
    return [str(folder / f"{n}.bin") for n in names], dtype, manifest


# ------------------------------------------------------------------------------------------------ reading
def open_tokens(path: str, dtype: str | None) -> np.ndarray:
    """A token file as a flat read-only memmap: .npy (its dtype; 2-D blocks flattened) or raw .bin of `dtype`."""
    if path.endswith(".npy"):
        return np.load(path, mmap_mode="r").reshape(-1)
    return np.memmap(path, dtype=np.dtype(dtype), mode="r")


class TokenBlocks:
    """Token files as one sequence of blocks of `seq_len`: block i lies in one file (each file's tail shorter than
    a block is left out); read by index from the memmaps, nothing concatenated."""

    def __init__(self, files: list[str], dtype: str | None, seq_len: int) -> None:
        self.files, self.dtype, self.seq_len = files, dtype, seq_len
        self._maps = [open_tokens(f, dtype) for f in files]
        per = np.asarray([len(m) // seq_len for m in self._maps], dtype=np.int64)
        self.ends = np.cumsum(per)
        self.tokens = int(sum(len(m) for m in self._maps))

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def __getitem__(self, idx: np.ndarray) -> np.ndarray:
        """Blocks `idx` (an array of indices) as int64 (len(idx), seq_len)."""
        idx = np.asarray(idx, dtype=np.int64)
        out = np.empty((len(idx), self.seq_len), dtype=np.int64)
        shard = np.searchsorted(self.ends, idx, side="right")
        for row, (i, s) in enumerate(zip(idx.tolist(), shard.tolist(), strict=True)):
            start = (i - (int(self.ends[s - 1]) if s else 0)) * self.seq_len
            out[row] = self._maps[s][start : start + self.seq_len]
        return out
