"""The cross-GPU model: a step measured on one GPU type, transferred to another by the quantities that do transfer.

A run's seconds per unit (a token, or a sample for images) divided into the step model's ideal seconds on its GPU
(planning/stepmodel.py `ideal_seconds`: matmul FLOPs at the GPU's achievable matmul rate + kappa_mem x memory-bound
bytes at its memory bandwidth) is the run's efficiency; the prediction on the target is the target's ideal seconds
over that efficiency:

    predicted = run seconds x ideal(target work, target GPU) / ideal(run work, run GPU)

The datasheet peak alone does not transfer (from A100 to H100 it grows 3.2x, the memory bandwidth 1.6x, the measured
matmul rate 2.9x); a step between them moves by a mixture that depends on how much of it is memory-bound.
Several runs (other GPU types, other runs of the model) give one prediction each; the central value is their
geometric mean weighted by exp(-distance / tau), the distance between the two GPU types being
|log matmul-rate ratio| + |log bandwidth ratio| (a transfer to a near GPU type is trusted more than a far one).

kappa_mem and tau are FITTED, never assumed: on the evidence at hand, every run is predicted from the runs of its
group (one workload and setting) on the other GPU types, and the pair with the least mean |log error| over a grid
is kept. The band is the 5% and 95% quantiles of the errors (log truth / central) made out of sample: each GPU
type's runs predicted with the parameters fitted without it; widened by the weighted spread of the runs'
predictions where they disagree. Its coverage is measured, not promised
(benchmarks/predict_crossgpu.py judges the whole procedure on GPU types left out of it, band included).
(A third term, elementwise arithmetic at the vector fp32 rate, was tried: it fitted the evidence better and predicted
GPU types left out worse, so it is not in the model.) Imports numpy, no torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pretrain_planner.planning import stepmodel
from pretrain_planner.planning.evidence import Run, Work

KAPPA_MEM = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
TAUS = (0.15, 0.3, 0.6, 1.2, math.inf)
BAND_QUANTILES = (0.05, 0.95)
DEFAULT_BAND = (-0.2, 0.2)  # log error band when there is nothing to calibrate it on (fewer than MIN_CALIBRATION)
MIN_CALIBRATION = 10  # runs predicted in the fit below which its band is not trusted: DEFAULT_BAND (and said so)


@dataclass(frozen=True)
class Params:
    kappa_mem: float = stepmodel.KAPPA
    tau: float = math.inf

    def describe(self) -> str:
        tau = "equal weights" if self.tau == math.inf else f"tau {self.tau:g}"
        return f"kappa_mem {self.kappa_mem:g}, {tau}"


@dataclass
class Estimate:
    """Seconds per unit per GPU on the target: the central value, the band and what it rests on."""

    central: float
    low: float
    high: float
    basis: list[tuple[Run, float, float]]  # (run, its transferred seconds, weight)
    band_note: str = ""

    @property
    def sources(self) -> list[str]:
        return sorted({r.source for r, _p, _w in self.basis})

    def rows(self, limit: int = 6) -> str:
        """The evidence rows it rests on, heaviest first ("r0123 (lambda-dlbench: BERT-base on 1 x a100), ...")."""
        ranked = sorted(self.basis, key=lambda b: -b[2])
        text = ", ".join(r.label for r, _p, _w in ranked[:limit])
        return text + (f" and {len(ranked) - limit} more" if len(ranked) > limit else "")


@dataclass
class Calibration:
    """How the fitted model did on the evidence it was fitted to (leave-one-GPU-type-out within it)."""

    n: int = 0
    mean_abs: float | None = None  # mean |central / truth - 1|
    max_abs: float | None = None
    band: tuple[float, float] = DEFAULT_BAND
    gpus: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if not self.n:
            return "no GPU type pair in the evidence: the band is a default +-20%, not measured"
        lo, hi = (math.exp(b) - 1 for b in self.band)
        return (f"leave-one-GPU-type-out over {self.n} public runs on {len(self.gpus)} GPU types: mean |error| "
                f"{self.mean_abs:.1%}, max {self.max_abs:.0%}; band {lo:+.0%} / {hi:+.0%} "
                "(5%-95% of those errors)")  # fmt: skip


class CrossGpu:
    """The transfer with fitted parameters over a catalog's GPU types (`gpus`: name -> GpuSpec)."""

    def __init__(self, gpus: Mapping[str, Any], params: Params = Params(), calibration: Calibration | None = None):
        self.gpus, self.params = gpus, params
        self.calibration = calibration or Calibration()
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

    def transfer(self, run: Run, work: Work, gpu: str) -> float | None:
        """The run's seconds per unit moved to `work` on `gpu`."""
        src = self.ideal(run.flops, run.memory_bytes, run.gpu, run.precision, run.tf32)
        dst = self.ideal(work.flops, work.memory_bytes, gpu, work.precision, work.tf32)
        if not src or not dst:
            return None
        return run.seconds * dst / src

    def estimate(self, basis: Iterable[Run], work: Work, gpu: str) -> Estimate | None:
        """The prediction for `work` on `gpu` from the `basis` runs (never one on `gpu` itself: the caller's)."""
        moved = [(run, t) for run in basis if (t := self.transfer(run, work, gpu))]
        if not moved:
            return None
        nearest = min(self.distance(run.gpu, gpu, work.precision) for run, _t in moved)
        got = [(run, t, self.weight(run.gpu, gpu, nearest, work.precision)) for run, t in moved]
        total = sum(w for _r, _t, w in got)
        if not got or total <= 0:
            return None
        mean = sum(w * math.log(t) for _r, t, w in got) / total
        spread = math.sqrt(sum(w * (math.log(t) - mean) ** 2 for _r, t, w in got) / total)  # the runs disagree
        lo, hi = self.calibration.band
        central = math.exp(mean)
        return Estimate(central, central * math.exp(lo - spread), central * math.exp(hi + spread), got,
                        self.calibration.describe())  # fmt: skip


# ------------------------------------------------------------------------------------------------------- fitting


def _pairs(runs: Sequence[Run]) -> list[tuple[int, int]]:
    """(target, basis) index pairs: the same group on another GPU type."""
    by_group: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(runs):
        by_group[r.group].append(i)
    return [(i, j) for idx in by_group.values() for i in idx for j in idx if runs[i].gpu != runs[j].gpu]


def _fold_errors(
    model: CrossGpu, runs: Sequence[Run], pairs: list[tuple[int, int]], grid: Iterable[Params] | None = None
) -> dict[Params, np.ndarray]:
    """log(truth / central) of every target of `pairs` under every parameter pair of the grid (vectorised)."""
    if not pairs:
        return {p: np.array([]) for p in (grid or [model.params])}
    parts = np.array([model.parts(r.flops, r.memory_bytes, r.gpu, r.precision, r.tf32) for r in runs])
    log_s = np.log([r.seconds for r in runs])
    ti, bj = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    dist = np.array([model.distance(runs[i].gpu, runs[j].gpu, runs[i].precision) for i, j in pairs])
    targets = np.unique(ti)
    index = np.searchsorted(targets, ti)
    nearest = np.full(len(targets), np.inf)
    np.minimum.at(nearest, index, dist)
    dist = dist - nearest[index]  # weights relative to each target's nearest basis (no underflow)
    out = {}
    for p in grid or [Params(km, tau) for km in KAPPA_MEM for tau in TAUS]:
        ideal = np.log(parts[:, 0] + p.kappa_mem * parts[:, 1])
        pred = log_s[bj] + ideal[ti] - ideal[bj]
        w = np.ones_like(dist) if p.tau == math.inf else np.exp(-dist / p.tau)
        num = np.bincount(index, w * pred, len(targets))
        den = np.bincount(index, w, len(targets))
        out[p] = log_s[targets] - num / den
    return out


def _best(runs: Sequence[Run], model: CrossGpu) -> Params | None:
    """The grid's parameters with the least mean |log error| over the runs' pairs."""
    pairs = _pairs(runs)
    if not pairs:
        return None
    errors = _fold_errors(model, runs, pairs)
    return min(errors, key=lambda p: (float(np.mean(np.abs(errors[p]))), p.tau == math.inf, p.kappa_mem))


def fit(runs: Sequence[Run], gpus: Mapping[str, Any]) -> CrossGpu:
    """The parameters that predict the runs best from their groups' other GPU types; the band from errors made
    out of sample: each GPU type's runs predicted with the parameters fitted without it (the in-sample errors of
    the fit are smaller than those on a GPU type it has not seen)."""
    model = CrossGpu(gpus)
    usable = [r for r in runs if model.parts(r.flops, r.memory_bytes, r.gpu, r.precision, r.tf32)]
    best = _best(usable, model)
    if best is None:
        return model
    held_out = []
    for gpu in sorted({r.gpu for r in usable}):
        inner = [r for r in usable if r.gpu != gpu]
        params = _best(inner, model)
        if params is None:
            continue
        errs = _fold_errors(CrossGpu(gpus, params), usable, [p for p in _pairs(usable) if usable[p[0]].gpu == gpu],
                            grid=[params])[params]  # fmt: skip
        held_out.append(errs)
    e = np.concatenate(held_out) if held_out else np.array([])
    rel = np.abs(np.exp(-e) - 1)  # |central / truth - 1|
    band = tuple(float(q) for q in np.quantile(e, BAND_QUANTILES)) if len(e) >= MIN_CALIBRATION else DEFAULT_BAND
    calib = Calibration(len(e), float(rel.mean()) if len(e) else None, float(rel.max()) if len(e) else None,
                        band, sorted({r.gpu for r in usable}))  # type: ignore[arg-type]  # fmt: skip
    return CrossGpu(gpus, best, calib)


@dataclass
class Holdout:
    """One run of a GPU type left out of the fit, predicted from its group on the other GPU types."""

    run: Run
    estimate: Estimate
    by_gpu: dict[str, Estimate]  # the prediction from each basis GPU type alone
    params: Params

    @property
    def error(self) -> float:
        return self.estimate.central / self.run.seconds - 1

    @property
    def inside(self) -> bool:
        return self.estimate.low * (1 - 1e-9) <= self.run.seconds <= self.estimate.high * (1 + 1e-9)


def leave_one_gpu_out(runs: Sequence[Run], gpus: Mapping[str, Any]) -> list[Holdout]:
    """For every GPU type: fit on the runs of the others, predict its runs from their groups (the benchmark)."""
    out = []
    for held in sorted({r.gpu for r in runs}):
        train = [r for r in runs if r.gpu != held]
        model = fit(train, gpus)
        by_group: dict[str, list[Run]] = defaultdict(list)
        for r in train:
            by_group[r.group].append(r)
        for run in (r for r in runs if r.gpu == held):
            basis = by_group.get(run.group, [])
            work = Work(run.model, run.kind, run.params, run.flops, run.memory_bytes, run.precision, run.tf32)
            est = model.estimate(basis, work, held)
            if est is None:
                continue
            per: dict[str, list[Run]] = defaultdict(list)
            for b in basis:
                per[b.gpu].append(b)
            by_gpu = {g: e for g, rs in per.items() if (e := model.estimate(rs, work, held))}
            out.append(Holdout(run, est, by_gpu, model.params))
    return out
