"""The cross-GPU model's leave-one-out harness: a GPU type, a cell or a workload left out of the fit and predicted
from the rest, each prediction kept with the truth it is judged against (`Holdout`).

benchmarks/predict_crossgpu.py scores the whole procedure with it and benchmarks/evidence_replay.py replays a site's
sweep with its pieces; tests/test_crossgpu.py checks through it that the band a prediction quotes is the one measured
held out. The model itself, its fit and the bands it quotes (computed out of sample at fit time, on arrays, by
planning/crossgpu.py's `_calibrate`) stay in the package: a prediction needs them, a prediction never needs this.
Imports numpy (through the model), no torch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pretrain_planner.planning.crossgpu import CrossGpu, Estimate, Params, fit, stand_in, stand_in_candidates
from pretrain_planner.planning.evidence import Run, Work


@dataclass
class Holdout:
    """A run left out of the fit and predicted from the rest (`kind` says how)."""

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


def work_of_run(run: Run) -> Work:
    """A run's own workload as a prediction target."""
    return Work(run.model, run.kind, run.params, run.flops, run.memory_bytes, run.precision, run.tf32,
                formula=run.formula, software=run.software)  # fmt: skip


def _holdouts(model: CrossGpu, targets: Iterable[Run], basis_of) -> list[Holdout]:
    out = []
    for run in targets:
        basis = basis_of(run)
        est = model.estimate(basis, work_of_run(run), run.gpu)
        if est is None:
            continue
        per: dict[str, list[Run]] = defaultdict(list)
        for b in basis:
            per[b.gpu].append(b)
        by_gpu = {g: e for g, rs in per.items() if (e := model.estimate(rs, work_of_run(run), run.gpu))}
        out.append(Holdout(run, est, by_gpu, model.params))
    return out


def _group_basis(train: Sequence[Run]):
    by_group: dict[str, list[Run]] = defaultdict(list)
    for r in train:
        by_group[r.group].append(r)
    return lambda run: [b for b in by_group.get(run.group, []) if b.gpu != run.gpu]


def leave_one_gpu_out(runs: Sequence[Run], gpus: Mapping[str, Any]) -> list[Holdout]:
    """For every GPU type: fit on the runs of the others, predict its runs from their groups (the benchmark's
    headline: a GPU type nobody in the evidence measured)."""
    out = []
    for held in sorted({r.gpu for r in runs}):
        train = [r for r in runs if r.gpu != held]
        out += _holdouts(fit(train, gpus), [r for r in runs if r.gpu == held], _group_basis(train))
    return out


def leave_one_cell_out(runs: Sequence[Run], gpus: Mapping[str, Any]) -> list[Holdout]:
    """For every workload x GPU type x software: fit without it, without that software's other runs on the GPU type
    and without the workload's other runs on it; predict it from its groups, the GPU type's effect coming from other
    software's runs of other workloads (cells whose GPU type nothing else measured are left to leave_one_gpu_out)."""
    out = []
    for m, gpu, sw in sorted({(r.model, r.gpu, r.software) for r in runs}):
        train = [r for r in runs if not (r.gpu == gpu and (r.software == sw or r.model == m))]
        if not any(r.gpu == gpu for r in train):
            continue
        targets = [r for r in runs if (r.model, r.gpu, r.software) == (m, gpu, sw)]
        out += _holdouts(fit(train, gpus), targets, _group_basis(train))
    return out


def leave_one_model_out(runs: Sequence[Run], gpus: Mapping[str, Any], unseen: bool = False) -> list[Holdout]:
    """For every workload x software: fit without the workload (`unseen`: and without each target GPU type in turn),
    predict its runs from all the runs of its stand-in (stand_in: the nearest-sized workload x software of its kind,
    the same software first), as the what-if does for a model with no evidence of its own."""
    out = []
    cands = stand_in_candidates(runs)
    for m, sw in sorted(cands):
        sub = stand_in(*cands[(m, sw)], cands)
        if sub is None:
            continue
        targets = [r for r in runs if (r.model, r.software) == (m, sw)]
        for held in sorted({r.gpu for r in targets}) if unseen else [None]:
            train = [r for r in runs if r.model != m and (held is None or r.gpu != held)]
            basis = [r for r in train if (r.model, r.software) == sub]
            if not basis:
                continue
            model = fit(train, gpus)
            out += _holdouts(model, [r for r in targets if held is None or r.gpu == held], lambda _r, b=basis: b)
    return out
