"""FSDP2 (`fully_shard`): one FSDP unit per transformer block, then the root.

`fsdp-grad` keeps a block's parameters gathered from its forward to its backward
(`reshard_after_forward=False`, ZeRO-2-like: gradients and optimizer state sharded); `fsdp-full` frees
them after the forward and gathers them again in backward (`True`, ZeRO-3-like). Gradients are
reduce-scattered on every micro-batch, so they stay sharded during accumulation. The recipe's bf16/fp16
becomes a MixedPrecisionPolicy (parameters cast for compute, gradients reduced in fp32) instead of
autocast; `+off` adds CPUOffloadPolicy (sharded parameters, gradients and the optimizer step on CPU).
Under free-lunch each block is compiled before it is sharded (torchtitan's order).

No rank ever holds the whole model on its GPU: rank 0 builds it on the CPU (the seeded weights every method
starts from), the other ranks build a skeleton on the meta device (no memory); `fully_shard` then moves one
block at a time to the GPU and keeps this rank's shard, and the skeletons get rank 0's weights one tensor
at a time (`set_model_state_dict(..., broadcast_from_rank0=True)`, buffers broadcast too).

Gradients are reduce-scattered on the last micro-batch of a step only (`Applied.no_sync`:
`set_requires_gradient_sync(False)` before, unsharded gradients accumulate in fp32 between) or, where that
does not fit, on every micro-batch (`grad_sync: every`, see step.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from pretrain_planner.planning.methods import Method
from pretrain_planner.planning.settings import Settings
from pretrain_planner.trainer.evidence import fsdp_sharding
from pretrain_planner.trainer.models import blocks
from pretrain_planner.trainer.rank import RankEnv, Unsupported


def _tied_outside(net: torch.nn.Module, found: list[tuple[str, torch.nn.Module]]) -> dict[str, str]:
    """Blocks holding a parameter that is also used outside them (tied embeddings): FSDP needs such
    parameters in one group, so they stay with the root. Maps block name -> the name of the other use."""
    names_of: dict[int, list[str]] = {}
    for name, p in net.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    tied = {}
    for block_name, block in found:
        for p in block.parameters():
            outside = [n for n in names_of[id(p)] if not n.startswith(block_name + ".")]
            if outside:
                tied[block_name] = outside[0]
                break
    return tied


def _outermost(found: list[tuple[str, torch.nn.Module]]) -> list[tuple[str, torch.nn.Module]]:
    names = [n for n, _ in found]
    return [(n, m) for n, m in found if not any(n.startswith(o + ".") for o in names)]


def shard(
    method: Method, s: Settings, env: RankEnv, net: torch.nn.Module, autocast_dtype: torch.dtype | None
) -> tuple[torch.nn.Module, torch.dtype | None, dict[str, Any]]:
    """Shard `net` in place by the settings' fsdp_policy and compile; return it, the autocast dtype still to use
    (None: the policy casts), settings."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    except ImportError:  # torch < 2.6
        raise Unsupported(
            f"FSDP2 (torch.distributed.fsdp.fully_shard) is not available in torch {torch.__version__}"
        ) from None
    policy, compiled = s.fsdp_policy, s.compile
    reshard = policy["reshard_after_forward"]
    mp_note = None
    if autocast_dtype is not None and policy["mixed_precision"] is None:
        # inductor's C++ backend miscompiles kernels over bf16 parameters (torch 2.13: "conflicting
        # declaration 'auto at_BFloat16_tmp_acc0_vec'"); autocast over fp32 parameters compiles fine
        mp_note = "compiled on CPU: autocast over fp32 parameters (inductor's C++ backend fails on bf16 parameters)"
    use_policy = policy["mixed_precision"] is not None
    mp = (
        MixedPrecisionPolicy(param_dtype=autocast_dtype, reduce_dtype=torch.float32)
        if use_policy
        else MixedPrecisionPolicy()
    )
    pin = policy["pin_memory"]
    offload = CPUOffloadPolicy(pin_memory=pin) if policy["cpu_offload"] else OffloadPolicy()
    skeleton = any(p.is_meta for p in net.parameters())
    # rank 0's weights, kept on the CPU until the other ranks have theirs (fully_shard replaces the parameters'
    # data by their GPU shards; these references keep the CPU copies)
    full = dict(net.state_dict()) if env.distributed and not skeleton else None
    if skeleton and not env.distributed:
        raise ValueError("a model built on the meta device needs rank 0 of a multi-rank run to get its weights")
    hybrid = policy.get("mesh")  # hsdp: a 2-D mesh, a replica per node (dim 0), sharded among its ranks (dim 1)
    shape = [hybrid["replicate"], hybrid["shard"]] if hybrid else [env.world_size]
    if hybrid and hybrid["replicate"] * hybrid["shard"] != env.world_size:
        raise ValueError(f"hsdp's mesh {hybrid} does not cover the {env.world_size} ranks")
    dims = ["replicate", "shard"] if hybrid else ["shard"]
    mesh = init_device_mesh(env.device.type, tuple(shape), mesh_dim_names=tuple(dims) if hybrid else None)
    candidates = blocks(net)
    tied = _tied_outside(net, candidates)
    found = [(n, m) for n, m in candidates if n not in tied]
    if compiled:
        for _, block in _outermost(found):
            block.compile(dynamic=False)
    wrapped: Counter[str] = Counter()
    for _, block in found:
        wrapped[type(block).__name__] += 1
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)
    root = type(net).__name__
    fully_shard(net, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)
    if env.distributed:
        _weights_from_rank0(net, full, env, offload=method.offload)
        del full
    settings = {
        "parallel": "fsdp2",
        "fsdp": {
            "api": "torch.distributed.fsdp.fully_shard (FSDP2)",
            "reshard_after_forward": reshard,
            "sharded_modules": dict(wrapped),
            "left_to_root": {n: f"parameter tied with {other}" for n, other in tied.items()},
            "root": root,
            "wrap_rule": "modules named in the model's _no_split_modules, and its GradientCheckpointingLayers; "
            "then the root",
            "mesh": {"device_type": env.device.type, "shape": shape, "dims": dims},
            "mixed_precision": (
                {"param_dtype": str(autocast_dtype).replace("torch.", ""), "reduce_dtype": "float32"}
                if use_policy
                else None
            ),
            "mixed_precision_note": mp_note,
            "offload": {"policy": "CPUOffloadPolicy", "pin_memory": pin} if method.offload else None,
            "gradient_sync": "reduce-scatter on the last micro-batch of a step (set_requires_gradient_sync(False) "
            "before it)",
            "grad_sync": "last",
            "build": (
                "rank 0 on the CPU, the other ranks on the meta device; sharded block by block, then rank 0's "
                "weights broadcast tensor by tensor"
                if env.distributed
                else "on the CPU, sharded block by block (no whole-model copy on the GPU)"
            ),
            "compile": "per block, before sharding" if compiled else None,
            **fsdp_sharding(net),
        },
    }
    return net, None if use_policy else autocast_dtype, settings


def _weights_from_rank0(
    net: torch.nn.Module, full: dict[str, torch.Tensor] | None, env: RankEnv, offload: bool
) -> None:
    """Every rank, after fully_shard: the sharded parameters and all buffers get rank 0's values. A skeleton
    (meta) first gets memory: parameter shards where FSDP keeps them (the CPU with offload, else the GPU),
    buffers on the GPU."""
    import torch.distributed as torch_dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if full is None:
        net.to_empty(device=torch.device("cpu") if offload else env.device)
        for module in net.modules():
            for name, buf in module._buffers.items():
                if buf is not None and buf.device != env.device:
                    module._buffers[name] = torch.empty_like(buf, device=env.device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(net, full if full is not None else {}, options=options)
    with torch.no_grad():
        for _, buf in sorted(net.named_buffers(), key=lambda nb: nb[0]):  # non-persistent ones too
            torch_dist.broadcast(buf, src=0)
