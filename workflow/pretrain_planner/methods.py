"""Training methods as composable slugs: `naive`, `fl`, `fl+ac`, `fl+zero3+off`, ...

A slug is `base[+part...]` in a canonical order, so each method has exactly one path on disk and new
knobs need no rule changes: add a part here and teach the trainer to apply it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import ConfigError

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
}
OFFLOAD = {"off": "offload optimizer state (and ZeRO-3/FSDP parameters) to CPU memory"}

ALL_PARTS = {**CHECKPOINTING, **SHARDING, **OFFLOAD}


@dataclass(frozen=True)
class Method:
    base: str
    checkpointing: bool = False
    sharding: str | None = None
    offload: bool = False

    @property
    def slug(self) -> str:
        parts = [self.base]
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

    def describe(self) -> str:
        return "; ".join([BASES[self.base]] + [ALL_PARTS[p] for p in self.slug.split("+")[1:]])


def parse(slug: str, where: str = "method") -> Method:
    """Parse a slug in any part order; raise ConfigError naming `where` and the allowed parts."""
    parts = [p.strip() for p in slug.split("+")]
    base, rest = parts[0], parts[1:]
    if base not in BASES:
        raise ConfigError(f"{where}: {slug!r} must start with a base method, one of {', '.join(BASES)} (got {base!r})")
    checkpointing, sharding, offload = False, None, False
    for p in rest:
        if p in CHECKPOINTING and not checkpointing:
            checkpointing = True
        elif p in SHARDING and sharding is None:
            sharding = p
        elif p in OFFLOAD and not offload:
            offload = True
        else:
            raise ConfigError(
                f"{where}: {slug!r}: part {p!r} is unknown or repeated; parts after the base are "
                f"{', '.join(ALL_PARTS)} (at most one sharding)"
            )
    return Method(base, checkpointing, sharding, offload)


def parse_canonical(slug: str) -> Method:
    """Parse a slug read back from a path: it must be in canonical order (one cell, one path)."""
    method = parse(slug)
    if method.slug != slug:
        raise ValueError(f"method slug {slug!r} is not canonical; expected {method.slug!r}")
    return method
