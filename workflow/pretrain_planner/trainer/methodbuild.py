"""The one build path of a model with its method, for a benchmark cell (trainer/run.py, once per micro-batch size
it tries), the train stage and the budget stage: `check` (the method's validity, RunSpec.reason, then what only
this host can tell: the recipe's precision on this device, packages, the device's capability, DeepSpeed) and
`build` (the concrete settings resolved once, planning.settings.resolve with the real micro-batch and
accumulation, then applied: `parallel.apply_method` (one rank, DDP, FSDP2 fsdp-grad / fsdp-full with `off` =
CPUOffloadPolicy, activation checkpointing, free-lunch, `cg`), `parallel.build_optimizer`, `zero.build_step`
(DeepSpeed ZeRO-1/2/3, `off` = ZeRO-Offload) and `step.TrainStep` (`cstep`), with the model-level extras of
`build_with_extras` (`fa2`, `liger`, `flce`)).

What a run that trains for real uses of the result (`Built`): the learning rate set every step by the loop's
schedule (`set_lr`), a checkpoint that resumes (`state_dicts` / `load_state_dicts`: FSDP2 as full state dicts,
written once by rank 0 and loadable at any world size; DeepSpeed through the engine's own sharded checkpoint)
and full weights for model folders (`full_state`). A part that cannot run where the job runs fails before
anything is built (`Unsupported`; a stage's `MethodError` names where its method came from), never silently
skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pretrain_planner.planning.methods import SHARDING_ENGINE
from pretrain_planner.planning.runspec import RunSpec
from pretrain_planner.planning.settings import resolve
from pretrain_planner.trainer import kernels, zero
from pretrain_planner.trainer.models import build_model, kernel_info, model_class
from pretrain_planner.trainer.parallel import apply_method, build_optimizer, precision_setup
from pretrain_planner.trainer.rank import RankEnv, Unsupported
from pretrain_planner.trainer.step import TrainStep
from pretrain_planner.versions import installed_version

# The compiled AdamW step divides by the step size (eps / step_size, with a tensor lr): lr 0 (the first step of
# the warm-up) would give NaN weights. The floor moves a weight by about 1e-12: nothing.
CSTEP_MIN_LR = 1e-12


class MethodError(RuntimeError):
    """The method (with the recipe's precision) cannot run where a stage's job runs."""


def check(spec: RunSpec, env: RankEnv) -> None:
    """Raise Unsupported, the same on every rank and before anything is built or any collective, if the run
    cannot run here: the method's own validity (RunSpec.reason, the grid's), then the host's."""
    why = spec.reason()
    if why:
        raise Unsupported(why)
    method, model = spec.method, spec.model.to_dict()
    precision_setup(spec.model.recipe.precision, env)
    kernels.check_supported(method, env.device)
    if method.flash_attn and not getattr(model_class(model), "_supports_flash_attn", False):
        raise Unsupported(f"fa2: transformers has no flash-attn 2 path for {model_class(model).__name__}")
    if method.sharding in zero.STAGES:
        zero.check_supported(method, env)


def check_stage(spec: RunSpec, env: RankEnv, where: str) -> None:
    """`check` for a stage's run: MethodError naming where the method came from and the device."""
    try:
        check(spec, env)
    except Unsupported as exc:
        raise MethodError(f"{where} {spec.method.slug!r} (precision {spec.model.recipe.precision}) cannot run on "
                          f"{env.device}: {exc}") from None  # fmt: skip


def build_with_extras(
    model: dict[str, Any], method: Any, attn: str | None, fused_ce: str | None, seed: int, meta: bool = False
) -> tuple[torch.nn.Module, str | None, dict[str, Any]]:
    """A fresh model (`seed`: the same weights on every rank and for every method) with the method's
    model-level extras (fused linear + CE head, Liger kernels, flash-attn); also what each extra used.
    `meta`: a skeleton on the meta device, no memory (FSDP2 ranks other than 0 get rank 0's weights). The
    random state is reseeded after the build, so dropout draws the same whether weights were drawn or not."""
    torch.manual_seed(seed)
    with torch.device("meta") if meta else contextlib.nullcontext():
        net, attn_used = build_model(model, attn, fused_ce=method.fused_ce)
    torch.manual_seed(seed)
    extras: dict[str, Any] = {}
    if fused_ce:
        net.fused_ce_impl = fused_ce
        extras["fused_ce"] = (
            "liger_kernel LigerFusedLinearCrossEntropyLoss"
            if fused_ce == "liger"
            else "trainer.heads.ChunkedLinearCrossEntropy (PyTorch, chunked, gradients in forward)"
        )
    if method.liger:
        extras["liger"] = kernels.apply_liger(net)
    if method.flash_attn:
        extras["flash_attn_version"] = installed_version("flash-attn")
    return net, attn_used, extras


@dataclass
class Built:
    step: TrainStep  # micro(), optimizer_step(); DeepSpeedStep under ZeRO
    net: torch.nn.Module  # the model itself (sharded in place under FSDP2; the engine's module under ZeRO)
    settings: dict[str, Any]
    engine: Any = None  # DeepSpeed
    # seconds of the build's two parts, the device synchronised around each: "model_build_s" (the model from its
    # config, with its model-level extras) and "method_wrap_s" (the method applied to it: DDP / FSDP2 / the optimizer
    # / TrainStep / a compiled optimizer step, or DeepSpeed's engine); also on the step (`step.build_timings`)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """What validation runs under (None: fp32, or the FSDP policy / DeepSpeed engine casts)."""
        return self.step.applied.autocast_dtype

    @property
    def fsdp(self) -> bool:
        return self.settings.get("parallel") == "fsdp2"

    def set_lr(self, lr: float) -> None:
        """The schedule's learning rate on every parameter group (the engine's optimizer's under ZeRO)."""
        opt = self.engine.optimizer if self.engine is not None else self.step.optimizer
        for g in opt.param_groups:
            if isinstance(g["lr"], torch.Tensor):  # cstep: a tensor, so the compiled step does not recompile
                g["lr"].fill_(max(lr, CSTEP_MIN_LR))
            else:
                g["lr"] = lr

    # -- checkpoints ---------------------------------------------------------------------------------------
    def state_dicts(self, ds_dir: Path, tag: str) -> dict[str, Any]:
        """Every rank calls (collectives under FSDP2 / ZeRO); rank 0's return value goes into checkpoint.pt."""
        if self.engine is not None:
            self.engine.save_checkpoint(str(ds_dir), tag=tag, save_latest=False)
            return {"deepspeed_tag": tag}
        opt = self.step.optimizer
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
                get_optimizer_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return {
                "model": get_model_state_dict(self.net, options=options),
                "optimizer": get_optimizer_state_dict(self.net, opt, options=options),
                "state_dict_format": "full (torch.distributed.checkpoint.state_dict)",
            }
        return {"model": self.net.state_dict(), "optimizer": opt.state_dict()}

    def load_state_dicts(self, ck: dict[str, Any], ds_dir: Path) -> None:
        """Every rank: the weights and optimizer state of checkpoint.pt (or the engine's checkpoint it names)."""
        if self.engine is not None:
            path, _ = self.engine.load_checkpoint(
                str(ds_dir), tag=ck["deepspeed_tag"], load_optimizer_states=True, load_lr_scheduler_states=False
            )
            if path is None:
                raise RuntimeError(f"DeepSpeed checkpoint {ds_dir}/{ck['deepspeed_tag']} did not load")
            return
        opt = self.step.optimizer
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(self.net, ck["model"], options=options)
            set_optimizer_state_dict(self.net, opt, ck["optimizer"], options=options)
            return
        self.net.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])

    def prune_deepspeed(self, ds_dir: Path, keep: str) -> None:
        """Rank 0, after checkpoint.pt names `keep`: drop the engine's older checkpoints."""
        if self.engine is None or not ds_dir.is_dir():
            return
        for d in ds_dir.iterdir():
            if d.is_dir() and d.name != keep:
                shutil.rmtree(d, ignore_errors=True)

    def full_state(self) -> dict[str, torch.Tensor] | None:
        """Every rank calls; the model's full weights on CPU (rank 0; others may get None). None from the
        plain path means: the model itself holds them (save it directly)."""
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            return get_model_state_dict(self.net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.engine is not None:
            if self.engine.zero_optimization_stage() == 3:
                full = self.engine._zero3_consolidated_16bit_state_dict()  # rank 0's; None on the others
                return {k: v.float().cpu() for k, v in full.items()} if full is not None else {}
            return {k: v.detach().float().cpu() for k, v in self.net.state_dict().items()}
        return None

    def observed(self) -> dict[str, Any] | None:
        return self.step.observed()


def build(
    spec: RunSpec,
    env: RankEnv,
    micro_batch: int,
    accum: int,
    seed: int,
    *,
    attn: str | None = None,
    grad_sync: str | None = None,
    lr_every_step: bool = True,
    lr_schedule: str,
    compile_note: str | None = None,
    fake_oom: Any = None,
    init_state: dict[str, torch.Tensor] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Built:
    """The model (fresh weights from `seed`, the same on every rank) with the method applied, as a step: its
    settings resolved once here (with `micro` and `accum`, and FSDP2's `grad_sync` when the measurement chose
    it: "last", one reduce-scatter per step, the default; "every", per micro-batch) and applied; recorded as
    applied. `attn`: the attention of free-lunch without `fa2` when a stage sets its own (None: the settings').
    `lr_every_step`: the loop sets the learning rate every step (a stage's schedule; the benchmark's stays the
    recipe's), so `cstep` keeps it in a tensor. `lr_schedule` and `compile_note` go into the settings; `fake_oom`:
    the out-of-memory test hook of a benchmark cell (trainer/oom.py). `init_state`: weights loaded into the fresh
    model before the method wraps it (the loss check's one saved init; FSDP2's skeleton ranks get rank 0's);
    `overrides`: resolved settings replaced (the loss check's naive at a method's precision, e.g. `tf32`). The
    seconds of the model's build and of the method's wrapping are `Built.timings` (and the step's
    `build_timings`)."""
    env.sync()
    t0 = time.perf_counter()
    m = spec.method
    s = resolve(spec, micro_batch, accum, grad_sync)
    if overrides:
        s = dataclasses.replace(s, **overrides)
    attn_req = attn if attn is not None and m.free_lunch and not m.flash_attn else s.attn_implementation
    fused_ce = kernels.fused_ce_impl(m, env.device)
    # FSDP2 on several ranks: rank 0 builds the weights on the CPU, the others a skeleton (trainer.fsdp)
    meta = bool(m.sharding and SHARDING_ENGINE[m.sharding] == "fsdp" and env.distributed and env.rank != 0)
    model = spec.model.to_dict()
    if fake_oom is not None:
        fake_oom.at_build(micro_batch, env.rank)
    net, attn_used, extras = build_with_extras(model, m, attn_req, fused_ce, seed, meta=meta)
    if init_state is not None and not meta:
        net.load_state_dict(init_state, strict=True)
    if fake_oom is not None:
        fake_oom.install(net, env.rank)
    env.sync()
    t1 = time.perf_counter()
    engine = None
    if m.sharding in zero.STAGES:
        step: TrainStep = zero.build_step(m, s, env, net, attn_used)
        engine = step.engine
        if s.no_decay_1d and m.offload:
            step.settings["weight_decay_note"] = "ZeRO-Offload's DeepSpeedCPUAdam: weight decay on every parameter"
    else:
        applied = apply_method(m, s, env, net, attn_used)
        optimizer, opt_settings = build_optimizer(s, net.parameters())
        grad_clip = spec.model.recipe.grad_clip
        step = TrainStep(applied, optimizer, grad_clip, env.device.type, {**applied.settings, **opt_settings})
        step.settings["grad_scaler"] = type(step.scaler).__name__ if step.scaler is not None else None
        if grad_sync is not None and step.grad_sync_options():
            step.set_grad_sync(grad_sync)
        if s.compile_optimizer:
            if lr_every_step:
                for g in optimizer.param_groups:  # set per step from the schedule: a tensor, no recompiles
                    g["lr"] = torch.tensor(float(g["lr"]))
                step.settings["cstep_lr"] = (
                    f"a tensor (no recompiles), at least {CSTEP_MIN_LR:g} (lr 0 divides by zero)"
                )
            step.compile_optimizer_step()
    env.sync()
    timings = {"model_build_s": t1 - t0, "method_wrap_s": time.perf_counter() - t1}
    step.build_timings = timings
    step.device = env.device
    settings = step.settings
    settings.update(
        free_lunch=m.free_lunch,
        method_parts={"slug": m.slug, "extras": m.extras, **extras},
        lr_schedule=lr_schedule,
        applied_by="trainer.parallel.apply_method / build_optimizer, trainer.zero.build_step, trainer.step.TrainStep",
        not_applied=[],
    )
    if m.free_lunch and not (spec.model.supports_compile and spec.compile_model) and compile_note:
        settings["compile_note"] = compile_note
    if kernel_versions := kernel_info(model):
        settings["kernels"] = kernel_versions
    if fake_oom is not None:
        settings["test_hooks"] = {"fake_oom": fake_oom.describe()}
    return Built(step, net, settings, engine, timings)
