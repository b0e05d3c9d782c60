"""The evidence's price of a step on a setting the adaptive search has no time of yet: what the search's time model
(search/timemodel.py) orders a method family by when none of that family's cells in the setting has a time (its probe
ran out of memory, or was unsupported).

It rests on every row the what-if rests on: the shipped public rows, the rows imported into the evidence folder and
the sweep's own cells (read as the rows `evidence export` writes), each keeping its origin. The model's own runs are
the basis where there are any (on any GPU type, this one weighing most), else those of the nearest-sized workload of
its kind (crossgpu.stand_in); the cross-GPU model (planning/crossgpu.py) moves them to the target GPU type and says
its measured error. Without evidence, or for a GPU type without the step model's rates (the `cpu` stand-in), the
search keeps its fixed guess and says why.

Why only the order: the search measures each family's probe first, so a family it has not timed is one whose probe
did not run; the evidence's band misses one published run in ten (docs/predictions.md), and pruning on a prior
pruned the winner (benchmarks/results/search_robustness.md). benchmarks/search_evidence.py measures what the order is
worth, and the other uses of the evidence that were tried and not adopted. Imports no torch."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from pretrain_planner.planning import crossgpu
from pretrain_planner.planning import evidence_exchange as exchange
from pretrain_planner.planning.evidence import HERE, Run, catalog_work, origins_of, origins_text
from pretrain_planner.planning.flops import param_count


class EvidencePrior:
    """Seconds per sample of `model` on one `gpu`, per method family, from the evidence (`seconds_per_sample`)."""

    def __init__(self, catalog: Any, model: str, gpu: str, results: str | Path | None = None,
                 folder: str | Path | None = None, suspect_mfu: float = 0.85) -> None:  # fmt: skip
        self.catalog, self.model, self.gpu = catalog, model, gpu
        self.results, self.folder, self.suspect_mfu = results, folder, suspect_mfu
        self._done: dict[str, tuple[float | None, str]] = {}

    @cached_property
    def runs(self) -> list[Run]:
        """The shipped and imported rows, and the model's own cells in the results folder."""
        loaded = exchange.loaded_evidence(self.catalog, self.suspect_mfu, self.folder)
        own = exchange.own_evidence(self.catalog, self.results, self.model, self.suspect_mfu)
        return [*loaded.runs, *own.runs]

    def seconds_per_sample(self, family: str) -> tuple[float | None, str]:
        """(a step's compute seconds per sample on one GPU of the setting, or None; what it rests on, or why none)."""
        if family not in self._done:
            self._done[family] = self._estimate(family)
        return self._done[family]

    def _estimate(self, family: str) -> tuple[float | None, str]:
        spec = self.catalog.models[self.model]
        eager = family.split("+")[0] == "naive"  # eager attention: the memory-bound bytes of its scores
        work = catalog_work(spec, eager=eager, tf32=not eager)
        if work is None:
            return None, f"{self.model}: its family has no FLOPs formula"
        if crossgpu.CrossGpu(self.catalog.gpus).rates(self.gpu, work.precision) is None:
            return None, f"{self.gpu} has no matmul rate and memory bandwidth for {work.precision} in the catalog"
        try:
            runs = self.runs
        except exchange.EvidenceError as exc:  # the order must not stop the search: it keeps its guess, saying why
            return None, f"the evidence could not be read: {exc}"
        basis = [r for r in runs if r.model == self.model]
        if not basis:
            key = crossgpu.stand_in(self.model, param_count(spec.to_dict()) or 1.0, spec.task,
                                    spec.kind.formula or "", HERE, crossgpu.stand_in_candidates(runs))  # fmt: skip
            basis = [r for r in runs if key and (r.model, r.software) == key]
        if not basis:
            return None, (f"no evidence of {self.model} nor of a {spec.task} within {crossgpu.STAND_IN_RATIO:g}x its "
                          f"size")  # fmt: skip
        estimate = crossgpu.fit(runs, self.catalog.gpus).estimate(basis, work, self.gpu)
        if estimate is None:
            return None, f"its evidence cannot be moved to {self.gpu}"
        per_sample = estimate.central * (work.tokens or 1)
        origins = origins_text(origins_of([r for r, _t, _w in estimate.basis]))
        return per_sample, (
            f"{per_sample:.4g} s per sample on one {self.gpu} ({estimate.kind.short}) from {origins}: "
            f"{estimate.rows(4)}; its kind's measured error: {estimate.band_note}"
        )
