"""What a rank of a real trainer engine holds, measured (tests/test_memory.py; benchmarks/memory_bounds.py).

Each rank builds the benchmark's own step for a method (trainer.run.make_builder: DDP or one rank, FSDP2, DeepSpeed
ZeRO-1/2/3, offload) and runs two optimizer steps of `accum` micro-batches. During the second step it sums the bytes
of every parameter, gradient, optimizer-state and flat-buffer tensor the rank can reach, each storage once, at four
instants:

- `forward_first` / `forward_accumulating`: the end of the forward of the step's first / second micro-batch (a
  forward hook on the model that runs before the engine's own post-forward hooks: FSDP2 and ZeRO-3 still hold the
  parameters they gathered), where a micro-batch's activations peak;
- `step`: inside the optimizer step, just before the update (a step pre-hook on the torch optimizer the engine
  drives), where the gradients and their fp32 partitions are held;
- `after`: after the step.

The tensors are reached from the model (parameters, their gradients, ZeRO-3's partitions), from the optimizer
(recursively through its attributes: DeepSpeed's flat buffers, partitions, buckets; the torch optimizer's states)
and from FSDP2's parameter groups (sharded and unsharded parameters, accumulated gradients); buffers (rotary
caches, position ids) are not model states and are left out. A storage resized to nothing (FSDP2 frees that way)
counts nothing. DDP keeps its gradient buckets in its C++ reducer: the walk sees them through the gradients, which
are views of the buckets (gradient_as_bucket_view), when the gradients exist; `bucket_persists` records that the
next step's gradients are views of the same storage (so the buckets were held across the step).

On CPU every tensor is on the one device: with offload the walk's total is the sum of what a GPU run splits between
the GPU and the host.
"""

from __future__ import annotations

import types
from typing import Any

ENGINES = ("torch.", "deepspeed.")  # whose objects the walk enters
SKIP_TYPES = ("ProcessGroup", "Stream", "Event", "Work", "DeviceMesh", "Logger", "Lock")


def _local(t):
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def _reach(obj: Any, out: dict[int, Any], seen: set[int], depth: int) -> None:
    """Every tensor reachable from `obj` through attributes, containers and dataclass slots, to `depth` levels;
    nn.Modules are not entered (the model's parameters are walked separately, its buffers are not states)."""
    import torch

    if depth < 0 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out[id(obj)] = obj
        grad = obj.grad if obj.is_leaf else None
        if grad is not None:
            out[id(grad)] = grad
        for attr in ("ds_tensor", "_local_tensor"):
            inner = getattr(obj, attr, None)
            if isinstance(inner, torch.Tensor):
                _reach(inner, out, seen, depth)
        return
    if isinstance(obj, dict):
        items = list(obj.keys()) + list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = list(obj)
    elif isinstance(obj, torch.nn.Module) or type(obj).__name__ in SKIP_TYPES:
        return
    elif not type(obj).__module__.startswith(ENGINES) or isinstance(obj, (types.ModuleType, types.FunctionType)):
        return  # only the engines' own objects (not Python modules, functions, transformers' registries)
    else:
        items = list(getattr(obj, "__dict__", {}).values())
        for slot in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, slot):
                items.append(getattr(obj, slot))
    for item in items:
        _reach(item, out, seen, depth - 1)


def held_bytes(net, optimizer) -> dict[str, int]:
    """Bytes of the storages of every model-state tensor reachable from the model and the optimizer, each storage
    once, by kind (parameters and their partitions; gradients; the rest: optimizer states and flat buffers)."""
    import torch

    kinds: dict[str, dict[int, Any]] = {"params": {}, "grads": {}, "other": {}}
    seen: set[int] = set()
    for p in net.parameters():
        for t in (p, getattr(p, "ds_tensor", None)):
            if isinstance(t, torch.Tensor):
                kinds["params"][id(t)] = _local(t)
        if p.grad is not None:
            kinds["grads"][id(p.grad)] = _local(p.grad)
    roots: list[Any] = [optimizer]
    for module in net.modules():
        state = getattr(module, "_get_fsdp_state", None)
        if state is not None:
            roots.append(state()._fsdp_param_group)
    other: dict[int, Any] = {}
    for root in roots:
        _reach(root, other, seen, 8)
    kinds["other"] = {k: v for k, v in other.items() if k not in kinds["params"] and k not in kinds["grads"]}
    counted: set[tuple[int, str]] = set()
    out = {}
    for kind, tensors in kinds.items():
        total = 0
        for t in tensors.values():
            t = _local(t)
            if t.is_meta:
                continue
            storage = t.untyped_storage()
            key = (storage.data_ptr(), str(t.device))
            if storage.nbytes() == 0 or key in counted:
                continue
            counted.add(key)
            total += storage.nbytes()
        out[kind] = total
    out["total"] = sum(out.values())
    return out


def _torch_optimizer(step):
    """The torch optimizer whose step is the update: the engine's inner one under DeepSpeed."""
    engine = getattr(step, "engine", None)
    if engine is not None:
        return engine.optimizer.optimizer
    return step.optimizer


def measure(payload: dict[str, Any]) -> dict[str, Any]:
    """Every method of `payload["methods"]` on this rank, one after the other on one process group: per method the
    bytes held at the four instants of a step (module docstring)."""
    from pretrain_planner.trainer.rank import close_rank, init_rank

    from .rank_workers import run_config

    world, model, precision = payload["world"], payload["model"], payload.get("precision")
    # a sharded method's group (on one rank the engines need one that an unsharded cell would not start)
    first = max(payload["methods"], key=lambda m: "zero" in m or "fsdp" in m)
    env = init_rank(run_config(model, first, world, precision=precision)[0])
    try:
        return {m: _measure_one(env, model, m, world, precision, payload) for m in payload["methods"]}
    finally:
        close_rank(env)


def _measure_one(env, model: str, method: str, world: int, precision: str | None, payload: dict) -> dict[str, Any]:
    import gc

    import torch
    from pretrain_planner.planning.flops import param_count
    from pretrain_planner.trainer.measure import batches_for
    from pretrain_planner.trainer.run import make_builder

    from .rank_workers import run_config

    accum, mb = payload.get("accum", 2), payload.get("micro_batch", 2)
    cfg, spec = run_config(model, method, world, precision=precision)
    out: dict[str, Any] = {"params_formula": param_count(spec["model"])}
    step = make_builder(cfg, env, [])(mb, accum)
    net = step.applied.raw
    engine = getattr(step, "engine", None)
    opt_root = engine.optimizer if engine is not None else step.optimizer
    # every parameter's global size (ZeRO-3's ds_numel; a DTensor's numel is global)
    out["params_numel"] = sum(getattr(p, "ds_numel", 0) or p.numel() for p in net.parameters())
    batches = batches_for(cfg, env, mb, accum)
    recording: dict[str, Any] = {"on": False, "micro": 0}

    def after_forward(module, args, kwargs, output):
        if recording["on"]:
            name = "forward_first" if recording["micro"] == 0 else "forward_accumulating"
            out.setdefault(name, held_bytes(net, opt_root))

    def before_update(optimizer, args, kwargs):
        if recording["on"]:
            out.setdefault("step", held_bytes(net, opt_root))

    hooks = [
        net.register_forward_hook(after_forward, prepend=True, with_kwargs=True),
        _torch_optimizer(step).register_step_pre_hook(before_update),
    ]
    grad_storages = []
    for n in range(3):
        recording["on"] = n == 1
        for i in range(accum):
            recording["micro"] = i
            step.micro(batches[i], 1.0 / accum, sync_grads=i == accum - 1)
        grads = {_local(p.grad).untyped_storage().data_ptr() for p in net.parameters() if p.grad is not None}
        grad_storages.append(sorted(grads))
        step.optimizer_step()
        if n == 1:
            out["after"] = held_bytes(net, opt_root)
    # DDP's buckets: the gradients of consecutive steps are views of the same storage, held by the reducer between
    out["bucket_persists"] = bool(grad_storages[1]) and grad_storages[1] == grad_storages[2]
    out["dtypes"] = sorted({str(p.dtype).replace("torch.", "") for p in net.parameters()})
    out["parallel"] = step.settings.get("parallel")
    for h in hooks:
        h.remove()
    step.close()
    del step, engine
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    return out
