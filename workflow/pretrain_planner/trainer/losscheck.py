"""The loss-equivalence check's runs, on every rank of a setting's check job (launch/losscheck.py hands it over).

Each run trains the setting's model for `steps` optimizer steps with one method, from the same initial weights
(one seeded init, saved once per model and seed and loaded by every run: `initial_state`) on the same global
batches in the same order (`global_batch`: a step's samples depend on the step and the seed only, every rank takes
its slice, every micro-batch split of it sums to the same global mean), with the dropout RNG seeded the same way
right before the first step. It records the loss of every step (the mean over the ranks of the step's micro-batch
losses, each scaled 1/accumulation as the method trains) and the gradient norm before the optimizer step (the
method's own gradients: DDP's averaged, FSDP2's sharded ones reduced, ZeRO's from the engine), the learning rate
held constant at the recipe's (a schedule is the same function for every method).

The data is learnable so the curves move: tokens from a fixed sparse Markov chain (each token has `BRANCH`
successors), masked as the masked-LM task masks; images labelled by a fixed linear teacher.

Faults for the check's own tests (never set by the pipeline): PRETRAIN_PLANNER_TEST_LOSS_FAULT =
"run=fault[;run=fault]" (planning/losscheck.faults) breaks the named run after it is built: `unscaled_accum` (each
micro-batch's loss not divided by the accumulation), `lr_x2` (the optimizer's learning rate doubled),
`bf16_no_master` (the weights themselves in bf16, updated without fp32 master copies). The fault is recorded in the
run's curve.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from pretrain_planner.planning.losscheck import faults
from pretrain_planner.planning.runspec import RunSpec
from pretrain_planner.results import atomic_write_text
from pretrain_planner.trainer import methodbuild
from pretrain_planner.trainer.config import RunConfig
from pretrain_planner.trainer.rank import RankEnv, Unsupported, close_rank, init_rank
from pretrain_planner.trainer.ranks import Ranks

BRANCH = 4  # successors per token of the Markov chain: entropy ln 4 = 1.39 nats, far below ln(vocab)
TABLE_SEED = 20240611  # the chain and the image teacher: fixed, the same for every run and seed
DATA_SEED = 7919  # a step's samples: DATA_SEED x (seed + 1) + step
DROPOUT_SEED = 104729  # the global RNG right before the first step: DROPOUT_SEED + dropout_seed


# --- data ------------------------------------------------------------------------------------------------------
def global_batch(model: dict[str, Any], size: int, step: int, seed: int) -> dict[str, torch.Tensor]:
    """The `size` samples of check step `step` (CPU tensors), the same whatever the world size or split."""
    gen = torch.Generator().manual_seed(DATA_SEED * (seed + 1) + step)
    table = torch.Generator().manual_seed(TABLE_SEED)
    recipe, arch, task = model["recipe"], model["arch"], model["task"]
    if task == "image_classification":
        image = recipe["image_size"]
        pixels = torch.randn(size, 3, image, image, generator=gen)
        teacher = torch.randn(3 * image * image, arch.get("num_labels", 2), generator=table)
        return {"pixel_values": pixels, "labels": (pixels.flatten(1) @ teacher).argmax(-1)}
    vocab, seq = arch["vocab_size"], recipe["sequence_length"]
    successors = torch.randint(0, vocab, (vocab, BRANCH), generator=table)
    choice = torch.randint(0, BRANCH, (size, seq), generator=gen)
    ids = torch.empty(size, seq, dtype=torch.long)
    ids[:, 0] = torch.randint(0, vocab, (size,), generator=gen)
    for t in range(1, seq):
        ids[:, t] = successors[ids[:, t - 1], choice[:, t]]
    if task != "masked_lm":
        return {"input_ids": ids, "labels": ids.clone()}
    masked = torch.rand(size, seq, generator=gen) < recipe.get("mlm_probability", 0.15)
    masked[:, 0] |= ~masked.any(dim=1)
    return {"input_ids": torch.where(masked, torch.full_like(ids, vocab - 1), ids),
            "labels": torch.where(masked, ids, torch.full_like(ids, -100))}  # fmt: skip


def rank_micro_batches(batch: dict[str, torch.Tensor], env: RankEnv, micro_batch: int, accum: int,
                       ) -> list[dict[str, torch.Tensor]]:  # fmt: skip
    """This rank's slice of the global batch, as `accum` micro-batches of `micro` samples on its device."""
    per_rank = micro_batch * accum
    start = env.rank * per_rank
    return [{k: v[start + i * micro_batch: start + (i + 1) * micro_batch].to(env.device) for k, v in batch.items()}
            for i in range(accum)]  # fmt: skip


# --- the one init ------------------------------------------------------------------------------------------------
def initial_state(model: dict[str, Any], seed: int, path: Path, env: RankEnv) -> dict[str, torch.Tensor]:
    """The model's initial weights from `seed`, saved once at `path` (atomically: concurrent jobs write the same
    bytes) and loaded by every run of every method and setting."""
    ranks = Ranks.of(env)
    if env.rank == 0 and not path.is_file():
        from pretrain_planner.trainer.models import build_model

        torch.manual_seed(seed)
        net, _ = build_model(model, None)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        torch.save({k: v.detach().cpu() for k, v in net.state_dict().items()}, tmp)
        os.replace(tmp, path)
    ranks.barrier()
    return torch.load(path, map_location="cpu", weights_only=True)


# --- a run ---------------------------------------------------------------------------------------------------------
def _has_dropout(net: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in net.modules())


def _grad_norm(built: methodbuild.Built) -> float | None:
    """The global gradient norm before the optimizer step (unscaled under a loss scaler); None under ZeRO (its
    engine reports it after the step)."""
    if built.engine is not None:
        return None
    params = [p for p in built.step.applied.raw.parameters() if p.requires_grad and p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    value = float(norm)
    scale = built.step.loss_scale()
    return value / scale if scale else value


def _break(built: methodbuild.Built, fault: str, accum: int) -> None:
    """A test's deliberate fault in one run (FAULT_ENV)."""
    step = built.step
    if fault == "unscaled_accum":
        micro_batch = step.micro
        step.micro = lambda batch, scale, sync_grads: micro_batch(batch, scale * accum, sync_grads)
    elif fault == "lr_x2":
        opt = built.engine.optimizer if built.engine is not None else step.optimizer
        for g in opt.param_groups:
            g["lr"] = g["lr"] * 2
    elif fault == "bf16_no_master":
        built.net.to(torch.bfloat16)


def run_curve(cfg: RunConfig, env: RankEnv, run: dict[str, Any], check: dict[str, Any],
              init: dict[str, torch.Tensor], fault: str | None) -> dict[str, Any]:  # fmt: skip
    """One run of the check: its loss and gradient norm per step (rank 0's view of the global values)."""
    micro_batch, world = int(run["micro_batch"]), cfg.cell.world_size
    size = int(check["global_batch"])
    accum = size // (world * micro_batch)
    spec = RunSpec.of(cfg.model, cfg.gpu, run["method"], world, cuda=env.device.type == "cuda",
                      compile_model=cfg.compile_model, nodes=cfg.cell.nodes)  # fmt: skip
    out: dict[str, Any] = {**run, "grad_accum_steps": accum, "loss": [], "grad_norm": []}
    try:
        methodbuild.check(spec, env)
    except Unsupported as exc:
        return {**out, "error": f"unsupported: {exc}"}
    built = methodbuild.build(spec, env, micro_batch, accum, int(check["seed"]), lr_every_step=False,
                              lr_schedule="constant (the loss check)", init_state=init,
                              overrides=run.get("overrides") or None)  # fmt: skip
    if run.get("only_if_dropout") and not _has_dropout(built.net):
        built.step.close()
        return {**out, "skipped": "the model has no dropout: another dropout seed changes nothing"}
    if fault:
        _break(built, fault, accum)
        out["test_fault"] = fault
    s = built.settings
    out["settings"] = {k: s.get(k) for k in ("precision", "autocast", "tf32", "parallel", "optimizer", "compile",
                                             "activation_checkpointing", "fused_ce", "liger")}  # fmt: skip
    ranks = Ranks.of(env)
    torch.manual_seed(DROPOUT_SEED + int(run.get("dropout_seed", 0)))
    for step_no in range(int(check["steps"])):
        batches = rank_micro_batches(
            global_batch(cfg.model, size, step_no, int(check["seed"])), env, micro_batch, accum
        )
        losses = [built.step.micro(b, 1.0 / accum, sync_grads=i == accum - 1).float()
                  for i, b in enumerate(batches)]  # fmt: skip
        norm = _grad_norm(built)
        built.step.optimizer_step()
        if built.engine is not None:
            engine_norm = built.engine.get_global_grad_norm()
            norm = float(engine_norm) if engine_norm is not None else None
        loss = ranks.mean(float(torch.stack(losses).sum()))
        out["loss"].append(loss if math.isfinite(loss) else None)
        out["grad_norm"].append(norm if norm is not None and math.isfinite(norm) else None)
    built.step.close()
    return out


def run_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """Every rank of a setting's check job: each run in turn; rank 0 writes the curves file and returns it."""
    import json

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = RunConfig.from_spec({**spec, "cell": {**spec["cell"], "method": spec["init_method"]},
                               "outputs": {"result": spec["outputs"]["curves"], "steps": ""}})  # fmt: skip
    check, broken = spec["check"], faults()
    env = init_rank(cfg)
    curves = []
    try:
        init = initial_state(cfg.model, int(check["seed"]), Path(check["init"]), env)
        for run in spec["runs"]:
            curves.append(run_curve(cfg, env, run, check, init, broken.get(run["name"])))
    finally:
        close_rank(env)
    record = {"setting": spec["cell"], "check": check, "runs": curves}
    if env.rank == 0:
        atomic_write_text(spec["outputs"]["curves"], json.dumps(record, indent=1) + "\n")
    return {"rank": env.rank, "record": record if env.rank == 0 else None}
