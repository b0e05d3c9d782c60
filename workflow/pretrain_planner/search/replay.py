"""Running the search without training: against a complete table of cell results (measured or synthetic), and
on what the memory model expects (the dry run's estimate of the cells the adaptive search will need). Imports
no torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pretrain_planner.search.calibration import AC_ESTIMATE_SHARE, largest_fitting
from pretrain_planner.search.lattice import Observation, Setting, shape
from pretrain_planner.search.rules import decide
from pretrain_planner.search.timemodel import Prior

AC_EXTRA_WORK = 0.25  # checkpointing's extra time, for the guess of the next method only


@dataclass
class Replay:
    ran: list[str]
    pruned: dict[str, str]
    rounds: list[list[str]]
    gpu_hours: float
    gpu_hours_exhaustive: float
    order: dict[str, str] = field(default_factory=dict)  # a family ordered without a measured cell -> on what


def replay(setting: Setting, table: Mapping[str, Observation], prior: Prior | None = None) -> Replay:
    """Run the search against a complete table of cell results (measured or synthetic), training nothing; `prior`:
    the evidence the order of an untimed family rests on."""
    observed: dict[str, Observation] = {}
    rounds, order = [], {}
    while True:
        decision = decide(setting, observed, prior)
        order.update(decision.order)
        if not decision.run:
            break
        rounds.append(decision.run)
        for m in decision.run:
            observed[m] = table[m]
    spent = sum(table[m].gpu_hours for m in observed)
    total = sum(table[m].gpu_hours for m in setting.methods)
    return Replay(list(observed), decision.pruned, rounds, spent, total, order)


def predicted_table(setting: Setting, hours: Mapping[str, float]) -> dict[str, Observation]:
    """What the memory model expects every method to do (for the dry run's estimate of adaptive cells)."""
    mem, table = setting.memory, {}
    for slug in setting.methods:
        s = shape(slug)
        micro_batch = setting.top
        if mem.capacity and mem.params and mem.activation_est:
            states = mem.states(s.sharding, s.offload, setting.world_size).peak * 1.2
            share = AC_ESTIMATE_SHARE if s.ac else 1.0
            micro_batch = largest_fitting(micro_batch, states, mem.activation_est * share, mem.capacity)
        ok = micro_batch >= 1
        # relative step time: the work order's factors, and the saturation of small micro-batches
        step = (1 + AC_EXTRA_WORK * s.ac) * (1.5 if s.offload else 1.0) * 1.05**s.level
        step *= min(setting.top, setting.saturated) / min(max(micro_batch, 1), setting.saturated)
        table[slug] = Observation(
            "ok" if ok else "oom", micro_batch if ok else None, step if ok else None, gpu_hours=hours[slug]
        )
    return table
