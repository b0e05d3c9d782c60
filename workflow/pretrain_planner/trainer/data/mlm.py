"""The masked-LM task's data (BERT, RoBERTa; the budget and the train stages'): documents -> WordPiece tokenizer ->
samples of the sequence length -> static masking x duplication -> .npy shards (read back by data/shards.py).

Documents come from data/text.py (plain text, JSON lines with the text in `corpus.text_field`, Parquet). The
tokenizer is trained here, or read from a tokenizers JSON file or a local Hugging Face tokenizer folder. As in the
reference (BERT's create_pretraining_data), a fraction `short_seq_prob` of the documents is cut into shorter
samples (a random target length). The settings are the budget file's `seed`, `corpus`, `tokenizer` and `data`
sections (workflow/schemas/budget.schema.yaml), typed (planning/configtypes.BudgetPrep); `mlm_config` makes them
for a catalog model's recipe.

Streaming (documents are read line by line, tokenised `docs_per_batch` at a time, and written one shard
at a time), deterministic given the seed, and resumable: progress.json records the shards written and
the document they end at; a restarted run skips those documents and continues. index.json, written
last, marks the data as complete.

A shard `{split}-{k:05d}` holds D = duplication factor copies (1 for validation) of S samples of seq_len L with
P = max_predictions masked positions (data/shards.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pretrain_planner.planning.configtypes import BudgetData, BudgetPrep, require
from pretrain_planner.planning.corpus import content_fingerprint
from pretrain_planner.planning.families import family
from pretrain_planner.results import atomic_write_text
from pretrain_planner.runlog import FileLog, fingerprint
from pretrain_planner.trainer.data.shards import ARRAYS, shard_paths
from pretrain_planner.trainer.data.text import iter_documents

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def corpus_documents(prep: BudgetPrep) -> Iterator[str]:
    """The documents of the settings' corpus (its files, format and text field)."""
    c = prep.corpus
    return iter_documents(list(c.files), c.format, c.text_field)


def is_validation(doc_index: int, seed: int, fraction: float) -> bool:
    """Held out or not, from a seeded hash of the document's number (stable, needs no pass over the data)."""
    digest = hashlib.blake2b(f"{seed}:{doc_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def split_sentences(doc: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(doc) if s]


# ----------------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(files: list[str], vocab_size: int, lowercase: bool, out_path: str | Path, train_docs=None):
    """A BERT-style WordPiece tokenizer trained on the (training) documents, saved as tokenizers JSON."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tok.train_from_iterator(train_docs if train_docs is not None else iter_documents(files), trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    # single segment type: type_vocab_size 1 in the recipe
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:0 [SEP]:0", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_path))
    return tok


def special_ids(tok) -> dict[str, int]:
    ids = {t.strip("[]").lower(): tok.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [k for k, v in ids.items() if v is None]
    if missing:
        raise ValueError(f"tokenizer lacks special tokens {missing} (needs {SPECIAL_TOKENS})")
    return ids


# ----------------------------------------------------------------------------------------------- samples
def short_target(seq_len: int, short_seq_prob: float, seed: int, doc_index: int) -> int | None:
    """The reference's (BERT's) short sequences: with probability short_seq_prob a document's samples aim at a
    random length in [2, seq_len - 2] tokens (without [CLS] / [SEP]), drawn once per document from a seeded
    generator keyed on the document's number (deterministic, resumable); None: the full seq_len - 2."""
    if short_seq_prob <= 0:
        return None
    rng = np.random.default_rng([seed, 3, doc_index])
    if rng.random() < short_seq_prob:
        return int(rng.integers(2, seq_len - 2, endpoint=True))
    return None


def build_samples(
    sentences_ids: list[list[int]], seq_len: int, cls: int, sep: int, min_tokens: int, target: int | None = None
) -> list[list[int]]:
    """Single-segment samples of consecutive sentences of one document: [CLS] s_i s_i+1 ... [SEP], at most
    seq_len tokens (`target` + 2 when given: a short-sequence document); a sentence longer than a sample is cut
    across samples; a short tail is dropped."""
    target = min(target, seq_len - 2) if target else seq_len - 2
    out, cur = [], []
    for ids in sentences_ids:
        if cur and len(cur) + len(ids) > target:
            out.append(cur)
            cur = []
        cur.extend(ids)
        while len(cur) >= target:
            out.append(cur[:target])
            cur = cur[target:]
    if cur and len(cur) >= min(min_tokens, target):
        out.append(cur)
    return [[cls, *s, sep] for s in out]


def pad_samples(samples: list[list[int]], seq_len: int, pad: int, dtype) -> np.ndarray:
    arr = np.full((len(samples), seq_len), pad, dtype=dtype)
    for i, s in enumerate(samples):
        arr[i, : len(s)] = s
    return arr


def mask_samples(
    ids: np.ndarray,
    rng: np.random.Generator,
    *,
    vocab_size: int,
    special: list[int],
    mask_id: int,
    probability: float = 0.15,
    max_predictions: int = 20,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Static masking (BERT): per sequence min(max_predictions, max(1, round(p x real tokens))) positions,
    chosen uniformly among non-special tokens; 80% -> [MASK], 10% -> a random non-special token, 10% kept.
    Returns (masked input_ids, positions (N, P) sorted with -1 padding, labels (N, P) with -100 padding)."""
    n, seq = ids.shape
    p = max_predictions
    candidates = ~np.isin(ids, special)
    n_cand = candidates.sum(axis=1)
    n_mask = np.minimum(np.minimum(p, n_cand), np.maximum(1, np.rint(n_cand * probability).astype(np.int64)))
    scores = rng.random((n, seq))
    scores[~candidates] = 2.0
    chosen = np.argsort(scores, axis=1, kind="stable")[:, : min(p, seq)]
    if chosen.shape[1] < p:
        chosen = np.pad(chosen, ((0, 0), (0, p - chosen.shape[1])))
    valid = np.arange(p)[None, :] < n_mask[:, None]
    chosen = np.where(valid, chosen, seq)  # invalid sorts last
    chosen.sort(axis=1)
    valid = chosen < seq
    positions = np.where(valid, chosen, -1)
    rows = np.arange(n)[:, None]
    safe = np.where(valid, chosen, 0)
    labels = np.where(valid, ids[rows, safe].astype(np.int64), -100)
    r = rng.random((n, p))
    n_special = max(special) + 1
    random_tok = rng.integers(n_special, vocab_size, size=(n, p))
    out = ids.copy()
    replace = np.where(r < 0.8, mask_id, np.where(r < 0.9, random_tok, labels))
    out[rows.repeat(p, 1)[valid], safe[valid]] = replace[valid]
    return out, positions.astype(np.int16 if seq < 32768 else np.int32), labels.astype(np.int32)


# ----------------------------------------------------------------------------------------------- shards
def _save(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.tmp.npy")
    np.save(tmp, arr)
    os.replace(tmp, path)


def _write_shard(data_dir, name, samples, copies, seed, split_id, shard_no, cd: BudgetData, vocab, sp, dtype) -> int:
    ids = pad_samples(samples, cd.seq_len, sp["pad"], dtype)
    out = {a: [] for a in ARRAYS}
    for d in range(copies):
        rng = np.random.default_rng([seed, split_id, shard_no, d])
        masked, pos, lab = mask_samples(
            ids, rng, vocab_size=vocab, special=sorted(sp.values()), mask_id=sp["mask"],
            probability=cd.mlm_probability, max_predictions=cd.max_predictions,
        )  # fmt: skip
        out["input_ids"].append(masked)
        out["positions"].append(pos)
        out["labels"].append(lab)
    for a, p in shard_paths(data_dir, name).items():
        _save(p, np.stack(out[a]))
    return len(samples)


# The corpus keys the train stage's data is fingerprinted by (its format is always detected from the files): the
# keys its settings had before they were typed, so its data and the runs checkpointed on it keep their identity.
TRAIN_CORPUS_KEYS = ("files", "validation_fraction", "text_field")


def prepare_data(
    prep: BudgetPrep,
    out_index: str | Path,
    log: str | Path | None = None,
    *,
    stop_after_shards: int | None = None,
    corpus_keys: tuple[str, ...] | None = None,
) -> dict[str, Any] | None:
    """The whole data preparation of `prep` (typed where the config was loaded: the facade's BudgetStage.data, the
    train stage's `mlm_config`); writes the shards next to `out_index`, then `out_index` itself. The data's
    fingerprint (what a resumed preparation and a run's checkpoint must match) is of the sections' values, the
    corpus's `corpus_keys` only (None: all; the train stage's: TRAIN_CORPUS_KEYS).

    `stop_after_shards` (testing) returns after writing that many training shards, as a killed run would.
    """
    require(prep, BudgetPrep, "trainer.data.mlm.prepare_data")
    logger = FileLog(log)
    data_dir = Path(out_index).parent
    data_dir.mkdir(parents=True, exist_ok=True)
    files = list(prep.corpus.files)
    js = prep.to_json()  # the sections as plain JSON (runlog.fingerprint sorts the keys)
    corpus = {k: v for k, v in js["corpus"].items() if corpus_keys is None or k in corpus_keys}
    fp = fingerprint(prep.seed, corpus, js["tokenizer"], js["data"], content_fingerprint(files))
    state = _progress(data_dir, fp, logger)
    tok = _tokenizer(prep, data_dir, logger)
    writer = _ShardWriter(prep, data_dir, tok, state, logger, stop_after_shards)
    for batch in _doc_batches(corpus_documents(prep), writer.cursor, prep.data.docs_per_batch):
        if writer.add(batch):
            return None
    return writer.finish(out_index)


def _progress(data_dir: Path, fp: str, logger) -> dict[str, Any]:
    """progress.json of an earlier run of the same config and corpus (to resume), else a fresh state (and the
    earlier run's shards and tokenizer deleted)."""
    progress_path = data_dir / "progress.json"
    state = json.loads(progress_path.read_text()) if progress_path.exists() else None
    if state is None or state.get("fingerprint") != fp:
        if state is not None:
            logger.info("config or corpus changed since the last run: starting the data over")
        for p in data_dir.glob("*.npy"):
            p.unlink()
        (data_dir / "tokenizer.json").unlink(missing_ok=True)
        state = {"fingerprint": fp, "doc_cursor": 0, "shards": {"train": [], "validation": []}, "documents": {}}
    return state


def _tokenizer(prep: BudgetPrep, data_dir: Path, logger):
    """data_dir/tokenizer.json, copied from tokenizer.path or trained on the training documents when it is not
    there yet (a resumed run keeps its tokenizer), loaded."""
    from tokenizers import Tokenizer

    tok_path = data_dir / "tokenizer.json"
    if not tok_path.exists():
        t0 = time.perf_counter()
        tc, files = prep.tokenizer, list(prep.corpus.files)
        if tc.path:
            copy_tokenizer(tc.path, tok_path)
            logger.info("tokenizer: copied %s", tc.path)
        else:
            seed, frac = prep.seed, prep.corpus.validation_fraction
            train_docs = (d for i, d in enumerate(corpus_documents(prep)) if not is_validation(i, seed, frac))
            train_tokenizer(files, tc.vocab_size, tc.lowercase, tok_path, train_docs)
            logger.info("tokenizer: trained WordPiece on %d files in %.1fs", len(files), time.perf_counter() - t0)
    return Tokenizer.from_file(str(tok_path))


def copy_tokenizer(src: str | Path, dest: Path) -> None:
    """A local tokenizer as a tokenizers JSON file at `dest`: a tokenizers JSON file as it is; a Hugging Face
    tokenizer folder (save_pretrained) by its tokenizer.json, or, without one (vocab.txt only), converted to a
    fast tokenizer by transformers from the local files alone (nothing is downloaded)."""
    src = Path(src)
    if src.is_file():
        shutil.copyfile(src, dest)
        return
    if not src.is_dir():
        raise FileNotFoundError(f"tokenizer.path {src}: neither a tokenizers JSON file nor a tokenizer folder")
    if (src / "tokenizer.json").is_file():
        shutil.copyfile(src / "tokenizer.json", dest)
        return
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src), local_files_only=True, use_fast=True)
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"tokenizer.path {src}: transformers cannot make a fast tokenizer of it")
    tok.backend_tokenizer.save(str(dest))


def _doc_batches(docs: Iterator[str], cursor: int, size: int) -> Iterator[list[tuple[int, str]]]:
    """(number, document) in batches of `size` (the last may be shorter), from document `cursor` on."""
    batch: list[tuple[int, str]] = []
    for i, doc in enumerate(docs):
        if i < cursor:
            continue
        batch.append((i, doc))
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


class _ShardWriter:
    """Documents -> samples in a training and a validation buffer -> a shard of each when the training buffer
    holds samples_per_shard, with progress.json recording where the shards end (what a resumed run skips)."""

    def __init__(self, prep: BudgetPrep, data_dir: Path, tok, state: dict[str, Any], logger, stop_after_shards):
        self.cd, self.data_dir, self.tok, self.state = prep.data, data_dir, tok, state
        self.logger, self.stop_after_shards = logger, stop_after_shards
        self.seed, self.frac = prep.seed, prep.corpus.validation_fraction
        self.sp = special_ids(tok)
        self.vocab = tok.get_vocab_size()
        self.dtype = np.uint16 if self.vocab <= np.iinfo(np.uint16).max else np.int32
        self.buffers: dict[str, list[list[int]]] = {"train": [], "validation": []}
        self.counts = {"train": 0, "validation": 0}
        self.counts.update(state["documents"])
        self.cursor = state["doc_cursor"]
        if self.cursor:
            logger.info("resuming after document %d (%d train shards written)", self.cursor,
                        len(state["shards"]["train"]))  # fmt: skip
        self.t0 = time.perf_counter()
        self.doc_no = 0  # one past the last document in the buffers

    def add(self, batch: list[tuple[int, str]]) -> bool:
        """Tokenise a batch of documents into samples of their split; a shard when one is full. True: stop now."""
        cd, sp = self.cd, self.sp
        sents = [split_sentences(d) for _, d in batch]
        flat = [s for ss in sents for s in ss]
        enc = self.tok.encode_batch(flat, add_special_tokens=False) if flat else []
        k = 0
        for (i, _), ss in zip(batch, sents, strict=True):
            ids = [e.ids for e in enc[k : k + len(ss)]]
            k += len(ss)
            split = "validation" if is_validation(i, self.seed, self.frac) else "train"
            self.counts[split] += 1
            target = short_target(cd.seq_len, cd.short_seq_prob, self.seed, i)
            samples = build_samples(ids, cd.seq_len, sp["cls"], sp["sep"], cd.min_tokens, target)
            self.buffers[split].extend(samples)
            self.doc_no = i + 1
            if len(self.buffers["train"]) >= cd.samples_per_shard and self.flush():
                return True
        return False

    def flush(self) -> bool:
        """Close the training shard (and the validation buffer with it); record progress. True: stop now."""
        state, dup = self.state, self.cd.duplication_factor
        for split, split_id, copies in (("train", 0, dup), ("validation", 1, 1)):
            if not self.buffers[split]:
                continue
            k = len(state["shards"][split])
            name = f"{split}-{k:05d}"
            n = _write_shard(self.data_dir, name, self.buffers[split], copies, self.seed, split_id, k, self.cd,
                             self.vocab, self.sp, self.dtype)  # fmt: skip
            state["shards"][split].append({"name": name, "samples": n})
            self.buffers[split] = []
        state["doc_cursor"] = self.doc_no
        state["documents"] = dict(self.counts)
        atomic_write_text(self.data_dir / "progress.json", json.dumps(state, indent=1))
        n_train = sum(s["samples"] for s in state["shards"]["train"])
        self.logger.info(
            "documents %d, train shards %d (%d samples x %d copies), validation shards %d, %.0f docs/s",
            self.doc_no, len(state["shards"]["train"]), n_train, dup, len(state["shards"]["validation"]),
            (self.doc_no - self.cursor) / max(time.perf_counter() - self.t0, 1e-9),
        )  # fmt: skip
        return self.stop_after_shards is not None and len(state["shards"]["train"]) >= self.stop_after_shards

    def finish(self, out_index: str | Path) -> dict[str, Any]:
        """The last shards, then index.json (what marks the data complete)."""
        state, counts, cd = self.state, self.counts, self.cd
        if self.buffers["train"] or self.buffers["validation"]:
            self.flush()
        if not state["shards"]["train"] or not state["shards"]["validation"]:
            raise ValueError(
                f"corpus too small: {counts['train']} training and {counts['validation']} validation documents "
                f"gave {len(state['shards']['train'])} / {len(state['shards']['validation'])} shards"
            )
        index = {
            "version": 1,
            "fingerprint": state["fingerprint"],
            "seed": self.seed,
            "tokenizer": "tokenizer.json",
            "vocab_size": self.vocab,
            "special_ids": self.sp,
            "seq_len": cd.seq_len,
            "max_predictions": cd.max_predictions,
            "mlm_probability": cd.mlm_probability,
            "duplication_factor": cd.duplication_factor,
            "short_seq_prob": cd.short_seq_prob,
            "dtype": np.dtype(self.dtype).name,
            "documents": counts,
            "samples": {s: sum(x["samples"] for x in v) for s, v in state["shards"].items()},
            "splits": state["shards"],
        }
        atomic_write_text(out_index, json.dumps(index, indent=1))
        self.logger.info("done: %s", json.dumps(index["samples"]))
        return index


def mlm_config(files: list[str], tokenizer: str | None, model: dict[str, Any], seed: int,
               text_field: str = "text") -> BudgetPrep:  # fmt: skip
    """The preparation's settings (`prepare_data`) for a catalog model's recipe (the train stage; the budget stage
    has its own file): WordPiece (at most the model's vocabulary), samples of the recipe's sequence length, its
    masking probability, about that share of positions predicted; the corpus's documents in `text_field`."""
    from pretrain_planner.schema import section

    r = model["recipe"]
    seq, p = int(r["sequence_length"]), float(r.get("mlm_probability") or 0.15)
    # leave room for the positions the family skips (RoBERTa: pad_token_id + 1); the tokenizer is not trained yet,
    # so its pad id is the config class's default (families.py)
    room = int(model["arch"].get("max_position_embeddings", seq)) - family(model["family"]).position_offset()
    tok = {"path": tokenizer, "vocab_size": min(int(model["arch"]["vocab_size"]), 30522)}
    data = {"seq_len": min(seq, room), "mlm_probability": p, "max_predictions": max(1, math.ceil(seq * p)),
            "duplication_factor": 2, "samples_per_shard": 4096}  # fmt: skip
    corpus = {"files": files, "validation_fraction": 0.05, "text_field": text_field}
    return BudgetPrep.of({
        "seed": seed,
        "corpus": section("budget", "corpus", corpus),
        "tokenizer": section("budget", "tokenizer", tok),
        "data": section("budget", "data", data),
    }, "the train stage's masked-LM data")  # fmt: skip
