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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pretrain_planner.budget import method as bmethod
from pretrain_planner.budget import schedule
from pretrain_planner.budget.config import (
    TORCH_LOCK,
    file_logger,
    fingerprint,
    set_torch_threads,
    setting_of,
    wants_gpu,
)
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
    if wants_gpu(tr) and torch.cuda.is_available():
        from pretrain_planner.trainer.rank import device_index  # the trainer's one device rule

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
            from pretrain_planner.trainer.rank import eager_init_kwargs, process_group_backend

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
        from pretrain_planner.trainer.rank import RankEnv

        return RankEnv(self.rank, self.world, self.local_rank, self.device, self.backend)

    def _all_reduce(self, values, op: str) -> torch.Tensor:
        """The values (float64, on this rank's device) reduced over the ranks with ReduceOp `op`."""
        import torch.distributed as torch_dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch_dist.all_reduce(t, op=getattr(torch_dist.ReduceOp, op))
        return t

    def max(self, *values: float) -> list[float]:
        """The largest of each value over the ranks (elapsed time: the slowest rank's; a signal: anyone's)."""
        if self.world == 1:
            return list(values)
        return self._all_reduce(values, "MAX").tolist()

    def mean(self, value: float) -> float:
        """The mean over the ranks (the step's loss)."""
        if self.world == 1:
            return value
        return float(self._all_reduce([value], "SUM").item()) / self.world

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as torch_dist

            torch_dist.barrier()

    def close(self) -> None:
        if self.backend is not None:
            import torch.distributed as torch_dist

            if torch_dist.is_initialized():
                torch_dist.destroy_process_group()
            from pretrain_planner.trainer.rank import forget_deepspeed_groups

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

    transformers.utils.logging.disable_progress_bar()
    run = _Run(cfg, Path(index_path), Path(run_dir), log, threads)
    run.build_method()
    run.resume_or_start()
    with _stop_signals() as (signalled, previous):
        run.train(signalled, previous, kill_at_step, kill_signal)
    return run.finish(Path(out_model), out_result)


def _run_fingerprint(cfg: dict[str, Any], setting: dict[str, Any], index: dict[str, Any], mdict: dict[str, Any]) -> str:
    """What a checkpoint must match to be resumed: data, seed, model, the training settings that change the
    result and the setting actually used (not the logging, checkpoint cadence, device or thread settings)."""
    keyed = {k: v for k, v in cfg["train"].items() if k not in ("max_steps", "checkpoint_every_s", "log_every",
                                                                  "device", "threads", "setting", "micro_batch",
                                                                  "method")}  # fmt: skip
    used = {k: setting[k] for k in ("micro_batch", "grad_accum_steps", "world_size", "method")}
    return fingerprint(index["fingerprint"], cfg["seed"], mdict, keyed, used)


@contextmanager
def _stop_signals() -> Iterator[tuple[list[int], dict[int, Any]]]:
    """SIGTERM/SIGUSR1 (SLURM pre-emption, a time-limit warning), and submitit's own pre-emption signal (USR2)
    when it installed a handler, recorded (not acted on) while the loop runs: the loop finishes the step,
    checkpoints, then hands over to submitit's handler (`previous`: requeue). The handlers are put back after."""
    signalled: list[int] = []
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        sigs = [signal.SIGTERM, signal.SIGUSR1]
        preempt = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
        if preempt is not None and callable(signal.getsignal(preempt)) and preempt not in sigs:
            sigs.append(preempt)
        for sig in sigs:
            previous[sig] = signal.signal(sig, lambda s, _f: signalled.append(s))
    try:
        yield signalled, previous
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _append_jsonl(fh, rec: dict[str, Any]) -> None:
    """One record of steps.jsonl / validation.jsonl, flushed: a killed run keeps what it logged."""
    fh.write(json.dumps(rec) + "\n")
    fh.flush()


class _Run:
    """One pre-training process: its ranks, data, model and method, sampler and progress state; the parts of
    the run (set-up, resume, step loop, validation, checkpoints, final write) are its methods."""

    def __init__(self, cfg: dict[str, Any], index_path: Path, run_dir: Path, log, threads: int | None) -> None:
        """Ranks (process group), log, index and the run's sizes and fingerprint."""
        from pretrain_planner.planning.methods import parse

        self.cfg, self.tr, self.setting = cfg, cfg["train"], setting_of(cfg)
        tr, setting = self.tr, self.setting
        set_torch_threads(tr, threads)
        sharded = bool(parse(setting["method"], "train.method").sharding)
        self.ranks = Ranks(setting["world_size"], lambda local: _device(tr, local), group_for_one=sharded)
        self.rank0 = self.ranks.rank == 0
        self.logger = file_logger("pretrain", log if self.rank0 else None)
        self.device = self.ranks.device
        self.data_dir = index_path.parent
        self.index = json.loads(index_path.read_text())
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.budget_s = tr["budget_hours"] * 3600.0
        self.micro, self.accum, self.world = setting["micro_batch"], setting["grad_accum_steps"], self.ranks.world
        self.global_batch = self.micro * self.accum * self.world
        self.pad_id = self.index["special_ids"]["pad"]
        self.mdict = model_dict(cfg, self.index)
        self.fp = _run_fingerprint(cfg, setting, self.index, self.mdict)
        self.ckpt_path = run_dir / "checkpoint.pt"
        self.steps_path, self.val_path = run_dir / "steps.jsonl", run_dir / "validation.jsonl"
        self.ds_dir = run_dir / "deepspeed"

    def build_method(self) -> None:
        """The benchmark's method through the trainer's machinery (budget/method.py); the same weights on every
        rank."""
        self.mcfg = bmethod.config_of(self.tr, self.setting["method"], self.mdict, self.device)
        self.built = bmethod.build(self.mcfg, self.ranks.env(), self.mdict, self.micro, self.accum, self.cfg["seed"],
                                   fl_attn=self.tr["attn_implementation"])  # fmt: skip
        self.model, self.step_fn, self.method_settings = self.built.net, self.built.step, self.built.settings
        self.attn = self.method_settings["attn_implementation"]
        self.amp_dtype = self.built.autocast_dtype
        self.plain: list[torch.nn.Module] = []  # an unsharded model to save a sharded one's weights from

    def resume_or_start(self) -> None:
        """The sampler and progress state: from run_dir/checkpoint.pt when it is there (and belongs to this
        configuration), else fresh; the step logs cut back to the checkpoint's step."""
        tr, cfg, index = self.tr, self.cfg, self.index
        self.sampler = ShardSampler(self.data_dir, index["splits"]["train"], index["duplication_factor"], cfg["seed"])
        self.val_points = schedule.validation_points(tr["validation"])
        self.ft_points = sorted(tr["finetune_checkpoints"])
        self.state: dict[str, Any] = {"step": 0, "elapsed_s": 0.0, "val_s": 0.0, "last_val_loss": None, "stop": None}
        if self.ckpt_path.exists():
            self._load_checkpoint()
        elif self.rank0:
            self.steps_path.unlink(missing_ok=True)
            self.val_path.unlink(missing_ok=True)
            self._log_start()
        if self.rank0:
            _truncate_jsonl(self.steps_path, self.state["step"])
            _truncate_jsonl(self.val_path, self.state["step"])
        self.ranks.barrier()  # rank 0 has read the checkpoint before anyone can overwrite it

    def _load_checkpoint(self) -> None:
        """Every rank: weights, optimizer, loss scaler, sampler position and progress from checkpoint.pt."""
        ck = torch.load(self.ckpt_path, map_location="cpu", weights_only=False)
        if ck["fingerprint"] != self.fp:
            raise RuntimeError(f"{self.ckpt_path} belongs to another configuration or data; delete {self.run_dir} "
                               "to start over")  # fmt: skip
        self.built.load_state_dicts(ck, self.ds_dir)
        if self.step_fn.scaler is not None and ck["scaler"]:
            self.step_fn.scaler.load_state_dict(ck["scaler"])
        self.sampler.load_state(ck["sampler"])
        self.state = ck["state"]
        self.logger.info("resumed at step %d, %.1f s of %.1f s budget used", self.state["step"],
                         self.state["elapsed_s"], self.budget_s)  # fmt: skip

    def _log_start(self) -> None:
        """The log's first line of a fresh run: model, ranks, budget, batch and method."""
        mdict, model, world = self.mdict, self.model, self.world
        self.logger.info(
            "start: model %s (%s, %.1fM parameters, attention %s, %s) on %d x %s, budget %.1f s, "
            "batch %d = %d x %d x %d ranks, method %s (setting from %s)",
            mdict["name"], mdict["family"], sum(p.numel() for p in model.parameters()) / 1e6, self.attn,
            type(model).__name__, world, self.device, self.budget_s, self.global_batch, self.micro, self.accum, world,
            self.setting["method"], self.setting["source"],
        )  # fmt: skip

    # -- the clock ---------------------------------------------------------------------------------------
    def _sync(self) -> None:
        """Wait for the GPU's queued work, so that a step's time is the work's, not its launch's."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _clock(self, t0: float, fake: float) -> float:
        """Seconds since t0 (the device's work finished), or `fake` under train.fake_step_s."""
        if self.tr["fake_step_s"] is not None:
            return fake
        self._sync()
        return time.perf_counter() - t0

    def _autocast(self):
        """Validation's autocast: the method's compute dtype (none under fp32 or when the method casts)."""
        return torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None)

    # -- the step loop -----------------------------------------------------------------------------------
    def train(self, signalled: list[int], previous: dict[int, Any], kill_at_step: int | None, kill_signal: int):
        """Optimizer steps until the budget, train.max_steps, an early stop or a signal ends the run; after
        each: the step log, validation, fine-tuning checkpoints and checkpoints when due."""
        tr, state = self.tr, self.state
        self.val_idx = schedule.next_after(self.val_points, state["elapsed_s"] / self.budget_s)
        self.ft_idx = schedule.next_after(self.ft_points, state["elapsed_s"] / self.budget_s)
        last_ckpt = state["elapsed_s"]
        logs = (self.steps_path, self.val_path) if self.rank0 else (Path(os.devnull), Path(os.devnull))  # rank 0
        with logs[0].open("a") as steps_fh, logs[1].open("a") as val_fh:
            while state["stop"] is None:
                if self._out_of_steps():
                    break
                stop_sig = self._step(signalled, steps_fh)
                progress = state["elapsed_s"] / self.budget_s
                if self.val_idx < len(self.val_points) and progress >= self.val_points[self.val_idx]:
                    self._validate(progress, val_fh)
                self._finetune_checkpoints(progress)
                if state["elapsed_s"] - last_ckpt >= tr["checkpoint_every_s"] or stop_sig:
                    self.checkpoint()
                    last_ckpt = state["elapsed_s"]
                if stop_sig:
                    self._stop_on_signal(int(stop_sig), previous)
                if kill_at_step is not None and state["step"] >= kill_at_step and self.rank0:
                    os.kill(os.getpid(), kill_signal)

    def _out_of_steps(self) -> bool:
        """Whether the budget or train.max_steps ends the run before another step (state["stop"] says which)."""
        state = self.state
        if state["elapsed_s"] / self.budget_s >= 1.0:
            state["stop"] = "budget"
        elif self.tr["max_steps"] is not None and state["step"] >= self.tr["max_steps"]:
            state["stop"] = "max_steps"
        return state["stop"] is not None

    def _step(self, signalled: list[int], steps_fh) -> float:
        """One optimizer step over the global batch; the ranks agree on its time and on any stop signal (the
        signal's number, 0 for none, is returned). Logged in steps.jsonl and every train.log_every steps."""
        tr, state, ranks, micro, accum = self.tr, self.state, self.ranks, self.micro, self.accum
        lr = schedule.lr_at(state["elapsed_s"], self.budget_s, tr["lr"], tr["warmup_fraction"])
        self.built.set_lr(lr)
        torch.manual_seed(_step_seed(self.cfg["seed"], ranks.rank, state["step"]))
        self._sync()
        t0 = time.perf_counter()
        micro_losses = []  # on the device: read once after the step, not after every micro-batch (a host sync)
        for i in range(accum):
            # each rank trains on its own micro-batch of the global stream (the sampler state stays the same on
            # every rank, so rank 0's checkpoint resumes them all)
            part = self.sampler.take(micro * self.world)
            part = {a: v[ranks.rank * micro : (ranks.rank + 1) * micro] for a, v in part.items()}
            batch = to_batch(part, self.pad_id, self.device)
            # trainer.step: DDP all-reduces on the last micro-batch only (no_sync before), FSDP2 reduce-scatters
            # each, ZeRO marks the accumulation boundary; autocast / loss scaling
            micro_losses.append(self.step_fn.micro(batch, 1.0 / accum, sync_grads=i == accum - 1).float())
        self.step_fn.optimizer_step()  # clipping (train.grad_clip), the optimizer, zeroed gradients
        if "observed" not in self.method_settings:  # what the evidence probe saw in the first micro-batch
            self.method_settings["observed"] = self.built.observed()
        dt, stop_sig = ranks.max(self._clock(t0, tr["fake_step_s"] or 0.0), float(signalled[0] if signalled else 0))
        loss_sum = ranks.mean(float(torch.stack(micro_losses).sum()))
        state["elapsed_s"] += dt
        state["step"] += 1
        progress = state["elapsed_s"] / self.budget_s
        if self.rank0:
            _append_jsonl(steps_fh, {"step": state["step"], "elapsed_s": round(state["elapsed_s"], 6),
                                     "progress": round(progress, 6), "lr": lr, "loss": loss_sum,
                                     "step_time_s": round(dt, 6)})  # fmt: skip
        if state["step"] % tr["log_every"] == 0 or state["step"] == 1:
            self.logger.info("step %d progress %.4f lr %.3g loss %.4f (%.3f s)", state["step"], progress, lr,
                             loss_sum, dt)  # fmt: skip
        return stop_sig

    def _validation_loss(self) -> float:
        """The validation loss of the model now (at a validation point and at the end)."""
        return validation_loss(self.model, self.index["splits"]["validation"], self.data_dir, self.pad_id, self.micro,
                               self.tr["validation"]["max_samples"], self.device, self._autocast)  # fmt: skip

    def _validate(self, progress: float, val_fh) -> None:
        """A validation point: the loss (its time counts as training time), validation.jsonl, the early stop."""
        state = self.state
        t0 = time.perf_counter()
        vl = self._validation_loss()
        (dv,) = self.ranks.max(self._clock(t0, 0.0))
        state["elapsed_s"] += dv
        state["val_s"] += dv
        state["last_val_loss"] = vl
        self.val_idx = schedule.next_after(self.val_points, progress)
        if self.rank0:
            _append_jsonl(val_fh, {"step": state["step"], "progress": round(progress, 6), "val_loss": vl})
        self.logger.info("validation at step %d progress %.4f: loss %.4f", state["step"], progress, vl)
        state["stop"] = schedule.early_stop(self.tr["early_stop"], progress, vl)
        if state["stop"]:
            self.logger.info(state["stop"])

    def _finetune_checkpoints(self, progress: float) -> None:
        """The model folders run_dir/finetune-<p> of every fine-tuning point that progress has passed."""
        while self.ft_idx < len(self.ft_points) and progress >= self.ft_points[self.ft_idx]:
            d = self.run_dir / f"finetune-{self.ft_points[self.ft_idx]:.2f}"
            self.save_full(d, {"step": self.state["step"], "progress": progress})
            if self.rank0:
                self.logger.info("fine-tuning checkpoint %s at step %d", d, self.state["step"])
            self.ranks.barrier()
            self.ft_idx += 1

    def _stop_on_signal(self, sig: int, previous: dict[int, Any]) -> None:
        """After the checkpoint of a signalled step: hand over to submitit's handler (rank 0 requeues the job and
        exits) or end the run with SystemExit."""
        self.logger.info("signal %d at step %d: checkpoint saved, stopping", sig, self.state["step"])
        handler = previous.get(sig)
        if callable(handler):
            handler(sig, None)
        raise SystemExit(f"pretrain: signal {sig} at step {self.state['step']}; checkpoint saved")

    # -- checkpoints and model folders ------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Rank 0 writes (DDP: every rank holds the same weights and optimizer state; FSDP2: gathered into full
        state dicts; ZeRO: every rank writes its shards into run_dir/deepspeed first, checkpoint.pt names them);
        the others wait, so that the write is not counted in the next step's time."""
        t0 = time.perf_counter()
        tag = f"step{self.state['step']}"
        parts = self.built.state_dicts(self.ds_dir, tag)  # a collective under FSDP2 / ZeRO
        if not self.rank0:
            self.ranks.barrier()
            return
        scaler = self.step_fn.scaler
        ck = {
            "fingerprint": self.fp, **parts, "scaler": scaler.state_dict() if scaler else {},
            "sampler": self.sampler.state(), "state": dict(self.state),
        }  # fmt: skip
        tmp = self.ckpt_path.with_name(".checkpoint.pt.tmp")
        torch.save(ck, tmp)
        os.replace(tmp, self.ckpt_path)
        job_progress.mark(self.state["step"], "checkpointed step")  # a time-out requeue must get further than this
        self.built.prune_deepspeed(self.ds_dir, keep=tag)
        self.logger.info("checkpoint at step %d (%.2f s to write)", self.state["step"], time.perf_counter() - t0)
        self.ranks.barrier()

    def save_full(self, out_dir: Path, info: dict[str, Any]) -> None:
        """Every rank (gathering a sharded model's weights is a collective); rank 0 writes the model folder."""
        full = self.built.full_state()
        if self.rank0:
            if full is not None and not self.plain:  # an unsharded copy to save from
                self.plain.append(build_model(self.mdict, self.attn, fused_ce=self.mcfg.method.fused_ce)[0])
            model = self.model if full is None else self.plain[0]
            save_model(model, out_dir, self.data_dir / self.index["tokenizer"], info, full)

    # -- the end -----------------------------------------------------------------------------------------
    def finish(self, out_model: Path, out_result: str | Path) -> dict[str, Any]:
        """After the loop: a last validation when the last point was not reached, the last checkpoint, the model
        folder; rank 0 writes the result JSON. Closes the process group."""
        state = self.state
        self.logger.info("stopped (%s) at step %d, %.1f s of training time", state["stop"], state["step"],
                         state["elapsed_s"])  # fmt: skip
        if state["last_val_loss"] is None or self.val_idx < len(self.val_points):
            state["last_val_loss"] = self._validation_loss()
        self.checkpoint()
        info = {"model": self.mdict, "step": state["step"], "elapsed_s": state["elapsed_s"], "stop": state["stop"]}
        self.save_full(out_model, info)
        if not self.rank0:
            self.ranks.close()
            return {"rank": self.ranks.rank}
        result = self._result(out_model)
        atomic_write_text(out_result, json.dumps(result, indent=1))
        self.ranks.close()
        return result

    def _result(self, out_model: Path) -> dict[str, Any]:
        """The result JSON: steps, time, stop reason, the setting and method, throughput and losses."""
        state, tr, mdict, gb = self.state, self.tr, self.mdict, self.global_batch
        losses = [json.loads(ln)["loss"] for ln in self.steps_path.read_text().splitlines() if ln.strip()]
        k = max(1, len(losses) // 10)
        result = {
            "model": mdict["name"], "family": mdict["family"], "device": str(self.device), "precision": tr["precision"],
            "steps": state["step"], "budget_s": self.budget_s, "elapsed_s": state["elapsed_s"],
            "validation_s": state["val_s"], "stop_reason": state["stop"], "micro_batch": self.micro,
            "grad_accum_steps": self.accum, "world_size": self.world, "global_batch": gb, "setting": self.setting,
            "method_settings": self.method_settings, "sparse_prediction": bool(mdict["arch"].get("sparse_prediction")),
            "model_class": type(self.model).__name__,
            "tokens_per_s": state["step"] * gb * self.index["seq_len"] / max(state["elapsed_s"], 1e-9),
            "loss_first": float(np.mean(losses[:k])) if losses else None,
            "loss_last": float(np.mean(losses[-k:])) if losses else None,
            "val_loss": state["last_val_loss"],
            "finetune_checkpoints": sorted(str(p) for p in self.run_dir.glob("finetune-*")),
            "run_dir": str(self.run_dir), "model_dir": str(out_model),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        }  # fmt: skip
        if gb != tr["global_batch"]:
            result["note"] = f"global batch {gb} (the benchmark's setting) instead of train.global_batch"
        return result
