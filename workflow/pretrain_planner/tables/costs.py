"""What a setting costs: hardware purchase, amortised experiment cost, cloud rent; and the Pareto front.

The "$100K" study's arithmetic (its scripts/plotting/training_costs.py; docs/methods.md, Facts): hardware =
base machine by GPU count + GPUs x GPU price; experiment cost = hardware x days / (years x 365), five-year straight-line
amortisation. Cloud cost = $/GPU-hour x GPUs x hours. A setting spread over several nodes buys one base
machine per node (nodes x base machine for the GPUs per node). Prices come from config/gpus.yaml; a
missing one gives a blank cost and a note saying which key to fill in. Imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pretrain_planner.planning.catalog import GpuSpec
from pretrain_planner.planning.configtypes import CostsSection, require
from pretrain_planner.planning.runspec import OnNodes
from pretrain_planner.schema import default

COST_KINDS = ("hardware", "amortised", "cloud")
DEFAULT_YEARS = default("config", "costs.amortisation_years")  # the schema's: 5, as in the "$100K" study


def typed(costs: CostsSection | None, where: str) -> CostsSection:
    """The costs section a table prices with: the one typed where the config was loaded (a dict refused, naming
    `where`: it would be read by key again), else (None: no config, a test's table) the schema's defaults."""
    if costs is None:
        return CostsSection.given()
    require(costs, CostsSection, where)
    return costs


@dataclass(frozen=True)
class Price(OnNodes):
    """The prices of one setting, derived from its inputs; a None value is unknown and `notes` says why."""

    gpu: str
    nodes: int
    gpus_per_node: int
    days: float | None
    amortisation_years: float
    gpu_price_usd: float | None
    base_machine_usd: float | None
    cloud_usd_per_gpu_hour: float | None
    notes: list[str] = field(default_factory=list)

    @property
    def hardware_usd(self) -> float | None:
        if self.base_machine_usd is None or self.gpu_price_usd is None:
            return None
        return self.nodes * self.base_machine_usd + self.world_size * self.gpu_price_usd

    @property
    def amortised_usd(self) -> float | None:
        hardware = self.hardware_usd
        if hardware is None or self.days is None:
            return None
        return hardware * self.days / (self.amortisation_years * 365)

    @property
    def gpu_hours(self) -> float | None:
        return self.world_size * self.days * 24 if self.days is not None else None

    @property
    def cloud_usd(self) -> float | None:
        if self.cloud_usd_per_gpu_hour is None or self.gpu_hours is None:
            return None
        return self.cloud_usd_per_gpu_hour * self.gpu_hours

    @property
    def note(self) -> str | None:
        return "; ".join(self.notes) or None

    def cost(self, kind: str) -> float | None:
        return {"hardware": self.hardware_usd, "amortised": self.amortised_usd, "cloud": self.cloud_usd}[kind]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("notes")
        derived = ("hardware_usd", "amortised_usd", "gpu_hours", "cloud_usd", "world_size")
        return {**d, **{k: getattr(self, k) for k in derived}, "cost_note": self.note}


def _finite(x: float | None) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def price(
    gpu: GpuSpec | None,
    gpu_name: str,
    nodes: int,
    gpus_per_node: int,
    days: float | None,
    base_machine_usd: dict[int, float],
    years: float = DEFAULT_YEARS,
    gpus_path: str = "config/gpus.yaml",
) -> Price:
    """Price `nodes` machines of `gpus_per_node` GPUs of type `gpu` running for `days`."""
    notes: list[str] = []
    days = days if _finite(days) else None
    if gpu is None:
        notes.append(f"GPU type {gpu_name!r} is not in {gpus_path}")
    gpu_price = gpu.price_usd if gpu is not None else None
    cloud_rate = gpu.cloud_usd_per_gpu_hour if gpu is not None else None
    base = base_machine_usd.get(gpus_per_node)
    if gpu is not None and gpu_price is None:
        notes.append(f"no price_usd for {gpu_name} in {gpus_path}")
    if gpu is not None and gpu.price_note:
        notes.append(f"{gpu_name}: {gpu.price_note}")
    if base is None:
        notes.append(f"no base_machine_usd for {gpus_per_node} GPUs in {gpus_path}")
    if days is None:
        notes.append("no training days (no measured step time, or a time-budgeted recipe without a step count)")
    if gpu is not None and cloud_rate is None:
        notes.append(f"no cloud_usd_per_gpu_hour for {gpu_name} in {gpus_path}")
    return Price(gpu_name, nodes, gpus_per_node, days, years, gpu_price, base, cloud_rate, notes)


def pareto_mask(days: Sequence[float | None], cost: Sequence[float | None]) -> list[bool]:
    """True for the points no other point dominates in (days, cost), both minimised.

    A point dominates another if it is no worse in both and better in one; identical points do not
    dominate each other (both stay). Points with an unknown (None/NaN) coordinate are never on the front.
    """
    known = [i for i in range(len(days)) if _finite(days[i]) and _finite(cost[i])]
    order = sorted(known, key=lambda i: (days[i], cost[i]))
    mask = [False] * len(days)
    best_cost, best_days = math.inf, None
    for i in order:
        if cost[i] < best_cost:
            mask[i] = True
            best_cost, best_days = cost[i], days[i]
        elif cost[i] == best_cost and days[i] == best_days:
            mask[i] = True  # an exact tie with a point on the front
    return mask


def pareto_by_group(keys: Iterable[Any], days: Sequence[float | None], cost: Sequence[float | None]) -> list[bool]:
    """`pareto_mask` within each group (e.g. per model)."""
    keys = list(keys)
    groups: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    mask = [False] * len(keys)
    for idx in groups.values():
        sub = pareto_mask([days[i] for i in idx], [cost[i] for i in idx])
        for i, on in zip(idx, sub, strict=True):
            mask[i] = on
    return mask
