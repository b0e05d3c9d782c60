"""The method of a plan applied for a run that trains for real (the budget stage, the train stage), through the
trainer's own pieces, exactly as a benchmark cell builds it: `parallel.apply_method` (one rank, DDP, FSDP2
fsdp-grad / fsdp-full with `off` = CPUOffloadPolicy, activation checkpointing, free-lunch, `cg`),
`parallel.build_optimizer`, `zero.build_step` (DeepSpeed ZeRO-1/2/3, `off` = ZeRO-Offload) and `step.TrainStep`
(`cstep`), with the model-level extras of `run.build_with_extras` (`fa2`, `liger`, `flce`). What a real run adds
(`Built`): the learning rate set every step by the loop's schedule (`set_lr`), a checkpoint that resumes
(`state_dicts` / `load_state_dicts`: FSDP2 as full state dicts, written once by rank 0 and loadable at any world
size; DeepSpeed through the engine's own sharded checkpoint) and full weights for model folders (`full_state`). A
part that cannot run where the job runs fails before training (`MethodError`, naming where the method came from
and the reason), never silently skipped.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pretrain_planner.planning.settings import attention_for
from pretrain_planner.trainer import kernels, zero
from pretrain_planner.trainer.parallel import MethodConfig, apply_method, build_optimizer
from pretrain_planner.trainer.rank import RankEnv, Unsupported
from pretrain_planner.trainer.step import TrainStep

# The compiled AdamW step divides by the step size (eps / step_size, with a tensor lr): lr 0 (the first step of
# the warm-up) would give NaN weights. The floor moves a weight by about 1e-12: nothing.
CSTEP_MIN_LR = 1e-12


class MethodError(RuntimeError):
    """The method (with the recipe's precision) cannot run where the job runs."""


def check(cfg: MethodConfig, env: RankEnv, where: str = "train.method") -> None:
    """Raise MethodError, the same on every rank and before anything is built, if the method cannot run here."""
    from types import SimpleNamespace

    from pretrain_planner.planning.families import FAMILIES
    from pretrain_planner.planning.grid import extras_reason
    from pretrain_planner.trainer.run import check_supported

    m = cfg.method
    why = None
    # the benchmark grid's rules for the extra parts (grid.extras_reason), for this model on this device
    on_cuda = env.device.type == "cuda"
    model = SimpleNamespace(
        name=cfg.model.get("name", "model"),
        family=cfg.model["family"],
        kind=FAMILIES[cfg.model["family"]],  # the registry's entry, as ModelSpec.kind
        task=cfg.model.get("task", "masked_lm"),
        supports_compile=True,
        recipe=SimpleNamespace(precision=cfg.recipe["precision"]),
    )
    gpu = SimpleNamespace(name=torch.cuda.get_device_name(env.device) if on_cuda else "cpu",
                          bf16=on_cuda and torch.cuda.is_bf16_supported())  # fmt: skip
    if m.offload and not m.sharding:
        why = "off offloads a sharded optimizer (and parameters): it needs zero1/2/3, fsdp-grad or fsdp-full"
    elif reason := extras_reason(m, model, gpu):
        why = reason
    else:
        try:
            check_supported(cfg, env)
        except Unsupported as exc:
            why = str(exc)
    if why:
        raise MethodError(f"{where} {m.slug!r} (precision {cfg.recipe['precision']}) cannot run on "
                          f"{env.device}: {why}")  # fmt: skip


@dataclass
class Built:
    step: TrainStep  # micro(), optimizer_step(); DeepSpeedStep under ZeRO
    net: torch.nn.Module  # the model itself (sharded in place under FSDP2; the engine's module under ZeRO)
    settings: dict[str, Any]
    engine: Any = None  # DeepSpeed

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
    cfg: MethodConfig,
    env: RankEnv,
    model: dict[str, Any],
    micro: int,
    accum: int,
    seed: int,
    fl_attn: str | None = "sdpa",
    grad_sync: str | None = None,
    *,
    where: str = "train.method",
    lr_schedule: str = "set every step from elapsed training time (trainer.schedule.lr_at)",
    compile_note: str | None = "the budget stage compiles on CUDA only",
) -> Built:
    """The model (fresh weights from `seed`, the same on every rank) with the method applied, as a step.
    `fl_attn`: the attention of `fl` without `fa2` (train.attn_implementation; None: the benchmark's,
    planning.settings.attention_for). `where` names the method's source in errors; `lr_schedule` and `compile_note`
    go into the settings. `grad_sync`: FSDP2's gradient
    synchronisation ("last": one reduce-scatter per step, the default; "every": per micro-batch, the benchmark's
    choice when "last" did not fit)."""
    from pretrain_planner.trainer.run import build_with_extras

    m = cfg.method
    check(cfg, env, where)
    attn = attention_for(m)
    if m.free_lunch and not m.flash_attn and fl_attn is not None:
        attn = fl_attn
    fused_ce = kernels.fused_ce_impl(m, env.device)
    # FSDP2 on several ranks: rank 0 builds the weights on the CPU, the others a skeleton (trainer.fsdp)
    meta = bool(m.sharding and m.sharding.startswith("fsdp") and env.distributed and env.rank != 0)
    try:
        net, attn_used, extras = build_with_extras(model, m, attn, fused_ce, seed, meta=meta)
    except Unsupported as exc:
        raise MethodError(f"{where} {m.slug!r}: {exc}") from None
    engine = None
    if m.sharding in zero.STAGES:
        step: TrainStep = zero.build_step(cfg, env, net, attn_used, micro, accum)
        engine = step.engine
        if cfg.recipe["optimizer"].get("no_decay_1d") and m.offload:
            step.settings["weight_decay_note"] = "ZeRO-Offload's DeepSpeedCPUAdam: weight decay on every parameter"
    else:
        applied = apply_method(cfg, env, net, attn_used)
        optimizer, opt_settings = build_optimizer(cfg, env, net.parameters())
        step = TrainStep(applied, optimizer, cfg.recipe["grad_clip"], env.device.type, {**applied.settings,
                                                                                        **opt_settings})  # fmt: skip
        if grad_sync is not None and step.grad_sync_options():
            step.set_grad_sync(grad_sync)
        if m.compile_mode == "cstep":
            for g in optimizer.param_groups:  # set per step from the schedule: a tensor, no recompiles
                g["lr"] = torch.tensor(float(g["lr"]))
            step.compile_optimizer_step()
            step.settings["cstep_lr"] = f"a tensor (no recompiles), at least {CSTEP_MIN_LR:g} (lr 0 divides by zero)"
    settings = step.settings
    settings.update(
        method=m.slug,
        free_lunch=m.free_lunch,
        attn_implementation=attn_used,
        method_parts={"slug": m.slug, "extras": m.extras, **extras},
        lr_schedule=lr_schedule,
        applied_by="trainer.parallel.apply_method / build_optimizer, trainer.zero.build_step, trainer.step.TrainStep",
        not_applied=[],
    )
    if m.free_lunch and not cfg.model["supports_compile"] and compile_note:
        settings["compile_note"] = compile_note
    settings.setdefault("fused_adamw", bool(settings.get("fused_optimizer")))
    return Built(step, net, settings, engine)
