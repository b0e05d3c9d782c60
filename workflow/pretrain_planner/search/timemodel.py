"""The adaptive search's time model: a step's seconds under every hardware its measured cells leave possible.

A step is the step model's (planning/stepmodel.py, shared with the cross-GPU what-if, tables/whatif.py):
- compute = per-rank batch x seconds per sample (`tau`, one per method family) x 4/3 with activation
  checkpointing (the forward runs again) x (saturated / micro-batch) ** e below saturation;
- communication = syncs x one all-reduce of the gradients (2 x 4 bytes x parameters x (w - 1) / w over
  the bus bandwidth): one sync per step unsharded, one per micro-batch sharded, ZeRO-3 / full FSDP 1.5x;
- offload = the CPU optimizer over this rank's shard (16 bytes per parameter over the CPU-Adam bandwidth) +
  fetching the parameters over PCIe (4 bytes per parameter) every micro-batch at full sharding.

Nothing about the hardware is assumed beyond wide ranges: the bus, CPU-Adam and PCIe bandwidths and the
exponent e range over grids (`BUS_B_S`, `CPU_ADAM_B_S`, `PCIE_B_S`, `EXPONENTS`). Every combination is a
hypothesis; each fits `tau` per family to the setting's measured cells (least squares of the relative error,
never faster than the FLOPs at the MFU ceiling) and is kept when it explains every measured cell within the
best hypothesis' error + `error` (search.model_error). A candidate's prediction is then an interval over the
kept hypotheses; its low end (`lower`) is what the search prunes on and orders by: a method is pruned only
when even the most favourable hardware the measurements allow makes it slower than the best measured step,
and the next cell measured is the one with the most favourable prediction: either it wins, or measuring it
rules out the hypotheses that made it look good (fitting one bus speed to cells that all run the same
micro-batch cannot tell communication from compute; a fixed prior there booked communication as compute and
pruned the winner, benchmarks/results/search_robustness.md).

A family none of whose cells in the setting has a time (its probe ran out of memory or was unsupported) is ordered
by the evidence's seconds per sample for the model on this GPU type (`Prior`: planning/evidence_prior.py, the
shipped, imported and own rows the what-if uses, each named in `guesses`), never below the MFU ceiling's, else at
CENTRAL_MFU_SHARE of the ceiling. Only the order: its most favourable price, which prunes, stays the MFU ceiling
(benchmarks/results/search_evidence.md measures what the order is worth and the uses of the evidence not adopted).

Imports numpy, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pretrain_planner.planning.stepmodel import Features, compute_units, offload_bytes, sync_bytes

BUS_B_S = np.geomspace(5e9, 1.6e12, 26)  # all-reduce bus bandwidth: Ethernet / PCIe 3 class .. NVLink 5
CPU_ADAM_B_S = np.geomspace(0.5e9, 64e9, 15)  # model-state bytes a CPU optimizer step gets through per second
PCIE_B_S = np.geomspace(4e9, 128e9, 11)  # host-to-device bandwidth for offloaded parameters
EXPONENTS = np.array([0.25, 0.375, 0.5, 0.625, 0.75])  # below saturation: step time ~ (saturated / micro_batch) ** e
CENTRAL_MFU_SHARE = 0.5  # a family not measured yet, without evidence, runs at half the MFU ceiling (order only)


class Prior(Protocol):
    """What the evidence says a family's compute costs on the setting (planning/evidence_prior.EvidencePrior)."""

    def seconds_per_sample(self, family: str) -> tuple[float | None, str]:
        """(seconds per sample on one GPU, or None; what it rests on, or why there is none)."""
        ...


def _same_kind(a: Features, b: Features) -> bool:
    """Same checkpointing, offload and communication per micro-batch (engines and micro-batches may differ)."""
    return a.ac == b.ac and (a.cpu > 0) == (b.cpu > 0) and a.syncs / a.micro_batch == b.syncs / b.micro_batch


@dataclass
class Hypotheses:
    """The grid of hardware hypotheses of one setting, fitted to its measured cells."""

    batch: int
    saturated: int
    tau_floor: float  # seconds per sample at the MFU ceiling (0 = unknown)
    error: float  # search.model_error
    sync_s: np.ndarray  # per hypothesis: seconds of one gradient all-reduce
    cpu_s: np.ndarray  # seconds of one CPU optimizer step over all model states
    fetch_s: np.ndarray  # seconds of one parameter fetch over PCIe
    e: np.ndarray  # small-batch exponent
    bw: np.ndarray  # (bus, CPU Adam, PCIe) bytes/s per hypothesis, for the reasons
    tau: dict[str, np.ndarray]
    kept: np.ndarray  # mask: hypotheses that explain the measured cells
    misfit: np.ndarray
    measured: list[tuple[Features, float]] = field(default_factory=list)
    prior: Prior | None = None  # the evidence, for the order of a family with no measured cell
    guesses: dict[str, tuple[float, str]] = field(default_factory=dict)  # family -> (seconds per sample, why)

    @classmethod
    def grid(
        cls, params: float, world: int, batch: int, saturated: int, tau_floor: float, error: float, offload: bool
    ) -> Hypotheses:
        """Every combination that matters for the setting (no bus for one GPU, no CPU/PCIe without offload)."""
        bus = BUS_B_S if world > 1 else BUS_B_S[-1:]
        cpu, pcie = (CPU_ADAM_B_S, PCIE_B_S) if offload else (CPU_ADAM_B_S[-1:], PCIE_B_S[-1:])
        b, c, p, e = (a.ravel() for a in np.meshgrid(bus, cpu, pcie, EXPONENTS, indexing="ij"))
        one = Features("", False, 1.0, 1.0, 1.0, 1)  # one sync, one CPU optimizer step, one fetch
        cpu_b, fetch_b = offload_bytes(one, params)
        n = len(b)
        return cls(
            batch, saturated, tau_floor, error, sync_bytes(one, params, world) / b, cpu_b / c, fetch_b / p, e,
            np.stack([b, c, p], axis=1), {}, np.ones(n, bool), np.zeros(n),
        )  # fmt: skip

    def _compute_units(self, f: Features) -> np.ndarray:
        """Samples' worth of compute per hypothesis (the exponent varies)."""
        slow = (self.saturated / f.micro_batch) ** self.e if f.micro_batch < self.saturated else np.ones_like(self.e)
        return compute_units(f, self.batch) * slow

    def _rest(self, f: Features) -> np.ndarray:
        return f.syncs * self.sync_s + f.cpu * self.cpu_s + f.fetches * self.fetch_s

    def fit(self, measured: Sequence[tuple[Features, float]]) -> Hypotheses:
        """Fit tau per family under every hypothesis; keep those that explain the cells (`measured`: step times)."""
        self.measured = list(measured)
        if not measured:
            return self
        rel = []
        for fam in {f.family for f, _t in measured}:
            mine = [(self._compute_units(f) / t, (t - self._rest(f)) / t) for f, t in measured if f.family == fam]
            num = sum(u * y for u, y in mine)
            den = sum(u * u for u, _y in mine)
            tau = np.maximum(self.tau_floor, num / den)
            self.tau[fam] = tau
            rel += [u * tau - y for u, y in mine]  # (predicted - measured) / measured
        self.misfit = np.max(np.abs(np.stack(rel)), axis=0)
        self.kept = self.misfit <= self.misfit.min() + self.error
        return self

    def predict(self, f: Features, unmeasured_tau: float | None = None) -> np.ndarray:
        """Step seconds under every hypothesis (a family never measured: compute at `unmeasured_tau` seconds per
        sample, by default the MFU ceiling's)."""
        tau = self.tau.get(f.family, self.tau_floor if unmeasured_tau is None else unmeasured_tau)
        return self._compute_units(f) * tau + self._rest(f)

    def guess(self, family: str) -> float:
        """Seconds per sample of a family with no measured cell, for the order: the evidence's (`prior`), never
        below the MFU ceiling's, else CENTRAL_MFU_SHARE of the ceiling; kept with what it rests on in `guesses`."""
        if family not in self.guesses:
            value, why = self.prior.seconds_per_sample(family) if self.prior else (None, "no evidence was given")
            if value is None:
                value = self.tau_floor / CENTRAL_MFU_SHARE
                why = f"{CENTRAL_MFU_SHARE:.0%} of the MFU ceiling, a guess ({why})"
            elif value < self.tau_floor:
                value, why = self.tau_floor, f"the MFU ceiling's {self.tau_floor:.4g} s (the evidence says {why})"
            else:
                why = f"the evidence: {why}"
            self.guesses[family] = (value, why)
        return self.guesses[family][0]

    def anchored(self, f: Features, unmeasured_tau: float | None = None) -> tuple[np.ndarray, str | None]:
        """Predictions scaled, per hypothesis, by its error on a measured cell of the same kind (family,
        checkpointing, offload and syncs per micro-batch; the closest micro-batch): the model predicts a change of
        micro-batch or engine better than a step, and the other engine at the same sharding and micro-batch is
        predicted at the measured time under every hypothesis. A method of another kind: the plain prediction."""
        pred = self.predict(f, unmeasured_tau)
        mine = [(a, t) for a, t in self.measured if a.family == f.family and _same_kind(a, f)]
        if not mine:
            return pred, None
        a, t = min(mine, key=lambda at: (abs(np.log2(at[0].micro_batch / f.micro_batch)), at[1]))
        return pred * (t / self.predict(a)), a.slug

    def central(self, f: Features) -> float:
        """The median prediction of the kept hypotheses (what to measure first; a family with no measured cell at
        its `guess`)."""
        guess = None if f.family in self.tau else self.guess(f.family)
        return float(np.median(self.anchored(f, guess)[0][self.kept]))

    def lower(self, f: Features) -> tuple[float, str]:
        """The most favourable step time the kept hypotheses allow, and which hardware gives it."""
        pred, anchor = self.anchored(f)
        pred = np.where(self.kept, pred, np.inf)
        i = int(np.argmin(pred))
        bus, cpu, pcie = self.bw[i] / 1e9
        parts = [f"bus {bus:.3g} GB/s"] if f.syncs else []
        parts += [f"CPU Adam {cpu:.3g} GB/s"] if f.cpu else []
        parts += [f"PCIe {pcie:.3g} GB/s"] if f.fetches else []
        parts += [f"small-batch exponent {self.e[i]:g}"] if f.micro_batch < self.saturated else []
        parts += [f"scaled from {anchor}"] if anchor else []
        return float(pred[i]), ", ".join(parts)

    def describe(self) -> str:
        kept = int(self.kept.sum())
        return (
            f"{kept} of {len(self.kept)} hardware hypotheses explain the {len(self.measured)} measured cells within "
            f"{self.misfit.min() + self.error:.1%}"
            if self.measured
            else f"{len(self.kept)} hardware hypotheses, nothing measured yet"
        )

    @property
    def cells(self) -> int:
        return len(self.measured)
