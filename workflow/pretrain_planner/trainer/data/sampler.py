"""A seeded sample order whose position is a checkpoint's (the causal-LM blocks, the images); the masked-LM shards
have their own (data/shards.py ShardSampler). Every rank walks the same stream and takes its own slice (disjoint
samples); the order is a function of (seed, epoch, offset) alone, so a requeued run resumes it exactly.

Up to `WINDOW` samples an epoch is one permutation; beyond, the epoch's order is windows of WINDOW consecutive
samples in a seeded order, each permuted: memory O(n / WINDOW + WINDOW) instead of O(n), so a corpus of billions of
tokens costs no more than a small one."""

from __future__ import annotations

import numpy as np

WINDOW = 1 << 16


class IndexSampler:
    """Sample indices 0..n-1 in a seeded order, a fresh permutation every epoch; the position (epoch, offset) is
    the checkpoint's."""

    def __init__(self, n: int, seed: int) -> None:
        if n < 1:
            raise ValueError("no samples")
        self.n, self.seed, self.epoch, self.offset = n, seed, 0, 0
        self._perm: tuple[int, np.ndarray] | None = None
        self._window: tuple[tuple[int, int], np.ndarray] | None = None

    def _order(self) -> np.ndarray:
        if self._perm is None or self._perm[0] != self.epoch:
            rng = np.random.default_rng([self.seed, self.epoch])
            self._perm = (self.epoch, rng.permutation(self.n if self.n <= WINDOW else -(-self.n // WINDOW)))
        return self._perm[1]

    def _part(self, k: int) -> np.ndarray:
        """Up to k indices from the current position (within one window when the order is windowed)."""
        if self.n <= WINDOW:
            return self._order()[self.offset : self.offset + k]
        order = self._order()
        last = len(order) - 1  # the one window shorter than WINDOW (the samples' tail), at slot j of the order
        short, j = self.n - last * WINDOW, int(np.flatnonzero(order == last)[0])
        if self.offset < j * WINDOW:
            slot, at = divmod(self.offset, WINDOW)
        elif self.offset < j * WINDOW + short:
            slot, at = j, self.offset - j * WINDOW
        else:
            q, at = divmod(self.offset - j * WINDOW - short, WINDOW)
            slot = j + 1 + q
        w = int(order[slot])
        if self._window is None or self._window[0] != (self.epoch, w):
            size = short if w == last else WINDOW
            perm = np.random.default_rng([self.seed, self.epoch, 1, w]).permutation(size) + w * WINDOW
            self._window = ((self.epoch, w), perm)
        return self._window[1][at : at + k]

    def take(self, k: int) -> np.ndarray:
        out = []
        while k > 0:
            part = self._part(k)
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
