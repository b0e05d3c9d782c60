"""A seeded sample order whose position is a checkpoint's (the causal-LM blocks, the images); the masked-LM shards
have their own (data/shards.py ShardSampler). Every rank walks the same stream and takes its own slice."""

from __future__ import annotations

import numpy as np


class IndexSampler:
    """Sample indices 0..n-1 in a seeded order, a fresh permutation every epoch; the position (epoch, offset) is
    the checkpoint's."""

    def __init__(self, n: int, seed: int) -> None:
        if n < 1:
            raise ValueError("no samples")
        self.n, self.seed, self.epoch, self.offset = n, seed, 0, 0
        self._perm: tuple[int, np.ndarray] | None = None

    def _order(self) -> np.ndarray:
        if self._perm is None or self._perm[0] != self.epoch:
            self._perm = (self.epoch, np.random.default_rng([self.seed, self.epoch]).permutation(self.n))
        return self._perm[1]

    def take(self, k: int) -> np.ndarray:
        out = []
        while k > 0:
            part = self._order()[self.offset : self.offset + k]
            out.append(part)
            self.offset += len(part)
            k -= len(part)
            if self.offset >= self.n:
                self.epoch, self.offset = self.epoch + 1, 0
        return np.concatenate(out)

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state(self, s: dict[str, int]) -> None:
        self.epoch, self.offset = s["epoch"], s["offset"]
