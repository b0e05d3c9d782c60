"""Training methods as composable slugs: `naive`, `fl`, `fl+ac`, `fl+zero3+off`, `fl+fa2+flce`, ...

A slug is `base[+part...]` in a canonical order, so each method has exactly one path on disk and new
knobs need no rule changes: add a part here and teach the trainer to apply it. Canonical order: base,
kernel extras (`fa2`, `liger`), head (`flce`), compile variant (`cstep` | `cg`), `ac`, sharding, `off`.
The extras come after the base so that every slug written before they existed keeps its spelling.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pretrain_planner.schema import ConfigError

BASES = {
    "naive": "eager attention, no compile, no TF32, no memory saving",
    "fl": (
        "free-lunch: SDPA attention, TF32 where the GPU has it, torch.compile where the model allows, "
        "fused AdamW on CUDA"
    ),
}
CHECKPOINTING = {"ac": "activation checkpointing (recompute each block in backward)"}
SHARDING = {
    "zero1": "DeepSpeed ZeRO-1 (optimizer state sharded)",
    "zero2": "DeepSpeed ZeRO-2 (optimizer state + gradients sharded)",
    "zero3": "DeepSpeed ZeRO-3 (optimizer state + gradients + parameters sharded)",
    "fsdp-grad": "FSDP2, gradients and optimizer state sharded, parameters kept after forward",
    "fsdp-full": "FSDP2, full sharding (parameters resharded after forward)",
    "hsdp": (
        "FSDP2 hybrid sharding (HSDP): full sharding among a node's GPUs, one replica per node; gradients "
        "reduce-scattered inside a node and all-reduced across nodes"
    ),
}
# how much each sharding divides across the ranks (1 optimizer state, 2 + gradients, 3 + parameters), by which
# engine, and DeepSpeed's ZeRO stage: read by the memory model, the search, the trainer and the export
SHARDING_LEVEL = {"zero1": 1, "zero2": 2, "fsdp-grad": 2, "zero3": 3, "fsdp-full": 3, "hsdp": 3}
SHARDING_ENGINE = {"zero1": "zero", "zero2": "zero", "zero3": "zero", "fsdp-grad": "fsdp", "fsdp-full": "fsdp",
                   "hsdp": "fsdp"}  # fmt: skip
HYBRID = ("hsdp",)  # shard among a node's ranks only (their number divides the states), replicate across nodes


def shard_ranks(sharding: str | None, world: int, nodes: int = 1) -> int:
    """The ranks a sharded state is divided among: every rank, or a node's for hybrid sharding (`nodes` unknown, 1:
    every rank, a lower bound on the bytes)."""
    return max(1, world // max(1, nodes)) if sharding in HYBRID else max(1, world)


ZERO_STAGE = {s: level for s, level in SHARDING_LEVEL.items() if SHARDING_ENGINE[s] == "zero"}
OFFLOAD = {"off": "offload optimizer state (and ZeRO-3/FSDP parameters) to CPU memory"}
# Free-lunch extras (need the `fl` base; grid.invalid_reason says where else they are meaningless)
KERNELS = {
    "fa2": 'flash-attn 2 attention (attn_implementation="flash_attention_2"; CUDA, needs the flash-attn package)',
    "liger": "Liger Triton kernels (LayerNorm etc.; CUDA, needs the liger-kernel package)",
}
HEADS = {
    "flce": (
        "fused linear + cross-entropy head: the [tokens x vocab] logits are never held whole "
        "(Liger's kernel on CUDA when installed, else a chunked PyTorch head)"
    ),
}
COMPILE = {
    "cstep": "compile the whole step: the model and the optimizer step (torch.compile)",
    "cg": 'CUDA graphs: torch.compile(mode="reduce-overhead") of the model (CUDA only)',
}

ALL_PARTS = {**KERNELS, **HEADS, **COMPILE, **CHECKPOINTING, **SHARDING, **OFFLOAD}
EXTRA_PARTS = {**KERNELS, **HEADS, **COMPILE}  # the parts that refine the `fl` base


@dataclass(frozen=True)
class Method:
    base: str
    checkpointing: bool = False
    sharding: str | None = None
    offload: bool = False
    # parts added later: defaults keep Method(base, ac, sharding, off) and every old slug as they were
    kernels: tuple[str, ...] = ()  # subset of KERNELS, in KERNELS order
    fused_ce: bool = False  # `flce`
    compile_mode: str | None = None  # one of COMPILE

    def __post_init__(self) -> None:
        order = tuple(k for k in KERNELS if k in self.kernels)
        if set(order) != set(self.kernels) or len(order) != len(self.kernels):
            raise ValueError(f"kernels {self.kernels!r} must be distinct parts of {', '.join(KERNELS)}")
        object.__setattr__(self, "kernels", order)  # one spelling, one Method

    @property
    def extras(self) -> list[str]:
        """The extra parts in canonical order (empty for every method that predates them)."""
        return [
            *self.kernels,
            *(["flce"] if self.fused_ce else []),
            *([self.compile_mode] if self.compile_mode else []),
        ]

    @property
    def flash_attn(self) -> bool:
        return "fa2" in self.kernels

    @property
    def liger(self) -> bool:
        return "liger" in self.kernels

    @property
    def slug(self) -> str:
        parts = [self.base, *self.extras]
        if self.checkpointing:
            parts.append("ac")
        if self.sharding:
            parts.append(self.sharding)
        if self.offload:
            parts.append("off")
        return "+".join(parts)

    @property
    def free_lunch(self) -> bool:
        return self.base == "fl"

    @property
    def family(self) -> str:
        """The base and its throughput levers (the parts that save no memory): the search's method family."""
        return "+".join([self.base, *self.extras])

    @property
    def sharding_level(self) -> int:
        return SHARDING_LEVEL.get(self.sharding or "", 0)

    def describe(self) -> str:
        return "; ".join([BASES[self.base]] + [ALL_PARTS[p] for p in self.slug.split("+")[1:]])


@functools.cache
def parse(slug: str, where: str = "method") -> Method:
    """Parse a slug in any part order; raise ConfigError naming `where` and the allowed parts. Once per slug in a
    process: a Method is immutable, so every caller that asks again gets the same one (a 20k-cell plan asks for
    each of its few methods thousands of times)."""
    parts = [p.strip() for p in slug.split("+")]
    base, rest = parts[0], parts[1:]
    if base not in BASES:
        raise ConfigError(f"{where}: {slug!r} must start with a base method, one of {', '.join(BASES)} (got {base!r})")
    checkpointing, sharding, offload = False, None, False
    kernels: list[str] = []
    fused_ce, compile_mode = False, None
    for p in rest:
        if p in KERNELS and p not in kernels:
            kernels.append(p)
        elif p in HEADS and not fused_ce:
            fused_ce = True
        elif p in COMPILE and compile_mode is None:
            compile_mode = p
        elif p in CHECKPOINTING and not checkpointing:
            checkpointing = True
        elif p in SHARDING and sharding is None:
            sharding = p
        elif p in OFFLOAD and not offload:
            offload = True
        else:
            raise ConfigError(
                f"{where}: {slug!r}: part {p!r} is unknown or repeated; parts after the base are "
                f"{', '.join(ALL_PARTS)} (at most one sharding, at most one of {', '.join(COMPILE)})"
            )
    return Method(base, checkpointing, sharding, offload, tuple(kernels), fused_ce, compile_mode)


def parse_canonical(slug: str) -> Method:
    """Parse a slug read back from a path: it must be in canonical order (one cell, one path)."""
    method = parse(slug)
    if method.slug != slug:
        raise ValueError(f"method slug {slug!r} is not canonical; expected {method.slug!r}")
    return method
