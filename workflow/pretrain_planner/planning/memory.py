"""A memory model of one training method on one GPU: model-state bytes and activation bytes per sample.

The adaptive search (search.py) uses it to skip cells that cannot fit and to guess which memory-saving
method reaches the largest micro-batch. Model states follow DeepSpeed's estimators
(`estimate_zero2_model_states_mem_needs` / `..._zero3_...`) for fp32 master weights with Adam: 4 bytes of
parameters, 4 of gradients and 8 of optimizer state per parameter, divided across the ranks by the
sharding and moved off the GPU by offload. `state_bytes_lb` counts only what is certainly resident at a
step's peak, so it is a lower bound: a method whose lower bound exceeds the GPU's memory cannot fit.
Activations per sample come from the probe's measured peak, else from Korthikanti et al.'s 34·s·h bytes
per layer (memory-efficient attention, 16-bit activations). Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrain_planner.planning.catalog import ModelSpec
from pretrain_planner.planning.flops import param_count, tokens_per_sample
from pretrain_planner.planning.methods import SHARDING_ENGINE, SHARDING_LEVEL

GIB = 2**30
PARAM_B, GRAD_B, OPTIM_B = 4, 4, 8  # fp32 master weights, fp32 gradients, Adam's two moments


def state_bytes_lb(sharding: str | None, offload: bool, params: float, world: int) -> float:
    """Model-state bytes certainly on one GPU at a step's peak (a lower bound)."""
    level = SHARDING_LEVEL.get(sharding or "", 0)
    p, g, o = PARAM_B * params, GRAD_B * params, OPTIM_B * params
    if level >= 3:
        return 0.0 if offload else (p + g + o) / world
    if offload:
        # ZeRO-1/2 offload the optimizer (and gradients to it); FSDP2's offload moves parameters too
        return p if SHARDING_ENGINE.get(sharding or "") == "zero" else 0.0
    if level == 2:
        return p + (g + o) / world
    if level == 1:
        return p + g + o / world
    return p + g + o


def activation_bytes_per_sample(model: ModelSpec) -> float | None:
    """Korthikanti et al.: 34·s·h bytes per layer for 16-bit activations (x2 for fp32 recipes)."""
    a, r = model.arch, model.recipe
    if "hidden_size" not in a or "num_hidden_layers" not in a:
        return None
    tokens = tokens_per_sample(model.to_dict())
    if tokens is None:
        return None
    width = 2 if r.precision == "fp32" else 1
    return 34.0 * tokens * a["hidden_size"] * a["num_hidden_layers"] * width


@dataclass(frozen=True)
class MemoryFacts:
    """What the search knows of one setting's memory: GPU capacity, parameters, activations per sample."""

    capacity: float | None  # bytes per GPU; None = unknown (the `cpu` stand-in)
    params: float | None
    activation_est: float | None  # bytes per sample without checkpointing (analytic)

    @classmethod
    def of(cls, model: ModelSpec, memory_gib: float | None) -> MemoryFacts:
        params = param_count(model.to_dict())
        return cls(memory_gib * GIB if memory_gib else None, params, activation_bytes_per_sample(model))
