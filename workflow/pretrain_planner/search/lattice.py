"""The lattice of one setting's methods, and what its measured cells say.

A method's `Shape` is its family (the base and its throughput levers) and its memory savers (activation
checkpointing, a sharding, offload); `covers` is the work order the pruning rules reason in. A `Setting` is one
(model, GPU type, nodes, GPUs per node) with its valid methods and the memory facts and compute floor its rules
need; an `Observation` is what a measured cell tells the search. Imports no torch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pretrain_planner import layout
from pretrain_planner.planning.flops import tokens_per_sample, train_flops_per_sample
from pretrain_planner.planning.grid import largest_micro_batch
from pretrain_planner.planning.memory import MemoryFacts
from pretrain_planner.planning.methods import SHARDING_ENGINE, SHARDING_LEVEL, parse
from pretrain_planner.planning.runspec import OnNodes
from pretrain_planner.results import gpu_hours
from pretrain_planner.schema import default

MEMORY_SAVING_LEVERS = ("fa2", "liger", "flce")  # throughput levers that also hold less (rule 4's tie-break)
DEFAULT_TOLERANCE = default("config", "search.tolerance")  # the schema's; a Setting built without a config
DEFAULT_MODEL_ERROR = default("config", "search.model_error")


@dataclass(frozen=True)
class Shape:
    """A method's place in the lattice: its family (base + throughput levers) and its memory savers."""

    slug: str
    family: str
    ac: bool
    sharding: str | None
    offload: bool

    @property
    def level(self) -> int:
        return SHARDING_LEVEL.get(self.sharding or "", 0)  # methods.py's table

    @property
    def is_probe(self) -> bool:
        return not (self.ac or self.sharding or self.offload)


@functools.cache
def shape(slug: str) -> Shape:
    """A slug's place in the lattice (methods.parse's grammar): its family (the base and the parts that save no
    memory) and its memory savers."""
    m = parse(slug)
    return Shape(slug, m.family, m.checkpointing, m.sharding, m.offload)


def covers(a: Shape, b: Shape) -> bool:
    """a does at least b's work per sample and saves at least b's memory (b <= a in the work order)."""
    if a.family != b.family or a.ac < b.ac or a.offload < b.offload:
        return False
    if b.sharding is None:
        return True
    return a.sharding is not None and SHARDING_ENGINE[a.sharding] == SHARDING_ENGINE[b.sharding] and a.level >= b.level


@dataclass(frozen=True)
class Observation:
    """What a measured cell says to the search."""

    status: str  # ok | oom | unsupported | corrupt
    micro_batch: int | None = None
    step_time_s: float | None = None
    peak_mem_gib: float | None = None
    peak_mem_kind: str | None = None
    gpu_hours: float = 0.0
    suspect: bool = False

    @classmethod
    def of(cls, row: Mapping[str, Any] | None, world: int) -> Observation:
        """From a result row (aggregate.parse_result); None = an unusable file."""
        if row is None:
            return cls("corrupt")
        wall = row.get("wall_time_s")
        noisy = row["status"] == "noisy"  # it ran at that micro-batch, but its timing is not to be trusted
        return cls(
            "ok" if noisy else row["status"],
            row.get("micro_batch"),
            row.get("step_time_s"),
            row.get("peak_mem_gib"),
            row.get("peak_mem_kind"),
            gpu_hours(wall or 0.0, row.get("world_size") or world),
            bool(row.get("suspect")) or noisy,
        )


@dataclass(frozen=True)
class Setting(OnNodes):
    """One (model, GPU type, nodes, GPUs per node) and its valid methods."""

    model: str
    gpu: str
    nodes: int
    gpus_per_node: int
    methods: tuple[str, ...]
    per_rank_batch: int
    top: int  # the largest micro-batch the trainer tries
    memory: MemoryFacts = field(default_factory=lambda: MemoryFacts(None, None, None))
    saturated: int = 8  # a micro-batch this large already keeps the GPU busy (search.saturated_tokens)
    compute_floor_s: float = 0.0  # a step's training FLOPs at the plausible MFU ceiling (0 = unknown)
    tolerance: float = DEFAULT_TOLERANCE  # search.tolerance
    model_error: float = DEFAULT_MODEL_ERROR  # search.model_error

    @property
    def folder(self) -> str:
        return layout.setting_folder(self.model, self.gpu, self.nodes, self.gpus_per_node)


def lattice_rank(slug: str) -> tuple[int, int, int, str]:
    """Less memory saving first: a method's rules read the methods below it."""
    s = shape(slug)
    return (s.level, int(s.ac), int(s.offload), slug)


def best_measured(observed: Mapping[str, Observation]) -> tuple[float, str] | None:
    timed = [(ob.step_time_s, m) for m, ob in observed.items() if ob.status == "ok" and not ob.suspect]
    return min((t, m) for t, m in timed if t) if any(t for t, _m in timed) else None


def variant(slug: str, base: str | None = None, **change: Any) -> str:
    """The slug of `slug` with its family replaced by the probe `base` (a family's slug, e.g. fl+liger), or its
    checkpointing, sharding or offload changed; canonical, by methods.py's grammar."""
    m = parse(slug)
    if base is not None:
        b = parse(base)
        m = replace(m, base=b.base, kernels=b.kernels, fused_ce=b.fused_ce, compile_mode=b.compile_mode)
    return replace(
        m, checkpointing=change.get("ac", m.checkpointing), sharding=change.get("sharding", m.sharding),
        offload=change.get("offload", m.offload),
    ).slug  # fmt: skip


def compute_floor_s(model: Any, gpu: Any, per_rank_batch: int, mfu_ceiling: float) -> float:
    """Seconds a step's forward + backward takes at least: its FLOPs at `mfu_ceiling` of the GPU's highest dense
    peak for the recipe (benchmark.suspect_mfu: a faster step is physically implausible). 0 when unknown."""
    flops = train_flops_per_sample(model.to_dict())
    peak = gpu.peak_for(model.recipe.precision, tf32=True)
    if not flops or not peak:
        return 0.0
    return per_rank_batch * flops / (peak * 1e12 * mfu_ceiling)


def saturating_samples(model: Any, saturated_tokens: int) -> int:
    """Samples a micro-batch needs to hold `saturated_tokens` tokens: the sequence or a ViT's patches; for a
    family without tokens (ConvNeXt) 16x16 patches of its image stand in."""
    tokens = tokens_per_sample(model.to_dict())
    if tokens is None:
        tokens = max(1, (model.recipe.image_size // 16) ** 2)
    return max(1, saturated_tokens // tokens)


def settings(
    planned: Iterable[Any],
    catalog: Any,
    max_micro_batch: int | None,
    saturated_tokens: int = default("config", "search.saturated_tokens"),
    mfu_ceiling: float = default("config", "benchmark.suspect_mfu"),
    tolerance: float = DEFAULT_TOLERANCE,
    model_error: float = DEFAULT_MODEL_ERROR,
) -> list[Setting]:
    """The settings of a plan (grid.PlannedCell list) with their valid methods, in plan order."""
    groups: dict[tuple[str, str, int, int], list[str]] = {}
    for p in planned:
        c = p.cell
        key = (c.model, c.gpu, c.nodes, c.gpus_per_node)
        methods = groups.setdefault(key, [])
        if p.valid:
            methods.append(c.method)
    out = []
    for (model, gpu, nodes, gpn), methods in groups.items():
        if not methods:
            continue
        spec = catalog.models[model]
        per_rank = spec.recipe.global_batch // (nodes * gpn)
        out.append(
            Setting(
                model, gpu, nodes, gpn, tuple(methods), per_rank, largest_micro_batch(per_rank, max_micro_batch),
                MemoryFacts.of(spec, catalog.gpus[gpu].memory_gib, tuple(methods)),
                saturating_samples(spec, saturated_tokens),
                compute_floor_s(spec, catalog.gpus[gpu], per_rank, mfu_ceiling), tolerance, model_error,
            )
        )  # fmt: skip
    return out
