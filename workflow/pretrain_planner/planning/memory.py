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

GIB = 2**30
PARAM_B, GRAD_B, OPTIM_B = 4, 4, 8  # fp32 master weights, fp32 gradients, Adam's two moments
# sharding level (how much is divided across ranks): zero1 optimizer; zero2 / fsdp-grad + gradients;
# zero3 / fsdp-full + parameters
SHARDING_LEVEL = {"zero1": 1, "zero2": 2, "fsdp-grad": 2, "zero3": 3, "fsdp-full": 3}
SHARDING_ENGINE = {"zero1": "zero", "zero2": "zero", "zero3": "zero", "fsdp-grad": "fsdp", "fsdp-full": "fsdp"}


def param_count(model: ModelSpec) -> float | None:
    """Parameters of a transformer or Mamba from its arch (None for families without a formula)."""
    a = model.arch
    if model.family in ("gptneox", "roberta", "roberta-prelayernorm", "bert", "vit"):
        h, layers = a["hidden_size"], a["num_hidden_layers"]
        block = 4 * h * h + 2 * h * a.get("intermediate_size", 4 * h)
        if model.family == "vit":
            embed = (a["image_size"] // a["patch_size"]) ** 2 * h + h * a.get("num_labels", 2)
        else:
            tied = a.get("tie_word_embeddings", model.family != "gptneox")
            embed = a["vocab_size"] * h * (1 if tied else 2)
        return float(layers * block + embed)
    if model.family == "mamba":
        h, layers, e = a["hidden_size"], a["num_hidden_layers"], a.get("expand", 2)
        d_inner, n = e * h, a.get("state_size", 16)
        dt_rank = -(-h // 16)
        block = h * 2 * d_inner + d_inner * h + d_inner * (dt_rank + 2 * n) + dt_rank * d_inner
        return float(layers * block + a["vocab_size"] * h)
    return None


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
    if model.is_text:
        tokens = r.sequence_length or 0
    elif "patch_size" in a:
        tokens = (a["image_size"] // a["patch_size"]) ** 2 + 1
    else:
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
        return cls(memory_gib * GIB if memory_gib else None, param_count(model), activation_bytes_per_sample(model))
