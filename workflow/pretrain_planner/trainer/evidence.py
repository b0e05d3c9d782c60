"""Evidence that a method is in effect, recorded in the cell's method_settings.

A probe watches one block for one micro-batch (forward + backward) of the first warm-up step, then
removes itself: activation checkpointing shows as the block running its forward twice (the recompute in
backward); FSDP's `reshard_after_forward` shows as the block's parameters being sharded (DTensor shards)
or not right after its forward; ZeRO-3 as the parameters' partition status after the forward.
"""

from __future__ import annotations

from typing import Any

import torch


def _has_params(module: torch.nn.Module) -> bool:
    return next(module.parameters(recurse=False), None) is not None


def _param_state(module: torch.nn.Module) -> str | None:
    p = next(module.parameters(recurse=False), None)
    if p is None:
        p = next(module.parameters(), None)
    if p is None:
        return None
    if hasattr(p, "ds_status"):  # DeepSpeed ZeRO-3 parameter
        return f"zero3:{p.ds_status.name}"
    from torch.distributed.tensor import DTensor

    return "sharded" if isinstance(p, DTensor) else "unsharded"


class Probe:
    def __init__(self, name: str, block: torch.nn.Module) -> None:
        self.name, self.block = name, block
        self.calls = 0
        self.after_forward: list[str | None] = []
        self.per_micro: int | None = None
        # Calls are counted on the block's first leaf module with parameters: transformers checkpoints the
        # block's `forward`, not its `__call__` (the block's own hooks stay outside the recompute), and the
        # recompute stops early once the tensors backward needs are back (the first layer always is).
        self.leaf_name, leaf = next(
            ((n, m) for n, m in block.named_modules() if n and not any(True for _ in m.children()) and _has_params(m)),
            ("", block),
        )
        self._handles = [leaf.register_forward_pre_hook(self._count), block.register_forward_hook(self._after)]

    @classmethod
    def on(cls, net: torch.nn.Module) -> Probe | None:
        """A probe on the model's first checkpointing layer (what activation checkpointing recomputes), or
        else its first outermost repeated block; None if it has neither."""
        from pretrain_planner.trainer.models import blocks

        found = blocks(net)  # innermost first, outermost last; each depth in the model's order
        if not found:
            return None
        try:
            from transformers.modeling_layers import GradientCheckpointingLayer

            layers = [(n, m) for n, m in found if isinstance(m, GradientCheckpointingLayer)]
        except ImportError:
            layers = []
        if layers:
            name, block = min(layers, key=lambda nm: nm[0].count("."))
        else:
            depth = min(n.count(".") for n, _ in found)
            name, block = next((n, m) for n, m in found if n.count(".") == depth)
        return cls(f"{name} ({type(block).__name__})", block)

    def _count(self, module, args) -> None:
        self.calls += 1

    def _after(self, module, args, output) -> None:
        self.after_forward.append(_param_state(module))

    def watch(self, fn):
        """Run `fn` (one micro-batch) while counting, then detach for good."""
        before = self.calls
        try:
            return fn()
        finally:
            self.per_micro = self.calls - before
            self.detach()

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.block = None

    def report(self) -> dict[str, Any]:
        return {
            "block": self.name,
            "counted_module": f"{self.name.split(' ')[0]}.{self.leaf_name}".rstrip("."),
            "forward_calls_per_micro_batch": self.per_micro,
            # the first entry is the forward; a second one (if any) the recompute in backward
            "param_state_after_forward": self.after_forward[0] if self.after_forward else None,
        }


def fsdp_sharding(net: torch.nn.Module) -> dict[str, Any]:
    """How much of each parameter this rank holds: about 1/world for FSDP2 (DTensor Shard(0))."""
    from torch.distributed.tensor import DTensor

    local = total = dtensors = count = 0
    placements, devices = set(), set()
    for p in net.parameters():
        count += 1
        total += p.numel()
        if isinstance(p, DTensor):
            dtensors += 1
            local += p.to_local().numel()
            placements.add(str(tuple(p.placements)))
            devices.add(str(p.to_local().device))
        else:
            local += p.numel()
            devices.add(str(p.device))
    return {
        "params": count,
        "dtensor_params": dtensors,
        "placements": sorted(placements),
        "global_numel": total,
        "local_numel": local,
        "sharded_param_fraction": local / total if total else None,
        "param_devices": sorted(devices),
    }


def zero_sharding(engine: Any) -> dict[str, Any]:
    """What this rank holds under DeepSpeed: ZeRO-3 parameter partitions, and the optimizer's fp32 partition."""
    out: dict[str, Any] = {}
    params = list(engine.module.parameters())
    total = sum(getattr(p, "ds_numel", p.numel()) for p in params)
    out["global_numel"] = total
    if any(hasattr(p, "ds_tensor") for p in params):
        local = sum(p.ds_tensor.numel() for p in params if hasattr(p, "ds_tensor"))
        out["param_partition_numel"] = local
        out["sharded_param_fraction"] = local / total if total else None
        out["param_partition_devices"] = sorted({str(p.ds_tensor.device) for p in params if hasattr(p, "ds_tensor")})
    opt = engine.optimizer
    fp32 = None
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition"):
        groups = getattr(opt, attr, None)
        if groups:
            fp32 = [t for t in groups if isinstance(t, torch.Tensor)]
            break
    if fp32:
        numel = sum(t.numel() for t in fp32)
        out["optimizer_fp32_partition_numel"] = numel
        out["optimizer_state_fraction"] = numel / total if total else None
        out["optimizer_state_devices"] = sorted({str(t.device) for t in fp32})
    out["zero_optimizer"] = type(opt).__name__
    base = getattr(opt, "optimizer", None)
    out["base_optimizer"] = type(base).__name__ if base is not None else None
    return out
