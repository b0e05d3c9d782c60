"""DeepSpeed ZeRO-1/-2/-3 (`zero1`, `zero2`, `zero3`), with CPU offload for `+off`.

The engine owns the optimizer, the backward (loss scaling, gradient reduction) and the step, so a
cell under ZeRO uses `DeepSpeedStep`: the trainer marks each micro-batch as an accumulation boundary
or not (`set_gradient_accumulation_boundary`), scales the loss by 1/accumulation itself (as the other
back-ends do) and calls `engine.backward` / `engine.step`. The DeepSpeed config names the micro-batch
and the accumulation, so an engine is built for one micro-batch size (`accepts`).

Optimizer: the recipe's torch optimizer as DeepSpeed's client optimizer; with offload DeepSpeed needs
its own CPU optimizer, so the config names Adam (adam_w_mode per the recipe) and DeepSpeed picks
DeepSpeedCPUAdam (a prebuilt op, see envs/setup.sh).

Device: DeepSpeed takes its GPU from LOCAL_RANK (the engine, zero.Init, ZeRO's helpers), which on a site that
gives each task one GPU is not a valid ordinal; LOCAL_RANK is set to this rank's device index (the trainer's
one rule, parallel.device_index) before anything of DeepSpeed's is built.

ZeRO-3: the model (built on the CPU) is partitioned by `deepspeed.zero.Init(module=...)` one parameter at a
time before the engine exists, so the engine never moves the whole model to the GPU.

Compilation under ZeRO-3 is partial: DeepSpeed's parameter hooks on every submodule are
`torch.compiler.disable`d, so the compiled forward breaks at each hooked module; `compile_observed` records
how many compiled graphs actually ran, and how often one was entered, in a micro-batch.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
from typing import Any

import torch

from pretrain_planner.planning.methods import ZERO_STAGE, Method
from pretrain_planner.planning.settings import Settings
from pretrain_planner.trainer.evidence import Probe, zero_sharding
from pretrain_planner.trainer.parallel import (
    DTYPES,
    Applied,
    _allow_recompiles,
    applied_backends,
    build_optimizer,
    common_setup,
)
from pretrain_planner.trainer.rank import RankEnv, Unsupported
from pretrain_planner.trainer.step import TrainStep

STAGES = ZERO_STAGE  # methods.py: one table of the shardings


def import_deepspeed(env: RankEnv):
    """The deepspeed module for this device, or Unsupported with the reason."""
    # DeepSpeed picks its accelerator at import: make it the one this cell runs on (a CPU cell on a GPU node)
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if env.device.type == "cuda" else "cpu")
    try:
        import deepspeed
    except ImportError as exc:
        raise Unsupported(
            f"DeepSpeed is not installed ({exc}); `bash envs/setup.sh test` installs it with its CPU ops prebuilt"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a broken install raises anything at import (a mismatched
        # pydantic / pydantic-core pair: SystemError; a CUDA extension built for another torch: OSError, ...)
        raise Unsupported(
            f"DeepSpeed is installed but does not import here ({type(exc).__name__}: {exc})"[:500]
        ) from None
    for name in ("DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return deepspeed


def check_supported(method: Method, env: RankEnv) -> None:
    """Raise Unsupported before anything is built if ZeRO cannot run here (the same on every rank). fp16 on a CPU
    is refused before (parallel.precision_setup)."""
    deepspeed = import_deepspeed(env)
    accel = deepspeed.get_accelerator().device_name()
    if accel != env.device.type:
        raise Unsupported(f"DeepSpeed's accelerator is {accel!r} but the cell runs on {env.device.type!r}")
    if method.offload:
        from deepspeed.ops.op_builder import CPUAdamBuilder

        builder = CPUAdamBuilder()
        if not builder.is_compatible(verbose=False):
            raise Unsupported("ZeRO-Offload needs DeepSpeed's cpu_adam op, which cannot be built here")
        try:  # prebuilt (envs/setup.sh) or JIT-built now; a wheel carried from another Python has neither
            builder.load(verbose=False)
        except Exception as exc:  # noqa: BLE001 - a failed JIT build raises anything
            raise Unsupported(
                f"ZeRO-Offload needs DeepSpeed's cpu_adam op, which neither loads nor builds here: "
                f"{type(exc).__name__}: {exc}"[:400]
            ) from None


class DeepSpeedStep(TrainStep):
    def __init__(self, engine, applied: Applied, micro_batch: int, device_type: str, settings: dict[str, Any]):
        super().__init__(applied, engine.optimizer, None, device_type, settings)
        self.engine = engine
        self.micro_batch = micro_batch

    def _new_scaler(self, init_scale=None):
        return None  # the engine scales fp16 losses itself

    def _fp16(self) -> bool:
        return bool(self.engine is not None and self.engine.fp16_enabled())

    def overflow_mark(self) -> Any:
        """The engine's count of skipped steps (fp16 dynamic loss scaling; None otherwise)."""
        return self.engine.skipped_steps if self._fp16() else None

    def was_skipped(self, mark: Any) -> bool:
        return mark is not None and self.engine.skipped_steps > mark

    def loss_scale(self) -> float | None:
        if not self._fp16():
            return None
        scale = getattr(self.engine.optimizer, "loss_scale", None)
        return float(scale) if scale is not None else None

    def grad_sync_options(self) -> tuple[str, ...]:
        return ()  # the engine reduces as its stage does

    def accepts(self, micro_batch: int) -> bool:
        return micro_batch == self.micro_batch

    def _micro(self, batch, scale, sync_grads):
        self.engine.set_gradient_accumulation_boundary(sync_grads)
        loss = self.engine(**batch).loss * scale
        self.engine.backward(loss, scale_wrt_gas=False)
        return loss.detach()

    def optimizer_step(self) -> None:
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()  # clips, steps, zeroes the gradients

    def trial(self, batch, distributed: bool, accumulates: bool = True) -> None:
        # ZeRO reduces (stage 1) or reduce-scatters (2, 3) at boundaries; a trial on a scratch engine
        # keeps every micro-batch a boundary so its state stays consistent (oom.guarded covers the collectives)
        first = self.timed_micro(batch, sync_grads=True)
        self.optimizer_step()
        self.micro(batch, 1.0, sync_grads=True)
        self.trial_micro_s = (first, self.timed_micro(batch, sync_grads=True))

    def reset_after_trial(self) -> None:
        opt = self.engine.optimizer
        if hasattr(opt, "zero_grad"):
            opt.zero_grad()
        self.engine.zero_grad()

    def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            # a scratch engine whose process group was aborted: drop it all the same. Its destroy() then stops at
            # its first log line (DeepSpeed's print_rank_0 asks the aborted group for the rank) before removing its
            # hooks, which autograd holds: they are removed here instead
            try:
                engine.destroy()
            except Exception:  # noqa: BLE001
                remove_zero3_hooks(engine)
            release_zero3_references(getattr(engine, "module", None))
        super().close()


def _lru_cache_in(fn: Any) -> Any:
    """The functools.lru_cache wrapper `fn` is or wraps (DeepSpeed's nvtx decorator keeps it in its closure, without
    functools.wraps), or None."""
    for _ in range(4):
        if fn is None or hasattr(fn, "cache_clear"):
            return fn
        inner = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if callable(c.cell_contents)]
        fn = getattr(fn, "__wrapped__", None) or (inner[0] if inner else None)
    return None


def remove_zero3_hooks(engine: Any) -> int:
    """Remove the hooks a ZeRO-3 engine registered (the optimizer's gradient-accumulation and leaf-module hooks, the
    parameter offload's module hooks), as `destroy()` would have: autograd and the modules hold them, and through
    them the engine. Returns how many were removed."""
    opt = getattr(engine, "optimizer", None)
    offload = getattr(opt, "parameter_offload", None)
    handles = [*(getattr(opt, "_grad_acc_hooks", None) or []), *(getattr(opt, "_leaf_module_hooks", None) or []),
               *(getattr(offload, "forward_hooks", None) or []), *(getattr(offload, "backward_hooks", None) or []),
               getattr(offload, "fwd_pre_hook", None)]  # fmt: skip
    removed = 0
    for handle in handles:
        if handle is not None:
            with contextlib.suppress(Exception):
                handle.remove()
                removed += 1
    return removed


def release_zero3_references(module: torch.nn.Module | None) -> list[str]:
    """Drop what DeepSpeed's ZeRO-3 keeps of a destroyed engine for the rest of the process, so that the engine, its
    model, its optimizer's partitions and states and its process groups can be freed (`engine.destroy()` leaves both):

    - `PartitionedParameterCoordinator.__params_to_release` is an `lru_cache` on a method, shared by every
      coordinator and keyed by the coordinator and each submodule: it is cleared (a memo; a live engine refills it);
    - `parameter_offload.FWD_MODULE_STACK`, onto which each engine pushes its model (and a forward that raised, an
      out-of-memory trial, leaves its submodules): `module` and its submodules are taken off.

    Without this every micro-batch trial's engine stayed in memory under the next trial and the timed build: 41 MB
    of tensors were left after a tiny-gptneox cell on two CPU ranks, and on a GPU each leaked engine keeps its share
    of the fp32 weights and Adam states on the device. Returns what was released."""
    import sys

    done = []
    coordinator = getattr(sys.modules.get("deepspeed.runtime.zero.partitioned_param_coordinator"),
                          "PartitionedParameterCoordinator", None)  # fmt: skip
    cached = _lru_cache_in(getattr(coordinator, "_PartitionedParameterCoordinator__params_to_release", None))
    if cached is not None:
        cached.cache_clear()
        done.append("PartitionedParameterCoordinator.__params_to_release cache")
    stack = getattr(sys.modules.get("deepspeed.runtime.zero.parameter_offload"), "FWD_MODULE_STACK", None)
    if module is not None and isinstance(stack, list):
        owned = {id(m) for m in module.modules()}
        kept = [m for m in stack if id(m) not in owned]
        if len(kept) < len(stack):
            done.append(f"{len(stack) - len(kept)} of FWD_MODULE_STACK")
        stack[:] = kept
    return done


def deepspeed_device(env: RankEnv) -> str:
    """Make DeepSpeed use this rank's device: it reads LOCAL_RANK as the GPU ordinal everywhere, so LOCAL_RANK
    becomes the device index of the one device rule (the task's local rank stays in RankEnv)."""
    if env.device.type != "cuda":
        return env.device.type
    os.environ["LOCAL_RANK"] = str(env.device.index)
    return f"cuda:{env.device.index} (LOCAL_RANK={env.device.index} for DeepSpeed; task local rank {env.local_rank})"


def _offload_device(offload_config) -> str | None:
    device = getattr(offload_config, "device", None)
    device = getattr(device, "value", device)
    return None if device in (None, "none") else str(device)


def _settings(
    method: Method,
    s: Settings,
    env: RankEnv,
    engine: Any,
    compiled: bool,
    attn_used: str | None,
    opt_settings: dict[str, Any] | None,
    build_note: str,
    device: str,
) -> dict[str, Any]:
    """What a ZeRO cell records of its method: the engine's own view of the stage, offload, precision and
    compilation, the DeepSpeed config it ran, and the optimizer."""
    config, precision = s.deepspeed_config, s.precision
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    if opt_settings is None:
        p = config["optimizer"]["params"]
        opt_settings = {
            "optimizer": type(base).__name__,
            "optimizer_note": f"DeepSpeed config: Adam, adam_w_mode={p['adam_w_mode']}",
            "fused_optimizer": False,
            **{k: v for k, v in p.items() if k != "adam_w_mode"},
        }
    return {
        **s.as_dict(),  # the planned settings, each overwritten below by what the engine reports
        "deepspeed_config": config,
        "base": method.base,
        "attn_implementation": attn_used,
        "compile": bool(compiled and getattr(engine, "is_compiled", False)),
        "compile_note": (
            "DeepSpeedEngine.compile(compile_kwargs={'dynamic': False})"
            + (
                "; partial: ZeRO-3's parameter hooks are excluded from compilation, the graph breaks at every "
                "hooked module (compile_observed)"
                if STAGES[method.sharding] == 3
                else ""
            )
            if compiled
            else None
            if not method.free_lunch
            else "model does not support torch.compile"
        ),
        "compile_mode": "default" if compiled and getattr(engine, "is_compiled", False) else None,
        **applied_backends(env),
        "autocast": None,
        "grad_scaler": "DeepSpeed dynamic loss scaling" if engine.fp16_enabled() else None,
        "activation_checkpointing": method.checkpointing,
        "parallel": "deepspeed",
        "ddp": None,
        "deepspeed": {
            "version": importlib.metadata.version("deepspeed"),
            "config": config,
            "zero_stage": engine.zero_optimization_stage(),
            "precision": {
                "fp32": "fp32 weights and optimizer",
                "bf16": "bf16 model weights and compute, fp32 master weights and optimizer state",
                "fp16": "fp16 model weights and compute, fp32 master weights, dynamic loss scaling",
            }[precision],
            "optimizer_source": (
                "DeepSpeed config (ZeRO-Offload)" if method.offload else "client (the recipe's torch optimizer)"
            ),
            "offload_optimizer": _offload_device(engine.zero_offload_optimizer()),
            "offload_param": _offload_device(engine.zero_offload_param()),
            "accumulation": "engine.backward / engine.step, boundary set per micro-batch; loss scaled 1/accum",
            "device": device,
            "build": build_note,
            **zero_sharding(engine),
        },
        "device": env.device.type,
        "torch_threads": torch.get_num_threads(),
        **opt_settings,
    }


def _to_16bit(net: torch.nn.Module, precision: str) -> None:
    """The weights in the recipe's 16-bit dtype before ZeRO-3 partitions them: `zero.Init(module=...)` partitions a
    built model's weights as they are, and the engine then leaves a ZeRO-3 model's weights uncast, so an fp32 model
    would train in fp32 with a bf16/fp16 config. Parameters only: buffers (rotary frequencies) stay fp32, as the
    engine's own cast leaves them."""
    dtype = DTYPES[precision]
    if dtype is not None:
        for p in net.parameters():
            p.data = p.data.to(dtype)


def build_step(method: Method, s: Settings, env: RankEnv, net: torch.nn.Module, attn_used: str | None) -> DeepSpeedStep:
    """The engine for the settings' DeepSpeed config (one micro-batch size: `accepts`)."""
    deepspeed = import_deepspeed(env)
    device = deepspeed_device(env)
    common_setup(s, env, net)  # the engine casts bf16/fp16 itself: no autocast
    config = s.deepspeed_config
    build_note = "built on the CPU; the engine moves it to the device"
    if STAGES[method.sharding] == 3:
        # partition parameter by parameter now (a param on the GPU at a time, broadcast from rank 0): with
        # ds_id on every parameter, the engine does not move the whole module to the GPU. DeepSpeed's comm must
        # wrap the process group first (deepspeed.initialize would), or the config is checked against 1 rank.
        deepspeed.init_distributed()
        _to_16bit(net, s.precision)
        deepspeed.zero.Init(module=net, config_dict_or_path=config, mem_efficient_linear=False)
        build_note = "built on the CPU; partitioned by deepspeed.zero.Init(module=...) one parameter at a time"
    optimizer = opt_settings = None
    if not method.offload:
        optimizer, opt_settings = build_optimizer(s, net.parameters())
    engine, *_ = deepspeed.initialize(
        model=net, optimizer=optimizer, config=config, model_parameters=None if optimizer else net.parameters()
    )
    compiled = s.compile
    if compiled:
        _allow_recompiles()
        engine.compile(compile_kwargs={"dynamic": False})
    probe = None if compiled else Probe.on(net)
    settings = _settings(method, s, env, engine, compiled, attn_used, opt_settings, build_note, device)
    applied = Applied(engine, net, None, None, {}, probe, s.grad_scaler is not None, True)
    return DeepSpeedStep(engine, applied, config["train_micro_batch_size_per_gpu"], env.device.type, settings)
