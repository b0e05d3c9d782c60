"""Time-budgeted masked-LM pre-training (Izsak et al. 2021) with checkpoint/resume.

Progress is elapsed *training* time / budget: the time of optimizer steps and validations, not of start-up,
loading or checkpoint writes, and it survives a restart (it is part of the checkpoint). The learning rate,
validation points, early stop and fine-tuning checkpoints all key on progress.

`run_dir` keeps what must outlive a killed job (checkpoint.pt, steps.jsonl, validation.jsonl, the
fine-tuning checkpoints finetune-0.50/ ...); it is not a Snakemake output, so a failed job does not
delete it and the rerun resumes. A run that gets SIGTERM or SIGUSR1 (SLURM pre-emption / time limit)
writes a checkpoint after the current step and exits non-zero.

For tests, `train.fake_step_s` makes every step count a fixed time (a deterministic clock) and
`train.max_steps` caps the steps.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..results import atomic_write_text
from ..trainer.models import build_model
from . import schedule
from .config import TORCH_LOCK, file_logger, fingerprint
from .data import load_shard


class ShardSampler:
    """Samples in a seeded order: per epoch, shards shuffled and samples shuffled within each shard; epoch e
    reads masked copy e mod D. The position (epoch, shard, offset) is three integers: the checkpoint's."""

    def __init__(self, data_dir: str | Path, shards: list[dict[str, Any]], copies: int, seed: int):
        self.data_dir, self.shards, self.copies, self.seed = Path(data_dir), shards, copies, seed
        self.epoch = self.shard_pos = self.offset = 0
        self._order_cache: tuple[int, np.ndarray] | None = None
        self._perm_cache: tuple[tuple[int, int], np.ndarray] | None = None
        self._shard_cache: tuple[str, dict[str, np.ndarray]] | None = None

    def _order(self) -> np.ndarray:
        if self._order_cache is None or self._order_cache[0] != self.epoch:
            perm = np.random.default_rng([self.seed, self.epoch, 1]).permutation(len(self.shards))
            self._order_cache = (self.epoch, perm)
        return self._order_cache[1]

    def _shard(self, k: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        name = self.shards[k]["name"]
        if self._shard_cache is None or self._shard_cache[0] != name:
            self._shard_cache = (name, load_shard(self.data_dir, name))
        if self._perm_cache is None or self._perm_cache[0] != (self.epoch, k):
            perm = np.random.default_rng([self.seed, self.epoch, 2, k]).permutation(self.shards[k]["samples"])
            self._perm_cache = ((self.epoch, k), perm)
        return self._shard_cache[1], self._perm_cache[1]

    def take(self, n: int) -> dict[str, np.ndarray]:
        parts: dict[str, list[np.ndarray]] = {"input_ids": [], "positions": [], "labels": []}
        while n > 0:
            k = int(self._order()[self.shard_pos])
            arrays, perm = self._shard(k)
            idx = np.sort(perm[self.offset : self.offset + n])
            copy = self.epoch % self.copies
            for a in parts:
                parts[a].append(np.asarray(arrays[a][copy][idx]))
            self.offset += len(idx)
            n -= len(idx)
            if self.offset >= self.shards[k]["samples"]:
                self.offset, self.shard_pos = 0, self.shard_pos + 1
                if self.shard_pos >= len(self.shards):
                    self.shard_pos, self.epoch = 0, self.epoch + 1
        return {a: np.concatenate(v) for a, v in parts.items()}

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "shard_pos": self.shard_pos, "offset": self.offset}

    def load_state(self, s: dict[str, int]) -> None:
        self.epoch, self.shard_pos, self.offset = s["epoch"], s["shard_pos"], s["offset"]


def to_batch(arrays: dict[str, np.ndarray], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Model inputs: masked ids, attention mask, dense labels (-100 except at the masked positions)."""
    ids = torch.from_numpy(arrays["input_ids"].astype(np.int64))
    pos = torch.from_numpy(arrays["positions"].astype(np.int64))
    lab = torch.from_numpy(arrays["labels"].astype(np.int64))
    labels = torch.full_like(ids, -100)
    valid = pos >= 0
    rows = torch.arange(ids.shape[0]).unsqueeze(1).expand_as(pos)
    labels[rows[valid], pos[valid]] = lab[valid]
    return {
        "input_ids": ids.to(device),
        "attention_mask": (ids != pad_id).long().to(device),
        "labels": labels.to(device),
    }


def model_dict(cfg: dict[str, Any], index: dict[str, Any]) -> dict[str, Any]:
    """The config's model with the tokenizer's vocabulary and special ids (a dict like ModelSpec.to_dict())."""
    m = cfg["model"]
    sp = index["special_ids"]
    arch = dict(m["arch"])
    arch.update(vocab_size=index["vocab_size"], pad_token_id=sp["pad"], bos_token_id=sp["cls"], eos_token_id=sp["sep"])
    # RoBERTa numbers positions from pad_token_id + 1
    need = index["seq_len"] + (sp["pad"] + 1 if m["family"].startswith("roberta") else 0)
    arch["max_position_embeddings"] = max(arch.get("max_position_embeddings", 0), need)
    arch.setdefault("type_vocab_size", 1)
    return {"name": m["name"], "family": m["family"], "task": "masked_lm", "arch": arch}


def _optimizer(model: torch.nn.Module, tr: dict[str, Any], device: torch.device) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]  # biases, LayerNorm
    groups = [{"params": decay, "weight_decay": tr["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    extra = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=tr["lr"], betas=tuple(tr["betas"]), eps=tr["eps"], **extra)


def _device(tr: dict[str, Any]) -> torch.device:
    if tr["device"] == "cuda" or (tr["device"] == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def _truncate_jsonl(path: Path, step: int) -> None:
    if not path.exists():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
    atomic_write_text(path, "".join(ln + "\n" for ln in keep))


def save_model(model: torch.nn.Module, out_dir: Path, tokenizer: Path, info: dict[str, Any]) -> None:
    """A transformers model folder (config.json + weights) with tokenizer.json and what produced it."""
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    shutil.copyfile(tokenizer, tmp / "tokenizer.json")
    (tmp / "budget.json").write_text(json.dumps(info, indent=1))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)


@torch.no_grad()
def validation_loss(model, sampler_shards, data_dir, pad_id, micro, max_samples, device, autocast) -> float:
    """Mean masked-LM loss over the first `max_samples` validation samples (every masked token weighs the same)."""
    model.eval()
    total, count, seen = 0.0, 0, 0
    for shard in sampler_shards:
        arrays = load_shard(data_dir, shard["name"])
        for start in range(0, shard["samples"], micro):
            take = min(micro, shard["samples"] - start, max_samples - seen)
            if take <= 0:
                break
            batch = to_batch({a: np.asarray(v[0][start : start + take]) for a, v in arrays.items()}, pad_id, device)
            n = int((batch["labels"] != -100).sum())
            with autocast():
                loss = model(**batch).loss
            total += float(loss) * n
            count += n
            seen += take
    model.train()
    return total / max(count, 1)


def pretrain(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """See `_pretrain`; one torch job at a time per process (TORCH_LOCK)."""
    with TORCH_LOCK:
        return _pretrain(*args, **kwargs)


def _pretrain(
    cfg: dict[str, Any],
    index_path: str | Path,
    out_model: str | Path,
    out_result: str | Path,
    run_dir: str | Path,
    log: str | Path | None = None,
    *,
    threads: int | None = None,
    kill_at_step: int | None = None,
    kill_signal: int = signal.SIGKILL,
) -> dict[str, Any]:
    """Pre-train within the time budget (resuming from run_dir/checkpoint.pt when present); write the final
    model folder and a result JSON. `kill_at_step` (testing) sends `kill_signal` to this process after that
    step: SIGKILL is a crash; SIGTERM/SIGUSR1 (pre-emption) end the run with a checkpoint and SystemExit."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    logger = file_logger("pretrain", log)
    tr = cfg["train"]
    index_path, run_dir, out_model = Path(index_path), Path(run_dir), Path(out_model)
    data_dir = index_path.parent
    index = json.loads(index_path.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    threads = tr["threads"] or threads
    if threads:
        torch.set_num_threads(threads)
    device = _device(tr)
    budget_s = tr["budget_hours"] * 3600.0
    micro = tr["micro_batch"]
    accum = tr["global_batch"] // micro
    pad_id = index["special_ids"]["pad"]
    mdict = model_dict(cfg, index)
    keyed = {k: v for k, v in tr.items() if k not in ("max_steps", "checkpoint_every_s", "log_every", "device")}
    fp = fingerprint(index["fingerprint"], cfg["seed"], mdict, keyed)

    torch.manual_seed(cfg["seed"])
    model, attn = build_model(mdict, tr["attn_implementation"])
    model.to(device).train()
    opt = _optimizer(model, tr, device)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(tr["precision"])
    scaler = torch.amp.GradScaler(device.type, enabled=tr["precision"] == "fp16")

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)

    sampler = ShardSampler(data_dir, index["splits"]["train"], index["duplication_factor"], cfg["seed"])
    val_points = schedule.validation_points(tr["validation"])
    ft_points = sorted(tr["finetune_checkpoints"])
    state: dict[str, Any] = {"step": 0, "elapsed_s": 0.0, "val_s": 0.0, "last_val_loss": None, "stop": None}
    ckpt_path = run_dir / "checkpoint.pt"
    steps_path, val_path = run_dir / "steps.jsonl", run_dir / "validation.jsonl"
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if ck["fingerprint"] != fp:
            raise RuntimeError(f"{ckpt_path} belongs to another configuration or data; delete {run_dir} to start over")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        scaler.load_state_dict(ck["scaler"])
        sampler.load_state(ck["sampler"])
        torch.set_rng_state(ck["rng"]["torch"])
        if device.type == "cuda" and ck["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(ck["rng"]["cuda"])
        state = ck["state"]
        logger.info("resumed at step %d, %.1f s of %.1f s budget used", state["step"], state["elapsed_s"], budget_s)
    else:
        steps_path.unlink(missing_ok=True)
        val_path.unlink(missing_ok=True)
        logger.info(
            "start: model %s (%s, %.1fM parameters, attention %s) on %s, budget %.1f s, batch %d = %d x %d",
            mdict["name"], mdict["family"], sum(p.numel() for p in model.parameters()) / 1e6, attn, device,
            budget_s, tr["global_batch"], micro, accum,
        )  # fmt: skip
    _truncate_jsonl(steps_path, state["step"])
    _truncate_jsonl(val_path, state["step"])

    def checkpoint() -> None:
        t0 = time.perf_counter()
        rng = {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if device.type == "cuda" else None}
        ck = {
            "fingerprint": fp, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scaler": scaler.state_dict(), "sampler": sampler.state(), "rng": rng, "state": dict(state),
        }  # fmt: skip
        tmp = ckpt_path.with_name(".checkpoint.pt.tmp")
        torch.save(ck, tmp)
        os.replace(tmp, ckpt_path)
        logger.info("checkpoint at step %d (%.2f s to write)", state["step"], time.perf_counter() - t0)

    signalled: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            previous[sig] = signal.signal(sig, lambda s, _f: signalled.append(s))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def clock(t0: float, fake: float) -> float:
        if tr["fake_step_s"] is not None:
            return fake
        sync()
        return time.perf_counter() - t0

    try:
        val_idx = schedule.next_after(val_points, state["elapsed_s"] / budget_s)
        ft_idx = schedule.next_after(ft_points, state["elapsed_s"] / budget_s)
        last_ckpt = state["elapsed_s"]
        with steps_path.open("a") as steps_fh, val_path.open("a") as val_fh:
            while state["stop"] is None:
                progress = state["elapsed_s"] / budget_s
                if progress >= 1.0:
                    state["stop"] = "budget"
                    break
                if tr["max_steps"] is not None and state["step"] >= tr["max_steps"]:
                    state["stop"] = "max_steps"
                    break
                lr = schedule.lr_at(state["elapsed_s"], budget_s, tr["lr"], tr["warmup_fraction"])
                for g in opt.param_groups:
                    g["lr"] = lr
                sync()
                t0 = time.perf_counter()
                loss_sum = 0.0
                for _ in range(accum):
                    batch = to_batch(sampler.take(micro), pad_id, device)
                    with autocast():
                        loss = model(**batch).loss / accum
                    scaler.scale(loss).backward()
                    loss_sum += float(loss.detach())
                if tr["grad_clip"]:
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tr["grad_clip"])
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
                dt = clock(t0, tr["fake_step_s"] or 0.0)
                state["elapsed_s"] += dt
                state["step"] += 1
                progress = state["elapsed_s"] / budget_s
                rec = {"step": state["step"], "elapsed_s": round(state["elapsed_s"], 6), "progress": round(progress, 6),
                       "lr": lr, "loss": loss_sum, "step_time_s": round(dt, 6)}  # fmt: skip
                steps_fh.write(json.dumps(rec) + "\n")
                steps_fh.flush()
                if state["step"] % tr["log_every"] == 0 or state["step"] == 1:
                    logger.info("step %d progress %.4f lr %.3g loss %.4f (%.3f s)", state["step"], progress, lr,
                                loss_sum, dt)  # fmt: skip

                if val_idx < len(val_points) and progress >= val_points[val_idx]:
                    t0 = time.perf_counter()
                    vl = validation_loss(model, index["splits"]["validation"], data_dir, pad_id, micro,
                                         tr["validation"]["max_samples"], device, autocast)  # fmt: skip
                    dv = clock(t0, 0.0)
                    state["elapsed_s"] += dv
                    state["val_s"] += dv
                    state["last_val_loss"] = vl
                    val_idx = schedule.next_after(val_points, progress)
                    val_fh.write(
                        json.dumps({"step": state["step"], "progress": round(progress, 6), "val_loss": vl}) + "\n"
                    )
                    val_fh.flush()
                    logger.info("validation at step %d progress %.4f: loss %.4f", state["step"], progress, vl)
                    state["stop"] = schedule.early_stop(tr["early_stop"], progress, vl)
                    if state["stop"]:
                        logger.info(state["stop"])
                while ft_idx < len(ft_points) and progress >= ft_points[ft_idx]:
                    d = run_dir / f"finetune-{ft_points[ft_idx]:.2f}"
                    save_model(model, d, data_dir / index["tokenizer"], {"step": state["step"], "progress": progress})
                    logger.info("fine-tuning checkpoint %s at step %d", d, state["step"])
                    ft_idx += 1
                if state["elapsed_s"] - last_ckpt >= tr["checkpoint_every_s"] or signalled:
                    checkpoint()
                    last_ckpt = state["elapsed_s"]
                if signalled:
                    raise SystemExit(f"pretrain: signal {signalled[0]} at step {state['step']}; checkpoint saved")
                if kill_at_step is not None and state["step"] >= kill_at_step:
                    os.kill(os.getpid(), kill_signal)

    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    logger.info("stopped (%s) at step %d, %.1f s of training time", state["stop"], state["step"], state["elapsed_s"])
    if state["last_val_loss"] is None or val_idx < len(val_points):
        state["last_val_loss"] = validation_loss(model, index["splits"]["validation"], data_dir, pad_id, micro,
                                                 tr["validation"]["max_samples"], device, autocast)  # fmt: skip
    checkpoint()
    info = {"model": mdict, "step": state["step"], "elapsed_s": state["elapsed_s"], "stop": state["stop"]}
    save_model(model, out_model, data_dir / index["tokenizer"], info)
    losses = [json.loads(ln)["loss"] for ln in steps_path.read_text().splitlines() if ln.strip()]
    k = max(1, len(losses) // 10)
    result = {
        "model": mdict["name"], "family": mdict["family"], "device": str(device), "precision": tr["precision"],
        "steps": state["step"], "budget_s": budget_s, "elapsed_s": state["elapsed_s"], "validation_s": state["val_s"],
        "stop_reason": state["stop"], "micro_batch": micro, "grad_accum_steps": accum,
        "global_batch": tr["global_batch"],
        "tokens_per_s": state["step"] * tr["global_batch"] * index["seq_len"] / max(state["elapsed_s"], 1e-9),
        "loss_first": float(np.mean(losses[:k])) if losses else None,
        "loss_last": float(np.mean(losses[-k:])) if losses else None,
        "val_loss": state["last_val_loss"],
        "finetune_checkpoints": sorted(str(p) for p in run_dir.glob("finetune-*")),
        "run_dir": str(run_dir), "model_dir": str(out_model),
    }  # fmt: skip
    atomic_write_text(out_result, json.dumps(result, indent=1))
    return result
