"""The cross-GPU model: a step measured on one GPU type, transferred to another by the quantities that do transfer.

A run's seconds per unit (a token, or a sample for images) divided into the step model's ideal seconds on its GPU
(planning/stepmodel.py `ideal_seconds`: matmul FLOPs at the GPU's measured matmul rate + kappa_mem x memory-bound
bytes at its datasheet memory bandwidth) is the run's efficiency; the prediction on the target is the target's ideal
seconds over that efficiency, corrected by what the evidence shows of each GPU type beyond its two rates:

    log predicted = log run seconds + log ideal(target work, target GPU) - log ideal(run work, run GPU)
                    + effect(target GPU) - effect(run GPU)

The datasheet peak alone does not transfer (from A100 to H100 it grows 3.2x, the memory bandwidth 1.6x, the measured
matmul rate 2.9x); a step between them moves by a mixture that depends on how much of it is memory-bound. Nor do the
two rates tell everything: the published runs of an H100 are slower than its rates say relative to an A100's, those
of the GDDR cards (RTX 3090 / 4090, A6000, A40) faster, whatever the workload. That is the per-GPU `effect`, one
number per GPU type, fitted with the workloads' own levels as a two-way model of the evidence's log seconds
(log s = level of the run's group + log ideal + effect of its GPU type + noise) and shrunk towards zero by ridge
weight lambda; lambda is the noise variance over the effects' variance, estimated from the evidence (empirical Bayes),
not tuned. A GPU type absent from the evidence has no effect of its own: it is taken to be that of the GPU types
it is transferred from, weighted as they are, so no correction applies to or from it (a guess from its nearest types
by rates alone was tried and did worse: the effects follow the memory technology and the generation more than the
rates, e.g. an RTX 3090 lies nearest a V100 by its rates and behaves like an A6000).

Several runs (other GPU types, other runs of the model) give one prediction each; the central value is their
geometric mean weighted by exp(-distance / tau), the distance between two GPU types being |log matmul-rate ratio| +
|log bandwidth ratio| (a transfer to a near GPU type is trusted more than a far one). kappa_mem and tau are FITTED on
the evidence at hand (every run predicted from the runs of its group on the other GPU types, the pair with the least
mean |log error| over a grid kept).

The band is measured, never assumed, and depends on the KIND of transfer, because the evidence shows their errors
differ several-fold (`Kind`): the same workload to a GPU type the evidence has measured (with other workloads, by
other software: its effect is known) or to one it has not (no effect applies), or a stand-in workload of the same
kind (a nearest-sized model, of the same software or of another). For each kind the fit predicts the evidence out of
sample in the way the kind implies (a GPU type left out; a workload x GPU type x software left out; a workload left
out, and with it each of its GPU types), kappa_mem, tau and the effects refitted without what is left out, so that
the error a prediction quotes is the benchmark's; the band is the 5% and 95% quantiles of those errors, near
transfers (the nearest basis GPU type within NEAR) and far ones apart, each GPU type weighing as one case (its errors
share its offset) and the band widened for how few types it was drawn from, and at prediction time widened by the
weighted spread of the runs' predictions where they disagree.
benchmarks/predict_crossgpu.py judges the whole procedure, band included, on data left out of all of it.

(A third term, elementwise arithmetic at the vector fp32 rate, fitted the evidence better and predicted GPU types
left out of its fit worse (14% against 12% mean error in a check made while building this model), so it is not in
the model; nor is a matmul rate
falling with the GPU's size, whose exponent the H100 alone sets: it changes sign when the H100 is left out. The
micro-batch, which the public sources pick per GPU type, moves a prediction's error by under 1% per doubling where the
GPU type's effect is known (benchmarks/results/predict_crossgpu.md); it is not modelled.) Imports
numpy, no torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pretrain_planner.planning import diskcache, stepmodel
from pretrain_planner.planning.evidence import Run, Work, origins_of, origins_text, same_software

KAPPA_MEM = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
TAUS = (0.15, 0.3, 0.6, 1.2, math.inf)
BAND_QUANTILES = (0.05, 0.95)
DEFAULT_BAND = (-0.2, 0.2)  # log error band when there is nothing to calibrate it on (fewer than MIN_CALIBRATION)
MIN_CALIBRATION = 10  # errors of a kind (and distance class) below which its band is not trusted: the next coarser
MIN_TYPES = 5  # ... and GPU types they fall on (one type's errors share its offset)
NEAR = 0.3  # nearest basis GPU type within this distance (matmul-rate and bandwidth ratios ~1.35x together): "near"
LAMBDA_RANGE = (0.1, 20.0)  # the empirical-Bayes ridge weight is kept within this range
STAND_IN_RATIO = 8.0  # a stand-in model at most this many times larger or smaller (matrix sizes change efficiency)


@dataclass(frozen=True)
class Params:
    kappa_mem: float = stepmodel.KAPPA
    tau: float = math.inf
    lam: float = math.inf  # ridge weight of the per-GPU effects; inf: no effects

    def describe(self) -> str:
        tau = "equal weights" if self.tau == math.inf else f"tau {self.tau:g}"
        lam = "" if self.lam == math.inf else f", per-GPU effects (lambda {self.lam:.2g})"
        return f"kappa_mem {self.kappa_mem:g}, {tau}{lam}"


@dataclass(frozen=True)
class Kind:
    """What a prediction transfers: the same workload or a stand-in (of the same software or another), to a GPU type
    the evidence has measured (`seen`) or not."""

    workload: str  # "same" | "stand-in" | "stand-in, other software"
    seen: bool

    @property
    def label(self) -> str:
        what = {"same": "the same workload", "stand-in": "a stand-in workload of the same software",
                "stand-in, other software": "a stand-in workload of other software"}[self.workload]  # fmt: skip
        gpu = "a GPU type measured in the evidence" if self.seen else "a GPU type absent from the evidence"
        return f"{what} to {gpu}"

    @property
    def short(self) -> str:
        what = {"same": "same model", "stand-in": "stand-in (same software)",
                "stand-in, other software": "stand-in (other software)"}[self.workload]  # fmt: skip
        return f"{what}, {'measured' if self.seen else 'unmeasured'} GPU type"

    @property
    def protocol(self) -> str:
        """How its errors are measured out of sample."""
        if self.workload == "same":
            return ("each workload x GPU type x software left out (the GPU type's effect from the other software's "
                    "runs)" if self.seen else "each GPU type left out")  # fmt: skip
        tail = "" if self.seen else " and its GPU type left out"
        return "each workload left out, predicted from its stand-in" + tail


KINDS = tuple(Kind(w, s) for w in ("same", "stand-in", "stand-in, other software") for s in (True, False))


@dataclass
class KindError:
    """A kind's out-of-sample errors: mean and max |central / truth - 1| and the band (log truth / central)."""

    kind: Kind
    n: int = 0
    mean_abs: float | None = None
    max_abs: float | None = None
    bias: float | None = None  # mean central / truth - 1 (negative: predicted too fast)
    bands: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # "near" | "far" | "all" -> (lo, hi, n)
    pooled_from: str = ""  # where its band comes from when it has too few errors of its own

    def band(self, near: bool) -> tuple[float, float]:
        got = self.bands.get("near" if near else "far") or self.bands.get("all")
        return (got[0], got[1]) if got else DEFAULT_BAND

    def describe(self, near: bool | None = None) -> str:
        if not self.n:
            return f"{self.kind.label}: not measured (too few cases in the evidence); band {_pct(DEFAULT_BAND)} assumed"
        lo_hi = self.band(bool(near)) if near is not None else self.band(True)
        cls = "" if near is None else (" (near transfer)" if near else " (far transfer)")
        band = _pct(lo_hi) + cls
        if near is None and "far" in self.bands:
            band = f"near {_pct(self.band(True))}, far {_pct(self.band(False))}"
        return (f"{self.kind.label}: {self.kind.protocol}, {self.n} public runs: mean |error| {self.mean_abs:.1%}, "
                f"max {self.max_abs:.0%}, bias {self.bias:+.0%}; band {band} (5%-95% of those errors"
                f"{', ' + self.pooled_from if self.pooled_from else ''})")  # fmt: skip


def _pct(band: tuple[float, float]) -> str:
    lo, hi = (math.exp(b) - 1 for b in band)
    return f"{lo:+.0%} / {hi:+.0%}"


@dataclass
class Calibration:
    """How the fitted model did on the evidence it was fitted to, out of sample, per kind of transfer."""

    kinds: dict[Kind, KindError] = field(default_factory=dict)
    gpus: list[str] = field(default_factory=list)
    origins: dict[str, int] = field(default_factory=dict)  # the runs it was fitted and checked on, per origin

    @property
    def on(self) -> str:
        """ "on 273 shipped + 3 imported rows": what the errors were measured on."""
        return f"on {origins_text(self.origins)}" if self.origins else ""

    def of(self, kind: Kind) -> KindError:
        return self.kinds.get(kind) or KindError(kind)

    def to_json(self) -> dict[str, Any]:
        """Every field, as JSON (diskcache keeps a calibration between processes: `fit`)."""
        kinds = [{"workload": k.workload, "seen": k.seen, "n": e.n, "mean_abs": e.mean_abs, "max_abs": e.max_abs,
                  "bias": e.bias, "bands": {name: list(b) for name, b in e.bands.items()},
                  "pooled_from": e.pooled_from} for k, e in self.kinds.items()]  # fmt: skip
        return {"kinds": kinds, "gpus": list(self.gpus), "origins": dict(self.origins)}

    @classmethod
    def of_json(cls, data: Mapping[str, Any]) -> Calibration:
        """`to_json`'s calibration back."""
        kinds = {}
        for e in data["kinds"]:
            kind = Kind(e["workload"], e["seen"])
            bands = {name: (float(lo), float(hi), int(n)) for name, (lo, hi, n) in e["bands"].items()}
            kinds[kind] = KindError(kind, e["n"], e["mean_abs"], e["max_abs"], e["bias"], bands, e["pooled_from"])
        return cls(kinds, list(data["gpus"]), dict(data["origins"]))

    @property
    def headline(self) -> KindError:
        """The strictest same-workload kind (a GPU type left out), the figure quoted against the targets."""
        return self.of(Kind("same", False))

    # the fields the first version had, for the unseen-GPU kind
    @property
    def n(self) -> int:
        return self.headline.n

    @property
    def mean_abs(self) -> float | None:
        return self.headline.mean_abs

    @property
    def max_abs(self) -> float | None:
        return self.headline.max_abs

    @property
    def band(self) -> tuple[float, float]:
        return self.headline.band(False)

    def lines(self) -> list[str]:
        """One line per kind measured."""
        return [self.of(k).describe() for k in KINDS if self.of(k).n]

    def describe(self) -> str:
        if not any(k.n for k in self.kinds.values()):
            return "no GPU type pair in the evidence: the band is a default +-20%, not measured"
        return "; ".join(self.lines()) + (f" (out of sample {self.on})" if self.origins else "")


@dataclass
class Estimate:
    """Seconds per unit per GPU on the target: the central value, the band and what it rests on."""

    central: float
    low: float
    high: float
    basis: list[tuple[Run, float, float]]  # (run, its transferred seconds, weight)
    band_note: str = ""  # the measured error of its kind of transfer
    kind: Kind = Kind("same", False)
    nearest: float = 0.0  # distance to the nearest basis GPU type

    @property
    def sources(self) -> list[str]:
        return sorted({r.source for r, _p, _w in self.basis})

    def rows(self, limit: int = 6) -> str:
        """The evidence rows it rests on, heaviest first ("r0123 (lambda-dlbench: BERT-base on 1 x a100), ...")."""
        ranked = sorted(self.basis, key=lambda b: -b[2])
        text = ", ".join(r.label for r, _p, _w in ranked[:limit])
        return text + (f" and {len(ranked) - limit} more" if len(ranked) > limit else "")


class CrossGpu:
    """The transfer with fitted parameters over a catalog's GPU types (`gpus`: name -> GpuSpec); `effects`: the
    per-GPU effects (log) of the GPU types the evidence measured."""

    def __init__(self, gpus: Mapping[str, Any], params: Params = Params(), calibration: Calibration | None = None,
                 effects: Mapping[str, float] | None = None):  # fmt: skip
        self.gpus, self.params = gpus, params
        self.calibration = calibration or Calibration()
        self.effects: dict[str, float] = dict(effects or {})
        self.share = stepmodel.matmul_share(gpus.values())
        self._rates: dict[tuple[str, str, bool], stepmodel.Rates | None] = {}

    def rates(self, gpu: str, precision: str, tf32: bool = True) -> stepmodel.Rates | None:
        key = (gpu, precision, tf32)
        if key not in self._rates:
            spec = self.gpus.get(gpu)
            self._rates[key] = stepmodel.rates(spec, precision, self.share, tf32) if spec is not None else None
        return self._rates[key]

    def parts(self, flops: float, memory_bytes: float, gpu: str, precision: str, tf32: bool = True):
        """(matmul, memory-bound) seconds per unit at the GPU's rates, or None."""
        r = self.rates(gpu, precision, tf32)
        if r is None:
            return None
        return stepmodel.ideal_seconds(flops, 0.0, r), stepmodel.ideal_seconds(0.0, memory_bytes, r)

    def ideal(self, flops: float, memory_bytes: float, gpu: str, precision: str, tf32: bool = True) -> float | None:
        r = self.rates(gpu, precision, tf32)
        return stepmodel.ideal_seconds(flops, memory_bytes, r, self.params.kappa_mem) if r else None

    def distance(self, a: str, b: str, precision: str = "fp16") -> float:
        """How far a transfer from GPU type `a` to `b` reaches: |log matmul-rate ratio| + |log bandwidth ratio|."""
        ra, rb = self.rates(a, precision), self.rates(b, precision)
        if ra is None or rb is None:
            return math.inf
        return abs(math.log(ra.matmul_tflops / rb.matmul_tflops)) + abs(math.log(ra.memory_gb_s / rb.memory_gb_s))

    def weight(self, a: str, b: str, nearest: float = 0.0, precision: str = "fp16") -> float:
        """exp(-(distance - the nearest basis' distance) / tau): 1 for the nearest basis GPU type."""
        if self.params.tau == math.inf:
            return 1.0
        return math.exp(-(self.distance(a, b, precision) - nearest) / self.params.tau)

    def correction(self, source: str, target: str) -> float:
        """effect(target) - effect(source) (log) between two GPU types the evidence measured; 0 when either is absent
        (an absent type's effect is taken to be its basis' own, weighted as the basis is: they cancel)."""
        if source in self.effects and target in self.effects:
            return self.effects[target] - self.effects[source]
        return 0.0

    def transfer(self, run: Run, work: Work, gpu: str) -> float | None:
        """The run's seconds per unit moved to `work` on `gpu`."""
        src = self.ideal(run.flops, run.memory_bytes, run.gpu, run.precision, run.tf32)
        dst = self.ideal(work.flops, work.memory_bytes, gpu, work.precision, work.tf32)
        if not src or not dst:
            return None
        return run.seconds * dst / src * math.exp(self.correction(run.gpu, gpu))

    def kind_of(self, basis: Sequence[Run], work: Work, gpu: str) -> Kind:
        """The kind of transfer from `basis` to `work` on `gpu`."""
        if all(r.model == work.model for r in basis):
            what = "same"
        elif all(same_software(r.software, work.software) for r in basis):
            what = "stand-in"
        else:
            what = "stand-in, other software"
        return Kind(what, gpu in self.effects)

    def estimate(self, basis: Iterable[Run], work: Work, gpu: str) -> Estimate | None:
        """The prediction for `work` on `gpu` from the `basis` runs (the caller chooses them)."""
        moved = [(run, t) for run in basis if (t := self.transfer(run, work, gpu))]
        if not moved:
            return None
        nearest = min(self.distance(run.gpu, gpu, work.precision) for run, _t in moved)
        got = [(run, t, self.weight(run.gpu, gpu, nearest, work.precision)) for run, t in moved]
        total = sum(w for _r, _t, w in got)
        if total <= 0:
            return None
        mean = sum(w * math.log(t) for _r, t, w in got) / total
        spread = math.sqrt(max(0.0, sum(w * (math.log(t) - mean) ** 2 for _r, t, w in got) / total))
        kind = self.kind_of([r for r, _t, _w in got], work, gpu)
        err = self.calibration.of(kind)
        lo, hi = err.band(nearest < NEAR)
        central = math.exp(mean)
        on = self.calibration.on
        note = err.describe(nearest < NEAR) + (f"; the evidence: {on}" if on else "")
        return Estimate(central, central * math.exp(lo - spread), central * math.exp(hi + spread), got, note, kind,
                        nearest)  # fmt: skip


# ------------------------------------------------------------------------------------------------------- fitting


class _Table:
    """The runs as arrays, for fitting and out-of-sample checks in a few milliseconds each."""

    def __init__(self, model: CrossGpu, runs: Sequence[Run]):
        self.runs = list(runs)
        parts = np.array([model.parts(r.flops, r.memory_bytes, r.gpu, r.precision, r.tf32) for r in runs], float)
        self.mm, self.mem = parts[:, 0], parts[:, 1]
        self.y = np.log([r.seconds for r in runs])
        self.gpus = sorted({r.gpu for r in runs})
        self.pg = np.array([self.gpus.index(r.gpu) for r in runs])
        self.groups = sorted({r.group for r in runs})
        self.gg = np.array([self.groups.index(r.group) for r in runs])
        self.model = np.array([r.model for r in runs])
        self.gpu = np.array([r.gpu for r in runs])
        self.software = np.array([r.software for r in runs])
        rates = [model.rates(r.gpu, r.precision, r.tf32) for r in runs]
        self.feat = np.array([[math.log(x.matmul_tflops), math.log(x.memory_gb_s)] for x in rates])  # type: ignore
        by_group: dict[int, list[int]] = defaultdict(list)
        for i, g in enumerate(self.gg):
            by_group[int(g)].append(i)
        self.pairs = np.array([(i, j) for idx in by_group.values() for i in idx for j in idx
                               if runs[i].gpu != runs[j].gpu], int).reshape(-1, 2)  # fmt: skip
        self.dist = np.abs(self.feat[self.pairs[:, 0]] - self.feat[self.pairs[:, 1]]).sum(1)
        self._masks: dict[bytes, _Masked] = {}  # what a mask of the runs fixes, for the effects' fit
        self._moments: dict[bytes, tuple[Any, ...]] = {}  # ... and for empirical_lambda's moments

    def li(self, kappa: float) -> np.ndarray:
        return np.log(self.mm + kappa * self.mem)

    def effects(self, li: np.ndarray, mask: np.ndarray, lam: float) -> np.ndarray:
        """Per-GPU effects (log) from the masked runs: a two-way ridge fit (group levels free, effects shrunk by
        `lam`); NaN for a GPU type without a masked run in a group shared with another type (a group measured on one
        type alone says nothing of its effect), 0 for the others with lam = inf."""
        m = self._masked(mask)
        b = np.full(len(self.gpus), np.nan)
        if lam == math.inf or m.base is None:
            b[m.present] = 0.0
            return b
        # the group levels eliminated: (Z'MZ + lam I) b = Z'Mr, M removing each group's mean (Z: GPU indicators)
        r = (self.y - li)[m.mask]
        lhs = m.base + lam * np.eye(len(m.present))
        rhs = np.bincount(m.pi, r, len(m.present)) - m.c.T @ (np.bincount(m.gg, r, len(self.groups))[m.keep] / m.n_g)
        b[m.present] = np.linalg.solve(lhs, rhs)
        return b

    def _masked(self, mask: np.ndarray) -> _Masked:
        """What the effects' fit takes of a mask of the runs, made once per mask: a fit solves it for every kappa_mem
        and lambda, and the out-of-sample checks refit the same masks."""
        key = mask.tobytes()
        got = self._masks.get(key)
        if got is None:
            got = self._masks[key] = _Masked.of(self, mask)
        return got

    def empirical_lambda(self, li: np.ndarray, mask: np.ndarray) -> float:
        """Noise variance / effects' variance of the two-way model on the masked runs (method of moments), within
        LAMBDA_RANGE; inf (no effects) with fewer than 3 GPU types or no variance between them."""
        b = self.effects(li, mask, 1e-6)
        mask = mask & np.isfinite(b[self.pg])  # the runs in groups shared between GPU types
        key = mask.tobytes()
        if key not in self._moments:  # what the mask fixes: the groups and GPU types, their sizes, the freedom left
            gg, pg = self.gg[mask], self.pg[mask]
            gpus = np.unique(pg)
            self._moments[key] = (gg, pg, np.maximum(np.bincount(gg, minlength=len(self.groups)), 1),
                                  len(gg) - len(np.unique(gg)) - len(gpus) + 1, gpus,
                                  np.bincount(pg, minlength=len(self.gpus))[gpus])  # fmt: skip
        gg, pg, sizes, dof, gpus, counts = self._moments[key]
        y, li = self.y[mask], li[mask]
        level = np.bincount(gg, y - li - b[pg], len(self.groups)) / sizes
        res = y - li - level[gg] - b[pg]
        if dof <= 0 or len(gpus) < 3:
            return math.inf
        noise = float(np.sum(res**2) / dof)
        centred = b[gpus] - np.average(b[gpus], weights=counts)
        between = float(np.var(centred) - np.mean(noise / counts))
        if between <= 0:
            return math.inf
        return float(np.clip(noise / between, *LAMBDA_RANGE))

    def transfer_errors(self, li: np.ndarray, b: np.ndarray, tau: float, p: _Pairs, spread: bool = True):
        """log(truth / central) of each target of the (target, basis) pairs `p` with its nearest distance and spread
        (None with spread=False); `b`: the effects, NaN where a GPU type is absent (no correction to or from it:
        CrossGpu.correction)."""
        ti, bj = p.ti, p.bj
        corr = b[self.pg[ti]] - b[self.pg[bj]]
        pred = self.y[bj] - li[bj] + li[ti] + np.where(np.isfinite(corr), corr, 0.0)
        w, den = p.weights(tau)
        n = len(p.targets)
        mean = np.bincount(p.idx, w * pred, n) / den
        sd = np.sqrt(np.maximum(np.bincount(p.idx, w * pred**2, n) / den - mean**2, 0.0)) if spread else None
        return p.targets, self.y[p.targets] - mean, p.nearest, sd


@dataclass
class _Masked:
    """The parts of the effects' two-way fit that a mask of the runs fixes (`_Table._masked`): the runs in groups
    measured on two GPU types or more, the GPU types present there, the group sizes and the matrix without lambda."""

    mask: np.ndarray
    present: np.ndarray
    base: np.ndarray | None = None  # Z'MZ; None: no run to fit on
    gg: np.ndarray | None = None
    pi: np.ndarray | None = None
    c: np.ndarray | None = None
    n_g: np.ndarray | None = None
    keep: np.ndarray | None = None

    @classmethod
    def of(cls, t: _Table, mask: np.ndarray) -> _Masked:
        types = np.zeros((len(t.groups), len(t.gpus)), bool)
        types[t.gg[mask], t.pg[mask]] = True
        shared = types.sum(1) >= 2
        mask = mask & shared[t.gg]
        present = np.unique(t.pg[mask])
        if not mask.any():
            return cls(mask, present)
        gg, pi = t.gg[mask], np.searchsorted(present, t.pg[mask])
        ng, npr = len(t.groups), len(present)
        size = np.bincount(gg, minlength=ng).astype(float)
        counts = np.zeros((ng, npr))
        np.add.at(counts, (gg, pi), 1.0)
        keep = size > 0
        c, n_g = counts[keep], size[keep]
        return cls(mask, present, np.diag(counts.sum(0)) - c.T @ (c / n_g[:, None]), gg, pi, c, n_g, keep)


class _Pairs:
    """(target, basis) pairs of runs with what does not change between the fit's trials: each target's index and
    nearest basis distance, and the weights of each tau (`transfer_errors` is asked for every kappa_mem x tau)."""

    def __init__(self, pairs: np.ndarray, dist: np.ndarray):
        self.ti, self.bj, self.dist = pairs[:, 0], pairs[:, 1], dist
        self.targets, self.idx = np.unique(self.ti, return_inverse=True)
        self.nearest = np.full(len(self.targets), np.inf)
        np.minimum.at(self.nearest, self.idx, dist)
        self._weights: dict[float, tuple[np.ndarray, np.ndarray]] = {}

    def weights(self, tau: float) -> tuple[np.ndarray, np.ndarray]:
        """exp(-(distance - the target's nearest) / tau) per pair (1 with tau = inf) and their sum per target."""
        got = self._weights.get(tau)
        if got is None:
            d = self.dist
            w = np.ones_like(d) if tau == math.inf else np.exp(-(d - self.nearest[self.idx]) / tau)
            got = self._weights[tau] = (w, np.bincount(self.idx, w, len(self.targets)))
        return got


def _choose(t: _Table, mask: np.ndarray | None = None) -> Params | None:
    """kappa_mem and tau with the least mean |log error| of each (masked) run predicted from its group's other GPU
    types (the effects fitted on the same runs, lambda by empirical Bayes at each kappa)."""
    mask = np.ones(len(t.y), bool) if mask is None else mask
    sel = mask[t.pairs[:, 0]] & mask[t.pairs[:, 1]]
    if not sel.any() or len(np.unique(t.pg[mask])) < MIN_FIT_GPUS:
        return None
    pairs = _Pairs(t.pairs[sel], t.dist[sel])
    best = None
    for km in KAPPA_MEM:
        li = t.li(km)
        lam = t.empirical_lambda(li, mask)
        b = t.effects(li, mask, lam)
        for tau in TAUS:
            _t, u, _n, _s = t.transfer_errors(li, b, tau, pairs, spread=False)
            key = (float(np.mean(np.abs(u))), tau == math.inf, km)
            if best is None or key < best[0]:
                best = (key, Params(km, tau, lam))
    return best[1] if best else None


def stand_in(name: str, params: float, kind: str, formula: str, software: str,
             candidates: Mapping[Any, tuple[str, float, str, str, str]]) -> Any | None:  # fmt: skip
    """The workload that stands in for model `name` (candidates: key -> (model, parameters, kind, formula, software),
    other models only): the nearest in size, at most STAND_IN_RATIO larger or smaller, of the same kind and formula,
    the same software first; its key."""
    pool = [(not same_software(sw, software), abs(math.log(max(p, 1.0) / max(params, 1.0))), str(key), key)
            for key, (m, p, k, f, sw) in candidates.items()
            if m != name and k == kind and f == formula
            and abs(math.log(max(p, 1.0) / max(params, 1.0))) <= math.log(STAND_IN_RATIO)]  # fmt: skip
    return min(pool)[3] if pool else None


def stand_in_candidates(runs: Sequence[Run]) -> dict[tuple[str, str], tuple[str, float, str, str, str]]:
    """Each workload x software of the runs as a stand-in candidate (`stand_in`'s `candidates`)."""
    out: dict[tuple[str, str], tuple[str, float, str, str, str]] = {}
    for r in runs:
        out.setdefault((r.model, r.software), (r.model, r.params, r.kind, r.formula, r.software))
    return out


def _calibrate(t: _Table) -> Calibration:
    """Out-of-sample errors of every kind on the table, kappa_mem, tau, lambda and the effects refitted without what
    is left out, as `fit` of what is left would (benchmarks/crossgpu_loo.py's leave_one_* do exactly that), so
    that the error a prediction quotes is the one measured held out (the parameters fitted on everything would have
    seen what each case leaves out); and the band of each kind."""
    errors: dict[Kind, list[_Error]] = defaultdict(list)
    fitted: dict[bytes, tuple[Params, np.ndarray, np.ndarray]] = {}

    def refit(keep: np.ndarray) -> tuple[Params, np.ndarray, np.ndarray]:
        """The parameters chosen on the runs `keep` selects, their memory-bound shares and the effects fitted on those
        runs; with no pair left to choose on, fit's defaults and no effects (a workload's stand-in cases of several
        software share one mask: chosen once)."""
        key = keep.tobytes()
        if key not in fitted:
            q = _choose(t, keep)
            if q is None:
                fitted[key] = (Params(), t.li(Params().kappa_mem), np.full(len(t.gpus), np.nan))
            else:
                lq = t.li(q.kappa_mem)
                fitted[key] = (q, lq, t.effects(lq, keep, q.lam))
        return fitted[key]

    def add(kind: Kind, got) -> None:
        targets, u, nearest, spread = got
        errors[kind] += [_Error(*x) for x in zip(u, spread, nearest, t.pg[targets], strict=True)]

    runs = np.arange(len(t.y))
    # the same workload, its GPU type left out: kappa_mem and tau refitted without it too (they weigh most on far
    # transfers, and a type's own runs would tune them to it)
    for g, _gpu in enumerate(t.gpus):
        keep = t.pg != g
        sel = (t.pg[t.pairs[:, 0]] == g) & keep[t.pairs[:, 1]]
        if not sel.any():
            continue
        q, lq, b = refit(keep)  # b is NaN for g: no correction to it
        add(Kind("same", False), t.transfer_errors(lq, b, q.tau, _Pairs(t.pairs[sel], t.dist[sel])))
    # the same workload x GPU type x software left out, the GPU type's effect from other software's runs
    for m, gpu, sw in sorted(set(zip(t.model, t.gpu, t.software, strict=True))):
        cell = (t.model == m) & (t.gpu == gpu) & (t.software == sw)
        keep = ~cell & ~((t.gpu == gpu) & (t.software == sw)) & ~((t.model == m) & (t.gpu == gpu))
        if not (keep & (t.gpu == gpu)).any():
            continue  # nothing else measured that GPU type: the unseen kind above covers it
        sel = cell[t.pairs[:, 0]] & keep[t.pairs[:, 1]]
        if sel.any():
            q, lq, b = refit(keep)
            add(Kind("same", True), t.transfer_errors(lq, b, q.tau, _Pairs(t.pairs[sel], t.dist[sel])))
    # a stand-in workload (nearest-sized of the same kind, the same software first), the workload left out; its
    # stand-in's runs on every GPU type (the target's own weigh most), or (unseen) the target's GPU type left out too
    cands = stand_in_candidates(t.runs)
    for m, sw in sorted(cands):
        sub = stand_in(*cands[(m, sw)], cands)
        if sub is None:
            continue
        what = "stand-in" if same_software(sub[1], sw) else "stand-in, other software"
        targets = runs[(t.model == m) & (t.software == sw)]
        bases = runs[(t.model == sub[0]) & (t.software == sub[1])]
        cases = [(t.model != m, targets)]
        cases += [((t.model != m) & (t.pg != g), targets[t.pg[targets] == g]) for g in sorted(set(t.pg[targets]))]
        for keep, tg in cases:
            bs = bases[keep[bases]]
            if not len(bs):
                continue
            q, lq, b = refit(keep)
            seen = np.isfinite(b[t.pg[tg]])
            pairs = np.array([(i, j) for i in tg for j in bs], int)
            dist = np.abs(t.feat[pairs[:, 0]] - t.feat[pairs[:, 1]]).sum(1)
            got = t.transfer_errors(lq, b, q.tau, _Pairs(pairs, dist))
            for flag in (True, False):
                rows = np.isin(got[0], tg[seen == flag])
                if rows.any():
                    add(Kind(what, flag), tuple(x[rows] for x in got))
    return _bands(errors, t.gpus)


@dataclass(frozen=True)
class _Error:
    u: float  # log(truth / central)
    spread: float  # the weighted spread of the basis' predictions
    nearest: float  # distance to the nearest basis GPU type
    gpu: int  # the target's GPU type (errors of one type share its offset: the unit of the band's sample)


def _quantile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    """The weighted q-quantile (the smallest x whose cumulative weight reaches q)."""
    order = np.argsort(x)
    cum = np.cumsum(w[order]) / w.sum()
    return float(x[order][min(np.searchsorted(cum, q), len(x) - 1)])


def _small_sample(k: int, q: float = BAND_QUANTILES[1]) -> float:
    """How much wider a band drawn from k GPU types must be to cover a new type as often as promised: a normal
    prediction interval for a new member of k, t(k - 1) x sqrt(1 + 1 / k), over the normal quantile (Cornish-Fisher
    for the t quantile, within 1% from 4 degrees of freedom)."""
    z = {0.9: 1.2816, 0.95: 1.6449, 0.975: 1.96}.get(q, 1.6449)
    nu = max(k - 1, 1)
    t = z + (z**3 + z) / (4 * nu) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * nu**2)
    return t * math.sqrt(1 + 1 / max(k, 1)) / z


def _bands(errors: Mapping[Kind, list[_Error]], gpus: list[str]) -> Calibration:
    """Per kind: mean / max |error| and the 5%-95% band of log(truth / central) minus the spread a prediction adds to
    each end (so that the band with the spread covers 90% of these cases), never excluding the central value. The
    errors of one target GPU type share its offset, so each type weighs as one case in the quantiles, the band is
    widened for the number of types it was drawn from (_small_sample), and a class (near / far) has a band of its own
    only with MIN_CALIBRATION errors on MIN_TYPES GPU types; else the kind's whole, else the kind's workload with
    either GPU case, else every error."""
    every = [e for v in errors.values() for e in v]

    def band(es: list[_Error]) -> tuple[float, float, int] | None:
        if len(es) < MIN_CALIBRATION or len({e.gpu for e in es}) < MIN_TYPES:
            return None
        u, s = np.array([e.u for e in es]), np.array([e.spread for e in es])
        per_type = defaultdict(int)
        for e in es:
            per_type[e.gpu] += 1
        w = np.array([1.0 / per_type[e.gpu] for e in es])
        lo, hi = _quantile(u + s, w, BAND_QUANTILES[0]), _quantile(u - s, w, BAND_QUANTILES[1])
        c = _small_sample(len(per_type))
        return min(lo, 0.0) * c, max(hi, 0.0) * c, len(es)

    out = {}
    for kind in KINDS:
        es = errors.get(kind, [])
        err = KindError(kind)
        if es:
            rel = np.exp(-np.array([e.u for e in es])) - 1  # central / truth - 1
            err.n, err.mean_abs, err.max_abs, err.bias = len(es), float(np.abs(rel).mean()), \
                float(np.abs(rel).max()), float(rel.mean())  # fmt: skip
        for name, sel in (("near", lambda e: e.nearest < NEAR), ("far", lambda e: e.nearest >= NEAR),
                          ("all", lambda e: True)):  # fmt: skip
            got = band([e for e in es if sel(e)])
            if got:
                err.bands[name] = got
        if not err.bands:
            sibling = [e for k, v in errors.items() if k.workload == kind.workload for e in v]
            got = band(sibling) or band(every)
            if got:
                lo, hi, n = got
                if es:  # never narrower than the kind's own (too few) errors
                    lo = min(lo, min(e.u + e.spread for e in es))
                    hi = max(hi, max(e.u - e.spread for e in es))
                err.bands["all"] = (lo, hi, n)
                err.pooled_from = (
                    "pooled with its workload kind's other GPU case" if band(sibling) else "pooled over every kind"
                ) + (", widened to its own errors" if es else "")
        out[kind] = err
    return Calibration(out, gpus)


# Fewer GPU types than this leave the fit nothing to tell a type's own offset from the weighting of near types (two
# types are one ratio per group: two effects, a weighting and a memory share from it), so nothing is fitted: every
# measured type counts alike and a disagreement between them widens the band (a sweep's own cells on two types).
MIN_FIT_GPUS = 3


_FITS: dict[tuple[Any, ...], CrossGpu] = {}  # the last fits of this process, by their runs and GPU types
_FITS_KEPT = 8


def fit(runs: Sequence[Run], gpus: Mapping[str, Any], calibration: Calibration | None = None) -> CrossGpu:
    """The parameters and per-GPU effects that predict the runs best from their groups' other GPU types, and the
    bands from errors made out of sample (the in-sample errors of the fit are smaller than those of new cases);
    `calibration` given, its bands instead (a replay's many refits: the out-of-sample checks are most of a fit's
    time). A fit of the same runs on the same GPU types is made once per process (every Predictor, the what-if
    rule and the CLI ask it; a CrossGpu is not changed once fitted), and its calibration once per evidence and code
    (planning/diskcache.py: the out-of-sample checks are the seconds of a CLI answer; the same runs, GPU types and
    planning code give the same calibration)."""
    key = (tuple(runs), tuple(sorted((name, repr(spec)) for name, spec in gpus.items())))
    if calibration is None and key in _FITS:
        return _FITS[key]
    kept, stated = None, repr(key)  # the cache's key text: a repr of every run, made once
    if calibration is None:
        got = diskcache.get("crossgpu-calibration", stated)
        kept = Calibration.of_json(got) if got is not None else None
    model = _fit(runs, gpus, calibration or kept)
    if calibration is None:
        if kept is None and model.calibration.kinds:
            diskcache.put("crossgpu-calibration", stated, model.calibration.to_json())
        _FITS[key] = model
        while len(_FITS) > _FITS_KEPT:
            _FITS.pop(next(iter(_FITS)))
    return model


def _fit(runs: Sequence[Run], gpus: Mapping[str, Any], calibration: Calibration | None) -> CrossGpu:
    model = CrossGpu(gpus)
    usable = [r for r in runs if model.parts(r.flops, r.memory_bytes, r.gpu, r.precision, r.tf32)]
    if not usable:
        return model
    t = _Table(model, usable)
    params = _choose(t)
    if params is None:
        return model
    b = t.effects(t.li(params.kappa_mem), np.ones(len(t.y), bool), params.lam)
    effects = {g: float(x) for g, x in zip(t.gpus, b, strict=True) if np.isfinite(x)}
    if calibration is None:
        calibration = _calibrate(t)
        calibration.origins = origins_of(usable)
    return CrossGpu(gpus, params, calibration, effects)
