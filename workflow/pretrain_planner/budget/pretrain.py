"""Time-budgeted masked-LM pre-training (Izsak et al. 2021) with checkpoint/resume.

Progress is elapsed *training* time / budget: the time of optimizer steps and validations, not of start-up,
loading or checkpoint writes, and it survives a restart (it is part of the checkpoint). The learning rate,
validation points, early stop and fine-tuning checkpoints all key on progress.

`run_dir` keeps what must outlive a killed job (checkpoint.pt, steps.jsonl, validation.jsonl, the
fine-tuning checkpoints finetune-0.50/ ...); it is not a Snakemake output, so a failed job does not
delete it and the rerun resumes. A run that gets SIGTERM or SIGUSR1 (SLURM pre-emption / time limit), or
submitit's USR2, writes a checkpoint after the current step and exits non-zero (USR2: submitit requeues it).

Data-parallel over the setting's ranks (gloo on CPU, NCCL on GPUs) with the benchmark's method applied by the
trainer's code (budget/method.py: DDP, FSDP2, DeepSpeed ZeRO, offload, fl and its extras): every rank walks the
same sample stream and trains on its own slice of each micro-batch, so rank 0's checkpoint (weights, optimizer,
sampler position, elapsed time; FSDP2 as full state dicts, ZeRO naming the engine's sharded checkpoint) resumes
them all. After each step the ranks take the largest elapsed time and any
rank's stop signal, so schedule, validation points and the stop agree. Dropout is reseeded per (rank, step),
so a resumed run draws what the uninterrupted one drew.

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

from pretrain_planner.budget import method as bmethod
from pretrain_planner.budget import schedule
from pretrain_planner.budget.config import TORCH_LOCK, file_logger, fingerprint, setting_of
from pretrain_planner.budget.data import load_shard
from pretrain_planner.launch import progress as job_progress
from pretrain_planner.results import atomic_write_text
from pretrain_planner.trainer.models import build_model


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


def _device(tr: dict[str, Any], local_rank: int = 0) -> torch.device:
    """CUDA when train.device says so, or when it is auto, train.gpu is a GPU type and CUDA is there."""
    wants_gpu = tr["device"] == "cuda" or (tr["device"] == "auto" and tr.get("gpu", "cpu") != "cpu")
    if wants_gpu and torch.cuda.is_available():
        from pretrain_planner.trainer.parallel import device_index  # the trainer's one device rule

        return torch.device("cuda", device_index(local_rank, torch.cuda.device_count()))
    return torch.device("cpu")


class Ranks:
    """This process's place in the data-parallel run: rank, world size, and the few collectives the loop
    needs (agreeing on elapsed time, on a stop signal, and the mean loss). One rank: no process group."""

    def __init__(self, world_size: int, device_of, group_for_one: bool = False) -> None:
        import datetime as dt

        import torch.distributed as torch_dist

        self.rank, self.world, self.local_rank = 0, 1, 0
        self.backend: str | None = None
        self._env_set: list[str] = []  # variables this process's one-rank group set (an in-process run)
        if world_size > 1:
            from submitit.helpers import TorchDistributedEnvironment

            if "SUBMITIT_EXECUTOR" not in os.environ:
                raise RuntimeError(f"{world_size} ranks: run the pre-training through the local or slurm launcher")
            env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
            self.rank, self.world, self.local_rank = env.rank, env.world_size, env.local_rank
            if self.world != world_size:
                raise RuntimeError(f"launched with {self.world} tasks, the setting needs {world_size}")
        self.device = device_of(self.local_rank)
        if self.world > 1 or group_for_one:
            from pretrain_planner.trainer.parallel import eager_init_kwargs, process_group_backend

            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            # the trainer's: NCCL + gloo on GPUs (FSDP2 offload's CPU gradient norms), communicators made eagerly
            backend = process_group_backend(self.device)
            if self.world > 1:
                torch_dist.init_process_group(
                    backend, timeout=dt.timedelta(minutes=30), **eager_init_kwargs(self.device, self.world)
                )
            else:  # FSDP's mesh and DeepSpeed's engine need a process group even on one rank
                if torch_dist.is_initialized():
                    raise RuntimeError("a sharded method on one rank needs this process's process group: run the "
                                       "pre-training through the local or slurm launcher")  # fmt: skip
                for var, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
                    if var not in os.environ:  # DeepSpeed reads them; close() takes them back
                        os.environ[var] = value
                        self._env_set.append(var)
                torch_dist.init_process_group(backend, store=torch_dist.HashStore(), rank=0, world_size=1)
            self.backend = backend

    def env(self):
        """The trainer's view of this rank (trainer.parallel.RankEnv)."""
        from pretrain_planner.trainer.parallel import RankEnv

        return RankEnv(self.rank, self.world, self.local_rank, self.device, self.backend)

    def max(self, *values: float) -> list[float]:
        """The largest of each value over the ranks (elapsed time: the slowest rank's; a signal: anyone's)."""
        if self.world == 1:
            return list(values)
        import torch.distributed as torch_dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
        return t.tolist()

    def mean(self, value: float) -> float:
        if self.world == 1:
            return value
        import torch.distributed as torch_dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch_dist.all_reduce(t)
        return float(t.item()) / self.world

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as torch_dist

            torch_dist.barrier()

    def close(self) -> None:
        if self.backend is not None:
            import torch.distributed as torch_dist

            if torch_dist.is_initialized():
                torch_dist.destroy_process_group()
            from pretrain_planner.trainer.parallel import forget_deepspeed_groups

            forget_deepspeed_groups()
        for var in self._env_set:  # an in-process run must not leave a distributed environment behind
            os.environ.pop(var, None)
        self._env_set.clear()


def _step_seed(seed: int, rank: int, step: int) -> int:
    """The RNG seed of one rank's step (dropout): a resumed run draws what the uninterrupted one drew, with no
    per-rank RNG state in the checkpoint."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1, dtype=np.uint64)[0] >> 1)


def _truncate_jsonl(path: Path, step: int) -> None:
    if not path.exists():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
    atomic_write_text(path, "".join(ln + "\n" for ln in keep))


def save_model(
    model: torch.nn.Module, out_dir: Path, tokenizer: Path, info: dict[str, Any], state: dict[str, Any] | None = None
) -> None:
    """A transformers model folder (config.json + weights) with tokenizer.json and what produced it. `state`:
    the full weights of a sharded model (then `model` is a fresh unsharded one of the same class)."""
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if state is not None:
        model.load_state_dict(state)
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
        try:
            return _pretrain(*args, **kwargs)
        finally:  # a run that failed may leave its process group (a one-rank sharded run's is in-process)
            import torch.distributed as torch_dist

            if torch_dist.is_available() and torch_dist.is_initialized():
                torch_dist.destroy_process_group()


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

    from pretrain_planner.planning.methods import parse

    transformers.utils.logging.disable_progress_bar()
    tr = cfg["train"]
    setting = setting_of(cfg)
    index_path, run_dir, out_model = Path(index_path), Path(run_dir), Path(out_model)
    threads = tr["threads"] or threads
    if threads:
        torch.set_num_threads(threads)
    sharded = bool(parse(setting["method"], "train.method").sharding)
    ranks = Ranks(setting["world_size"], lambda local: _device(tr, local), group_for_one=sharded)
    rank0 = ranks.rank == 0
    logger = file_logger("pretrain", log if rank0 else None)
    device = ranks.device
    data_dir = index_path.parent
    index = json.loads(index_path.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    budget_s = tr["budget_hours"] * 3600.0
    micro, accum, world = setting["micro_batch"], setting["grad_accum_steps"], ranks.world
    global_batch = micro * accum * world
    pad_id = index["special_ids"]["pad"]
    mdict = model_dict(cfg, index)
    keyed = {k: v for k, v in tr.items() if k not in ("max_steps", "checkpoint_every_s", "log_every", "device",
                                                        "threads", "setting", "micro_batch", "method")}  # fmt: skip
    used = {k: setting[k] for k in ("micro_batch", "grad_accum_steps", "world_size", "method")}
    fp = fingerprint(index["fingerprint"], cfg["seed"], mdict, keyed, used)

    # the benchmark's method through the trainer's machinery (budget/method.py); the same weights on every rank
    mcfg = bmethod.config_of(tr, setting["method"], mdict, device)
    built = bmethod.build(mcfg, ranks.env(), mdict, micro, accum, cfg["seed"], fl_attn=tr["attn_implementation"])
    model, step_fn, method_settings = built.net, built.step, built.settings
    attn = method_settings["attn_implementation"]
    amp_dtype = built.autocast_dtype
    ds_dir = run_dir / "deepspeed"
    plain: list[torch.nn.Module] = []

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)

    def save_full(out_dir: Path, info: dict[str, Any]) -> None:
        """Every rank (gathering a sharded model's weights is a collective); rank 0 writes the model folder."""
        full = built.full_state()
        if rank0:
            if full is not None and not plain:  # an unsharded copy to save from
                plain.append(build_model(mdict, attn, fused_ce=mcfg.method.fused_ce)[0])
            save_model(model if full is None else plain[0], out_dir, data_dir / index["tokenizer"], info, full)

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
        built.load_state_dicts(ck, ds_dir)
        if step_fn.scaler is not None and ck["scaler"]:
            step_fn.scaler.load_state_dict(ck["scaler"])
        sampler.load_state(ck["sampler"])
        state = ck["state"]
        logger.info("resumed at step %d, %.1f s of %.1f s budget used", state["step"], state["elapsed_s"], budget_s)
    elif rank0:
        steps_path.unlink(missing_ok=True)
        val_path.unlink(missing_ok=True)
        logger.info(
            "start: model %s (%s, %.1fM parameters, attention %s, %s) on %d x %s, budget %.1f s, "
            "batch %d = %d x %d x %d ranks, method %s (setting from %s)",
            mdict["name"], mdict["family"], sum(p.numel() for p in model.parameters()) / 1e6, attn,
            type(model).__name__, world, device, budget_s, global_batch, micro, accum, world, setting["method"],
            setting["source"],
        )  # fmt: skip
    if rank0:
        _truncate_jsonl(steps_path, state["step"])
        _truncate_jsonl(val_path, state["step"])
    ranks.barrier()  # rank 0 has read the checkpoint before anyone can overwrite it

    def checkpoint() -> None:
        """Rank 0 writes (DDP: every rank holds the same weights and optimizer state; FSDP2: gathered into full
        state dicts; ZeRO: every rank writes its shards into run_dir/deepspeed first, checkpoint.pt names them);
        the others wait, so that the write is not counted in the next step's time."""
        t0 = time.perf_counter()
        tag = f"step{state['step']}"
        parts = built.state_dicts(ds_dir, tag)  # a collective under FSDP2 / ZeRO
        if not rank0:
            ranks.barrier()
            return
        ck = {
            "fingerprint": fp, **parts, "scaler": step_fn.scaler.state_dict() if step_fn.scaler else {},
            "sampler": sampler.state(), "state": dict(state),
        }  # fmt: skip
        tmp = ckpt_path.with_name(".checkpoint.pt.tmp")
        torch.save(ck, tmp)
        os.replace(tmp, ckpt_path)
        job_progress.mark(state["step"], "checkpointed step")  # a time-out requeue must get further than this
        built.prune_deepspeed(ds_dir, keep=tag)
        logger.info("checkpoint at step %d (%.2f s to write)", state["step"], time.perf_counter() - t0)
        ranks.barrier()

    # SIGTERM/SIGUSR1 (SLURM pre-emption, a time-limit warning), and submitit's own pre-emption signal (USR2)
    # when it installed a handler: finish the step, checkpoint, then hand over to submitit (requeue).
    signalled: list[int] = []
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        sigs = [signal.SIGTERM, signal.SIGUSR1]
        preempt = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
        if preempt is not None and callable(signal.getsignal(preempt)) and preempt not in sigs:
            sigs.append(preempt)
        for sig in sigs:
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
        logs = (steps_path, val_path) if rank0 else (Path(os.devnull), Path(os.devnull))  # rank 0 writes
        with logs[0].open("a") as steps_fh, logs[1].open("a") as val_fh:
            while state["stop"] is None:
                progress = state["elapsed_s"] / budget_s
                if progress >= 1.0:
                    state["stop"] = "budget"
                    break
                if tr["max_steps"] is not None and state["step"] >= tr["max_steps"]:
                    state["stop"] = "max_steps"
                    break
                lr = schedule.lr_at(state["elapsed_s"], budget_s, tr["lr"], tr["warmup_fraction"])
                built.set_lr(lr)
                torch.manual_seed(_step_seed(cfg["seed"], ranks.rank, state["step"]))
                sync()
                t0 = time.perf_counter()
                micro_losses = []  # on the device: read once after the step, not after every micro-batch (a host sync)
                for i in range(accum):
                    # each rank trains on its own micro-batch of the global stream (the sampler state stays
                    # the same on every rank, so rank 0's checkpoint resumes them all)
                    part = sampler.take(micro * world)
                    part = {a: v[ranks.rank * micro : (ranks.rank + 1) * micro] for a, v in part.items()}
                    batch = to_batch(part, pad_id, device)
                    # trainer.step: DDP all-reduces on the last micro-batch only (no_sync before), FSDP2
                    # reduce-scatters each, ZeRO marks the accumulation boundary; autocast / loss scaling
                    micro_losses.append(step_fn.micro(batch, 1.0 / accum, sync_grads=i == accum - 1).float())
                step_fn.optimizer_step()  # clipping (train.grad_clip), the optimizer, zeroed gradients
                if "observed" not in method_settings:  # what the evidence probe saw in the first micro-batch
                    method_settings["observed"] = built.observed()
                dt, stop_sig = ranks.max(clock(t0, tr["fake_step_s"] or 0.0), float(signalled[0] if signalled else 0))
                loss_sum = ranks.mean(float(torch.stack(micro_losses).sum()))
                state["elapsed_s"] += dt
                state["step"] += 1
                progress = state["elapsed_s"] / budget_s
                if rank0:
                    rec = {"step": state["step"], "elapsed_s": round(state["elapsed_s"], 6),
                           "progress": round(progress, 6), "lr": lr, "loss": loss_sum,
                           "step_time_s": round(dt, 6)}  # fmt: skip
                    steps_fh.write(json.dumps(rec) + "\n")
                    steps_fh.flush()
                if state["step"] % tr["log_every"] == 0 or state["step"] == 1:
                    logger.info("step %d progress %.4f lr %.3g loss %.4f (%.3f s)", state["step"], progress, lr,
                                loss_sum, dt)  # fmt: skip

                if val_idx < len(val_points) and progress >= val_points[val_idx]:
                    t0 = time.perf_counter()
                    vl = validation_loss(model, index["splits"]["validation"], data_dir, pad_id, micro,
                                         tr["validation"]["max_samples"], device, autocast)  # fmt: skip
                    (dv,) = ranks.max(clock(t0, 0.0))
                    state["elapsed_s"] += dv
                    state["val_s"] += dv
                    state["last_val_loss"] = vl
                    val_idx = schedule.next_after(val_points, progress)
                    if rank0:
                        rec = {"step": state["step"], "progress": round(progress, 6), "val_loss": vl}
                        val_fh.write(json.dumps(rec) + "\n")
                        val_fh.flush()
                    logger.info("validation at step %d progress %.4f: loss %.4f", state["step"], progress, vl)
                    state["stop"] = schedule.early_stop(tr["early_stop"], progress, vl)
                    if state["stop"]:
                        logger.info(state["stop"])
                while ft_idx < len(ft_points) and progress >= ft_points[ft_idx]:
                    d = run_dir / f"finetune-{ft_points[ft_idx]:.2f}"
                    save_full(d, {"step": state["step"], "progress": progress})
                    if rank0:
                        logger.info("fine-tuning checkpoint %s at step %d", d, state["step"])
                    ranks.barrier()
                    ft_idx += 1
                if state["elapsed_s"] - last_ckpt >= tr["checkpoint_every_s"] or stop_sig:
                    checkpoint()
                    last_ckpt = state["elapsed_s"]
                if stop_sig:
                    sig = int(stop_sig)
                    logger.info("signal %d at step %d: checkpoint saved, stopping", sig, state["step"])
                    handler = previous.get(sig)
                    if callable(handler):  # submitit's: rank 0 requeues the job and exits
                        handler(sig, None)
                    raise SystemExit(f"pretrain: signal {sig} at step {state['step']}; checkpoint saved")
                if kill_at_step is not None and state["step"] >= kill_at_step and rank0:
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
    save_full(out_model, info)
    if not rank0:
        ranks.close()
        return {"rank": ranks.rank}
    losses = [json.loads(ln)["loss"] for ln in steps_path.read_text().splitlines() if ln.strip()]
    k = max(1, len(losses) // 10)
    result = {
        "model": mdict["name"], "family": mdict["family"], "device": str(device), "precision": tr["precision"],
        "steps": state["step"], "budget_s": budget_s, "elapsed_s": state["elapsed_s"], "validation_s": state["val_s"],
        "stop_reason": state["stop"], "micro_batch": micro, "grad_accum_steps": accum, "world_size": world,
        "global_batch": global_batch, "setting": setting, "method_settings": method_settings,
        "sparse_prediction": bool(mdict["arch"].get("sparse_prediction")), "model_class": type(model).__name__,
        "tokens_per_s": state["step"] * global_batch * index["seq_len"] / max(state["elapsed_s"], 1e-9),
        "loss_first": float(np.mean(losses[:k])) if losses else None,
        "loss_last": float(np.mean(losses[-k:])) if losses else None,
        "val_loss": state["last_val_loss"],
        "finetune_checkpoints": sorted(str(p) for p in run_dir.glob("finetune-*")),
        "run_dir": str(run_dir), "model_dir": str(out_model),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }  # fmt: skip
    if global_batch != tr["global_batch"]:
        result["note"] = f"global batch {global_batch} (the benchmark's setting) instead of train.global_batch"
    atomic_write_text(out_result, json.dumps(result, indent=1))
    ranks.close()
    return result
