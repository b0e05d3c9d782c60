"""The masked-LM shards read back (data/mlm.py writes them): the seeded sample order whose position is a
checkpoint's (`ShardSampler`), this rank's slice of a micro-batch as model inputs, and the validation loss over the
held-out shards. torch is imported where a batch is made, so the preparation (in the workflow's process) stays
without it.

A shard `{split}-{k:05d}` is three arrays: `input_ids` (D, S, L) with masking applied, `positions` (D, S, P) the
masked positions (-1 = none) and `labels` (D, S, P) the original tokens there (-100 = none).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

ARRAYS = ("input_ids", "positions", "labels")


def shard_paths(data_dir: str | Path, name: str) -> dict[str, Path]:
    return {a: Path(data_dir) / f"{name}.{a}.npy" for a in ARRAYS}


def load_shard(data_dir: str | Path, name: str) -> dict[str, np.ndarray]:
    """A shard's arrays as read-only memmaps."""
    return {a: np.load(p, mmap_mode="r") for a, p in shard_paths(data_dir, name).items()}


class ShardSampler:
    """Samples in a seeded order: per epoch, shards shuffled and samples shuffled within each shard; epoch e
    reads masked copy e mod D. The position (epoch, shard, offset) is three integers: the checkpoint's."""

    def __init__(self, data_dir: str | Path, shards: list[dict[str, Any]], copies: int, seed: int):
        self.data_dir, self.shards, self.copies, self.seed = Path(data_dir), shards, copies, seed
        self.epoch = self.shard_pos = self.offset = 0
        self._order_cache: tuple[int, np.ndarray] | None = None
        self._perm_cache: tuple[tuple[int, int], np.ndarray] | None = None
        self._shard_cache: tuple[str, dict[str, np.ndarray]] | None = None

    def _order(self) -> np.ndarray:
        if self._order_cache is None or self._order_cache[0] != self.epoch:
            perm = np.random.default_rng([self.seed, self.epoch, 1]).permutation(len(self.shards))
            self._order_cache = (self.epoch, perm)
        return self._order_cache[1]

    def _shard(self, k: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        name = self.shards[k]["name"]
        if self._shard_cache is None or self._shard_cache[0] != name:
            self._shard_cache = (name, load_shard(self.data_dir, name))
        if self._perm_cache is None or self._perm_cache[0] != (self.epoch, k):
            perm = np.random.default_rng([self.seed, self.epoch, 2, k]).permutation(self.shards[k]["samples"])
            self._perm_cache = ((self.epoch, k), perm)
        return self._shard_cache[1], self._perm_cache[1]

    def take(self, n: int) -> dict[str, np.ndarray]:
        parts: dict[str, list[np.ndarray]] = {"input_ids": [], "positions": [], "labels": []}
        while n > 0:
            k = int(self._order()[self.shard_pos])
            arrays, perm = self._shard(k)
            idx = np.sort(perm[self.offset : self.offset + n])
            copy = self.epoch % self.copies
            for a in parts:
                parts[a].append(np.asarray(arrays[a][copy][idx]))
            self.offset += len(idx)
            n -= len(idx)
            if self.offset >= self.shards[k]["samples"]:
                self.offset, self.shard_pos = 0, self.shard_pos + 1
                if self.shard_pos >= len(self.shards):
                    self.shard_pos, self.epoch = 0, self.epoch + 1
        return {a: np.concatenate(v) for a, v in parts.items()}

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "shard_pos": self.shard_pos, "offset": self.offset}

    def load_state(self, s: dict[str, int]) -> None:
        self.epoch, self.shard_pos, self.offset = s["epoch"], s["shard_pos"], s["offset"]


def to_batch(arrays: dict[str, np.ndarray], pad_id: int, device: Any) -> dict[str, Any]:
    """Model inputs: masked ids, attention mask, dense labels (-100 except at the masked positions)."""
    import torch

    ids = torch.from_numpy(arrays["input_ids"].astype(np.int64))
    pos = torch.from_numpy(arrays["positions"].astype(np.int64))
    lab = torch.from_numpy(arrays["labels"].astype(np.int64))
    labels = torch.full_like(ids, -100)
    valid = pos >= 0
    rows = torch.arange(ids.shape[0]).unsqueeze(1).expand_as(pos)
    labels[rows[valid], pos[valid]] = lab[valid]
    return {
        "input_ids": ids.to(device),
        "attention_mask": (ids != pad_id).long().to(device),
        "labels": labels.to(device),
    }


def rank_batch(sampler: ShardSampler, micro_batch: int, world: int, rank: int, pad_id: int, device: Any):
    """This rank's slice of the next micro x world samples of the global stream, as model inputs (the sampler's
    state stays the same on every rank, so rank 0's checkpoint resumes them all)."""
    part = sampler.take(micro_batch * world)
    return to_batch({a: v[rank * micro_batch : (rank + 1) * micro_batch] for a, v in part.items()}, pad_id, device)


def validation_shards(shards: list[dict[str, Any]], index: int, rotate: bool) -> list[dict[str, Any]]:
    """The held-out shards the `index`-th validation of a run (0-based) evaluates: with `rotate` (the reference's
    run_pretraining.py `pretrain_validation`: shard `index mod n` of its held-out shards, the next one each time),
    one shard; else all of them, in order (of which validation_loss takes the first max_samples)."""
    return [shards[index % len(shards)]] if rotate and shards else list(shards)


def validation_loss(model, sampler_shards, data_dir, pad_id, micro_batch, max_samples, device, autocast) -> float:
    """Mean masked-LM loss over the first `max_samples` samples of `sampler_shards` (every masked token weighs the
    same)."""
    import torch

    with torch.no_grad():
        return _validation_loss(model, sampler_shards, data_dir, pad_id, micro_batch, max_samples, device, autocast)


def _validation_loss(model, sampler_shards, data_dir, pad_id, micro_batch, max_samples, device, autocast) -> float:
    model.eval()
    total, count, seen = 0.0, 0, 0
    for shard in sampler_shards:
        arrays = load_shard(data_dir, shard["name"])
        for start in range(0, shard["samples"], micro_batch):
            take = min(micro_batch, shard["samples"] - start, max_samples - seen)
            if take <= 0:
                break
            batch = to_batch({a: np.asarray(v[0][start : start + take]) for a, v in arrays.items()}, pad_id, device)
            n = int((batch["labels"] != -100).sum())
            with autocast():
                loss = model(**batch).loss
            total += float(loss) * n
            count += n
            seen += take
    model.train()
    return total / max(count, 1)
