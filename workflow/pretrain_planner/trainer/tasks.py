"""The trainer's side of the task registry (planning/tasks.py): per task, the synthetic batches of the model's real
shapes that the benchmark times (`synthetic_batch`) and the data a run that trains for real reads (`prepare`: the
train stage for every task, the budget stage's masked LM through `masked_lm_shards`).

A task's data (`TaskData`) is a global sample stream in a seeded order whose position is the checkpoint's `data`;
every rank walks the same stream and trains on its own slice of each micro-batch (`batch`). Its `validation` (when
there is one) evaluates a held-out slice never trained on: the last rows of the blocks or images
(trainer/validation.py), the masked LM's validation shards.

- causal LM (GPT-NeoX/Pythia, Mamba): token files (.npy, .bin), text (txt, jsonl, parquet, a datasets folder)
  tokenized into token shards on disk with a tokenizer from a file or a byte-level BPE trained here when asked, or
  a generated corpus; read as memmaps in blocks of the recipe's sequence length (data/text.py, data/tokens.py);
- masked LM (BERT, RoBERTa): WordPiece, samples of the sequence length, static masking, shards (data/mlm.py,
  read back by data/shards.py);
- image classification (ViT, ConvNeXt): a local image folder, or synthetic images (data/images.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pretrain_planner.planning.corpus import TRAIN_TOKENIZER, check_vocab, content_fingerprint
from pretrain_planner.planning.tasks import TASKS
from pretrain_planner.runlog import fingerprint
from pretrain_planner.trainer.data import images, mlm, shards, text, tokens
from pretrain_planner.trainer.data.sampler import IndexSampler
from pretrain_planner.trainer.validation import Evaluate, holdout, rows_evaluator


@dataclass
class DataRequest:
    """What a run asks of its data: `data` (files, a folder or glob; None: generated or synthetic), `tokenizer`
    (a local tokenizers file; None: trained on the corpus), the seed, at least `min_samples` samples, the folder
    the prepared data goes to, the log, and whether this rank prepares (rank 0) or reads what rank 0 wrote."""

    data: str | None
    tokenizer: str | None
    seed: int
    min_samples: int
    folder: Path
    log: Path | None = None
    rank0: bool = True
    dtype: str | None = None  # a raw .bin's token dtype (planning/corpus.TOKEN_DTYPES)
    field: str | None = None  # the text field of jsonl / parquet / datasets (None: "text")


@dataclass
class TaskData:
    """A task's data for one rank: `batch` (this rank's slice of the next micro_batch x world samples, on the
    device), the sampler's position (`state` / `load_state`), what the data is (`info`), the tokens of a sample,
    the model dict with what the data sets in it (a tokenizer's pad id), and notes for the result."""

    sampler: Any
    fetch: Callable[[int, int, int, Any], dict[str, torch.Tensor]]  # (micro_batch, world, rank, device) -> batch
    info: dict[str, Any]
    tokens_per_sample: int | None
    model: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    validation: Evaluate | None = None  # the held-out loss (trainer/validation.py); None: nothing held out

    def batch(self, micro_batch: int, world: int, rank: int, device: Any) -> dict[str, torch.Tensor]:
        """This rank's slice of the next `micro_batch` x `world` samples of the stream."""
        return self.fetch(micro_batch, world, rank, device)

    def state(self) -> dict[str, Any]:
        return self.sampler.state()

    def load_state(self, s: dict[str, Any]) -> None:
        self.sampler.load_state(s)


def _indexed(sampler: IndexSampler, get: Callable[[np.ndarray], dict[str, torch.Tensor]]):
    """A fetch over an IndexSampler: this rank's slice of the next micro_batch x world indices, made a batch by
    `get`."""

    def fetch(micro_batch: int, world: int, rank: int, device: Any) -> dict[str, torch.Tensor]:
        idx = sampler.take(micro_batch * world)[rank * micro_batch : (rank + 1) * micro_batch]
        return {k: v.to(device, non_blocking=True) for k, v in get(idx).items()}

    return fetch


# ------------------------------------------------------------------------------------------------ real data
def causal_lm(model: dict[str, Any], req: DataRequest) -> TaskData:
    """Token files read as memmaps, or text tokenized into token shards on disk first (rank 0; the others find the
    finished shards): blocks of the recipe's sequence length read by index (data/tokens.py); the last blocks are
    held out for validation."""
    seq, vocab = int(model["recipe"]["sequence_length"]), int(model["arch"]["vocab_size"])
    corpus_info, info = text.corpus(req.data, req.folder, req.seed, req.min_samples * seq, dtype=req.dtype,
                                    field=req.field, tokenizer=req.tokenizer)  # fmt: skip
    if corpus_info.is_tokens:
        top = check_vocab(corpus_info, vocab)
        files, dtype = corpus_info.files, corpus_info.dtype
        meta = {"tokenizer": None, "tokens": corpus_info.tokens, "max_token_id_sampled": top,
                "fingerprint": fingerprint(content_fingerprint(files), dtype)}  # fmt: skip
    else:
        files, dtype, manifest = tokens.tokenize_corpus(corpus_info, vocab, req.folder)
        meta = {k: manifest[k] for k in ("tokenizer", "tokenizer_vocab", "tokens", "documents", "fingerprint")}
        meta["token_shards"] = str(Path(files[0]).parent) if files else None
    blocks = tokens.TokenBlocks(files, dtype, seq)
    if len(blocks) < 1:
        raise ValueError(f"the corpus has {blocks.tokens} tokens: fewer than one sequence of {seq} in any file")
    info = {**info, **meta, "blocks": len(blocks), "seq_len": seq,
            "packing": "documents joined with the end token, cut into blocks (each file's tail left out)"}  # fmt: skip
    n_train = len(blocks) - holdout(len(blocks))  # the last blocks are held out for validation
    sampler = IndexSampler(n_train, req.seed)

    def get(idx: np.ndarray) -> dict[str, torch.Tensor]:
        ids = torch.from_numpy(blocks[np.sort(idx)])
        return {"input_ids": ids, "labels": ids.clone()}

    info = {**info, "validation_blocks": len(blocks) - n_train}
    return TaskData(sampler, _indexed(sampler, get), info, seq, dict(model),
                    validation=rows_evaluator(n_train, len(blocks), get))  # fmt: skip


def masked_lm_shards(index_path: Path, seed: int, model: dict[str, Any], info: dict[str, Any]) -> TaskData:
    """The masked-LM data of a prepared index.json (data/mlm.py): its training shards' sampler and batches."""
    index = json.loads(Path(index_path).read_text())
    sampler = shards.ShardSampler(index_path.parent, index["splits"]["train"], index["duplication_factor"], seed)
    pad = index["special_ids"]["pad"]

    def fetch(micro_batch: int, world: int, rank: int, device: Any) -> dict[str, torch.Tensor]:
        return shards.rank_batch(sampler, micro_batch, world, rank, pad, device)

    held = index["splits"].get("validation") or []

    def evaluate(net: torch.nn.Module, micro_batch: int, batches: int, device: Any, autocast: Any) -> float:
        return shards.validation_loss(net, held, index_path.parent, pad, micro_batch, micro_batch * batches, device,
                                      autocast)  # fmt: skip

    return TaskData(sampler, fetch, info, int(index["seq_len"]), model, validation=evaluate if held else None)


def masked_lm(model: dict[str, Any], req: DataRequest) -> TaskData:
    seq = int(model["recipe"]["sequence_length"])
    corpus_info, info = text.corpus(req.data, req.folder, req.seed, req.min_samples * seq, dtype=req.dtype,
                                    field=req.field, tokenizer_default=TRAIN_TOKENIZER)  # fmt: skip
    if corpus_info.is_tokens:
        raise ValueError(f"--data {req.data}: token ids; the masked-LM task prepares its own samples from text")
    files = corpus_info.files
    tokenizer = None if req.tokenizer == TRAIN_TOKENIZER else req.tokenizer  # a file or folder (data/mlm.py)
    index_path = req.folder / "mlm" / "index.json"
    if req.rank0:
        prep = mlm.mlm_config(files, tokenizer, model, req.seed, corpus_info.field)
        mlm.prepare_data(prep, index_path, req.log, corpus_keys=mlm.TRAIN_CORPUS_KEYS)
    index = json.loads(index_path.read_text())
    if index["vocab_size"] > int(model["arch"]["vocab_size"]):
        raise ValueError(f"the tokenizer has {index['vocab_size']} tokens, the model's vocabulary "
                         f"{model['arch']['vocab_size']}")  # fmt: skip
    pad = index["special_ids"]["pad"]
    info = {**info, "prepared_by": "trainer/data/mlm.py (WordPiece, static masking)",
            "tokenizer": tokenizer or "WordPiece trained on the corpus", "tokenizer_vocab": index["vocab_size"],
            "seq_len": index["seq_len"], "samples": index["samples"], "fingerprint": index["fingerprint"],
            "model_overrides": {"pad_token_id": pad}}  # fmt: skip
    with_pad = {**model, "arch": {**model["arch"], "pad_token_id": pad}}
    data = masked_lm_shards(index_path, req.seed, with_pad, info)
    if index["seq_len"] != seq:
        data.notes.append(f"sequence length {index['seq_len']} (the model's positions), not the recipe's {seq}")
    return data


def image_classification(model: dict[str, Any], req: DataRequest) -> TaskData:
    source = images.ImageSource(req.data, int(model["recipe"]["image_size"]), int(model["arch"].get("num_labels", 2)),
                                req.seed, req.min_samples)  # fmt: skip
    n_train = source.n - holdout(source.n)  # the last images are held out for validation
    sampler = IndexSampler(n_train, req.seed)
    info = {**source.info, "validation_images": source.n - n_train}
    return TaskData(sampler, _indexed(sampler, source.batch), info, None, dict(model),
                    validation=rows_evaluator(n_train, source.n, source.batch))  # fmt: skip


# ------------------------------------------------------------------------------------------ synthetic batches
def _synthetic_tokens(model: dict[str, Any], micro_batch: int, generator: torch.Generator) -> torch.Tensor:
    vocab, seq = model["arch"]["vocab_size"], model["recipe"]["sequence_length"]
    return torch.randint(0, vocab, (micro_batch, seq), generator=generator)


def _synthetic_causal(model: dict[str, Any], micro_batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    ids = _synthetic_tokens(model, micro_batch, generator)
    return {"input_ids": ids, "labels": ids.clone()}


def _synthetic_masked(model: dict[str, Any], micro_batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Mask `mlm_probability` of the positions, predict only those (-100 elsewhere)."""
    ids = _synthetic_tokens(model, micro_batch, generator)
    vocab, seq = model["arch"]["vocab_size"], model["recipe"]["sequence_length"]
    masked = torch.rand(micro_batch, seq, generator=generator) < model["recipe"].get("mlm_probability", 0.15)
    masked[:, 0] |= ~masked.any(dim=1)  # at least one target per sequence
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    inputs = torch.where(masked, torch.full_like(ids, vocab - 1), ids)
    return {"input_ids": inputs, "labels": labels}


def _synthetic_images(model: dict[str, Any], micro_batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    size = model["recipe"]["image_size"]
    return {
        "pixel_values": torch.randn(micro_batch, 3, size, size, generator=generator),
        "labels": torch.randint(0, model["arch"].get("num_labels", 2), (micro_batch,), generator=generator),
    }


@dataclass(frozen=True)
class TaskEntry:
    prepare: Callable[[dict[str, Any], DataRequest], TaskData]
    synthetic: Callable[[dict[str, Any], int, torch.Generator], dict[str, torch.Tensor]]


ENTRIES: dict[str, TaskEntry] = {
    "causal_lm": TaskEntry(causal_lm, _synthetic_causal),
    "masked_lm": TaskEntry(masked_lm, _synthetic_masked),
    "image_classification": TaskEntry(image_classification, _synthetic_images),
}
assert set(ENTRIES) == set(TASKS), "every task of planning/tasks.py needs its entry here"


def prepare(model: dict[str, Any], req: DataRequest) -> TaskData:
    """The task's data for `model` (a ModelSpec.to_dict()) on this rank."""
    return ENTRIES[model["task"]].prepare(model, req)


def synthetic_batch(model: dict[str, Any], micro_batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A synthetic micro-batch with the model's real shapes (CPU tensors; the caller moves them)."""
    return ENTRIES[model["task"]].synthetic(model, micro_batch, generator)
