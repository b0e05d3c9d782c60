"""The sweep, expanded into cells; each cell valid or not, with the reason.

A cell is model x GPU type x nodes x GPUs per node x method and maps 1:1 to
`cells/{model}/{gpu}/{nodes}x{gpus_per_node}/{method}` under the results folder. The validity rules are
the "$100K" study's (its experiments/training_time_empirical.py `is_valid`), plus what the launcher can run.
Imports no torch.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from pretrain_planner import layout
from pretrain_planner.planning import hostcpu, methods
from pretrain_planner.planning.catalog import Catalog, GpuSpec, ModelSpec
from pretrain_planner.planning.configtypes import LauncherSection, SweepSection, require
from pretrain_planner.planning.runspec import OnNodes, RunSpec, batch_split_reason
from pretrain_planner.schema import ConfigError

WILDCARD_CONSTRAINTS = {
    "model": r"[a-z0-9][a-z0-9._-]*",
    "gpu": r"[a-z0-9][a-z0-9_-]*",
    "nodes": r"\d+",
    "gpus_per_node": r"\d+",
    "method": r"[a-z0-9][a-z0-9+-]*",
}


@dataclass(frozen=True, order=True)
class Cell(OnNodes):
    model: str
    gpu: str
    nodes: int
    gpus_per_node: int
    method: str

    @property
    def path(self) -> str:
        return layout.cell_path(self.model, self.gpu, self.nodes, self.gpus_per_node, self.method)

    @property
    def name(self) -> str:
        """A short job name for schedulers."""
        return f"pp-{self.model}-{self.gpu}-{self.nodes}x{self.gpus_per_node}-{self.method}"

    def wildcards(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}

    @classmethod
    def from_wildcards(cls, wc: Any) -> Cell:
        get = wc.get if isinstance(wc, dict) else (lambda k: getattr(wc, k))
        method = methods.parse_canonical(get("method")).slug
        return cls(get("model"), get("gpu"), int(get("nodes")), int(get("gpus_per_node")), method)

    @classmethod
    def from_path(cls, path: str) -> Cell:
        m = re.search(layout.CELL_RE.pattern + r"/?$", str(path))
        if not m:
            raise ValueError(f"{path!r} is not a cell path ({layout.CELL_PATTERN})")
        return cls.from_wildcards(m.groupdict())


@dataclass(frozen=True)
class PlannedCell:
    cell: Cell
    reason: str | None  # None = valid
    per_rank_batch: float

    @property
    def valid(self) -> bool:
        return self.reason is None

    def row(self) -> dict[str, Any]:
        c = self.cell
        return {
            "model": c.model,
            "gpu": c.gpu,
            "nodes": c.nodes,
            "gpus_per_node": c.gpus_per_node,
            "world_size": c.world_size,
            "method": c.method,
            "valid": self.valid,
            "reason": self.reason or "",
            "per_rank_batch": self.per_rank_batch,
            "path": c.path,
        }


def largest_micro_batch(per_rank_batch: int, cap: int | None) -> int:
    """The trainer's first micro-batch: the largest power of two up to the per-rank batch and the cap
    (benchmark.max_micro_batch); the search reasons from the same number."""
    top = per_rank_batch if cap is None else min(per_rank_batch, cap)
    return 1 << (max(1, top).bit_length() - 1)


def _is_power_of_two(n: float) -> bool:
    return n >= 1 and float(n).is_integer() and (int(n) & (int(n) - 1)) == 0


def invalid_reason(cell: Cell, model: ModelSpec, gpu: GpuSpec, launcher: str, catalog: Catalog) -> str | None:
    """Why a cell cannot run (the study's rules around the method's own, RunSpec.reason, then the launcher's), or
    None if it can."""
    method = methods.parse(cell.method)
    gb, world = model.recipe.global_batch, cell.world_size
    where = f"{catalog.models_path}: {model.name}.recipe.global_batch={gb}"
    why = batch_split_reason(gb, world)
    if why:
        return f"{why} ({where})"
    if not _is_power_of_two(gb / world):
        return f"per-GPU batch {gb}/{world} = {gb / world:g} is not a power of two ({where})"
    precision = model.recipe.precision
    if not gpu.supports(precision):
        if precision == "bf16" and gpu.bf16_host:
            return (
                f"bf16 (recipe precision of {model.name}) is emulated on this host's CPU ({gpu.bf16_host}): a bf16 "
                f"step would time the emulation, several times slower than the model's arithmetic "
                f"({catalog.gpus_path}: {gpu.name}.bf16 = host; {hostcpu.OVERRIDE_ENV}=native runs it anyway)"
            )
        return (
            f"{precision} (recipe precision of {model.name}) is not supported by {gpu.name} "
            f"({catalog.gpus_path}: {gpu.name}.{precision} = false)"
        )
    why = RunSpec(model, gpu, method, world, nodes=cell.nodes).sweep_reason(catalog.models_path)
    if why:
        return why
    if launcher in ("local", "debug") and cell.nodes > 1:
        return f"the {launcher} launcher runs on one node; use the slurm launcher for {cell.nodes} nodes"
    if launcher == "debug" and world > 1:
        return "the debug launcher runs one rank in the driver's process"
    return None


def check_sweep(sweep: SweepSection, catalog: Catalog, source: str = "config") -> None:
    """Names in the sweep must exist in the catalog; method slugs must parse."""
    require(sweep, SweepSection, "planning.grid.check_sweep")
    for key, known, path in (
        ("models", catalog.models, catalog.models_path),
        ("gpus", catalog.gpus, catalog.gpus_path),
    ):
        for i, name in enumerate(getattr(sweep, key)):
            if name not in known:
                raise ConfigError(
                    f"{source}: sweep.{key}[{i}]: {name!r} is not defined in {path}; known: {', '.join(known)}"
                )
    for i, slug in enumerate(sweep.methods):
        methods.parse(slug, where=f"{source}: sweep.methods[{i}]")


def expand(sweep: SweepSection, launcher: LauncherSection, catalog: Catalog, source: str = "config"
           ) -> list[PlannedCell]:  # fmt: skip
    """Every cell of the sweep, valid or not (on `launcher`'s kind too), in a stable order."""
    require(launcher, LauncherSection, "planning.grid.expand")
    check_sweep(sweep, catalog, source)
    slugs = list(dict.fromkeys(methods.parse(s).slug for s in sweep.methods))
    planned = []
    for model_name in sweep.models:
        model = catalog.models[model_name]
        for gpu_name in sweep.gpus:
            gpu = catalog.gpus[gpu_name]
            for nodes in sweep.nodes:
                for gpn in sweep.gpus_per_node:
                    for slug in slugs:
                        cell = Cell(model_name, gpu_name, nodes, gpn, slug)
                        reason = invalid_reason(cell, model, gpu, launcher.kind, catalog)
                        planned.append(PlannedCell(cell, reason, model.recipe.global_batch / cell.world_size))
    return planned


def check_plan(planned: list[PlannedCell], source: str = "config") -> None:
    """A model with no runnable cell at all is a mistake in the config, not a plan: fail before submitting."""
    by_model: dict[str, list[PlannedCell]] = {}
    for p in planned:
        by_model.setdefault(p.cell.model, []).append(p)
    problems = []
    for model, cells in by_model.items():
        if not any(p.valid for p in cells):
            reasons = sorted({p.reason for p in cells if p.reason})
            problems.append(
                f"  sweep.models: {model!r} has no valid cell:\n" + "\n".join(f"    - {r}" for r in reasons)
            )
    if problems:
        raise ConfigError(f"{source}: nothing to run for some models\n" + "\n".join(problems))
