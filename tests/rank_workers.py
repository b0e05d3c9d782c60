"""What each rank runs in the multi-rank tests of test_gpu_paths.py (started by benchmarks/multirank.py: one
process per rank, the local launcher's environment, real gloo groups). Each function takes the JSON payload
and returns JSON data for the test to check; a failure raises (the runner reports it per rank)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run_config(model: str, method: str, ranks: int, *, precision: str | None = "fp32", **bench: Any):
    """The RunConfig of a `cpu` cell, as the planner would hand it to the job (fp32: fast on CPUs)."""
    from pretrain_planner.planning.catalog import load_catalog
    from pretrain_planner.planning.configtypes import BenchmarkSection, LauncherSection
    from pretrain_planner.planning.grid import Cell
    from pretrain_planner.planning.spec import cell_spec
    from pretrain_planner.trainer.config import RunConfig

    catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    benchmark = BenchmarkSection.given({"warmup_steps": 1, "timed_steps": 2, "max_micro_batch": 4, "max_spread": 50,
                                        **bench})  # fmt: skip
    launcher = LauncherSection.given({"kind": "local", "timeout_min": 5})
    spec = cell_spec(
        Cell(model, "cpu", 1, ranks, method), catalog, benchmark, launcher, "/nonexistent/r.json", "s.jsonl"
    )
    if precision:
        spec["model"]["recipe"]["precision"] = precision
    return RunConfig.from_spec(spec), spec


def _reduce_scatters(step, batches, accum: int) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(batches, accum)
    return sum(1 for e in prof.events() if e.name.startswith("c10d::") and "reduce_scatter" in e.name)


def fsdp_paths(payload: dict[str, Any]) -> dict[str, Any]:
    """FSDP2 on 2 ranks: reduce-scatters per step (item 8), rank 1 built on the meta device gets rank 0's weights
    (item 7), offload + clipping runs (item 1), the fp16 scaler uses the live group after a rebuild (item 3)."""
    import torch
    from pretrain_planner.trainer.measure import batches_for
    from pretrain_planner.trainer.methodbuild import build_with_extras
    from pretrain_planner.trainer.rank import close_rank, init_rank
    from pretrain_planner.trainer.run import make_builder

    out: dict[str, Any] = {}
    cfg, _ = run_config("tiny-gptneox", "naive+fsdp-grad", 2)
    env = init_rank(cfg)
    try:
        # item 8: accumulation 4 -> one reduce-scatter per FSDP unit and step, not one per micro-batch
        batches = batches_for(cfg, env, 2, 2)
        step = make_builder(cfg, env, [])(2, 4)
        units = sum(1 for m in step.applied.raw.modules() if type(m).__name__.startswith("FSDP"))
        step(batches, 4)  # lazy init
        out["units"] = units
        out["rs_last"] = _reduce_scatters(step, batches, 4)
        weights = {}
        if hasattr(step, "set_grad_sync"):
            step.close()
            for mode in ("last", "every"):
                step = make_builder(cfg, env, [])(2, 4)
                step.set_grad_sync(mode)
                for i in range(4):  # the gradients a step hands to the optimizer, in both modes
                    step.micro(batches[i % 2], 0.25, sync_grads=i == 3)
                weights[mode] = {n: p.grad.full_tensor().clone() for n, p in step.applied.raw.named_parameters()}
                step.optimizer_step()
                if mode == "every":
                    out["rs_every"] = _reduce_scatters(step, batches, 4)
                step.close()
            out["last_vs_every_max_rel_diff"] = max(
                ((weights["last"][k] - weights["every"][k]).norm() / weights["every"][k].norm().clamp(min=1e-12)).item()
                for k in weights["last"]
            )
        # item 7: rank 1 builds a skeleton on the meta device; after sharding every rank holds rank 0's weights
        for model, method in (("tiny-bert", "naive+fsdp-full+off"), ("tiny-gptneox", "naive+fsdp-grad")):
            mcfg, _ = run_config(model, method, 2)
            skeleton, _, _ = build_with_extras(mcfg.model, mcfg.method, "eager", None, 0, meta=env.rank != 0)
            ref, _, _ = build_with_extras(mcfg.model, mcfg.method, "eager", None, 0)
            out[f"{model}_rank_built_on_meta"] = all(p.is_meta for p in skeleton.parameters())
            step = make_builder(mcfg, env, [])(2, 2)
            got = {n: p.full_tensor() for n, p in step.applied.raw.named_parameters()}
            want = dict(ref.named_parameters())
            out[f"{model}_max_weight_diff"] = max((got[n].cpu() - want[n]).abs().max().item() for n in want)
            bufs = dict(ref.named_buffers())
            named = step.applied.raw.named_buffers()
            diffs = [(b.cpu().float() - bufs[n].float()).abs().max().item() for n, b in named]
            out[f"{model}_max_buffer_diff"] = max([0.0, *diffs])
            out[f"{model}_build"] = step.settings["fsdp"].get("build")
            # item 1: a step with offload (CPU gradient shards) and gradient clipping
            mb = batches_for(mcfg, env, 2, 1)
            step.grad_clip = 1.0
            out[f"{model}_loss"] = float(step(mb, 2))
            step.close()
        # item 3: ShardedGradScaler after the group was aborted and rebuilt
        out["scaler"] = _scaler_after_rebuild(env, torch)
    finally:
        close_rank(env)
    return out


def _scaler_after_rebuild(env, torch) -> str:
    from pretrain_planner.trainer.parallel import Applied
    from pretrain_planner.trainer.step import TrainStep

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            from types import SimpleNamespace

            return SimpleNamespace(loss=self.lin(x).pow(2).mean())

    def one_step() -> None:
        net = Net()
        applied = Applied(net, net, loss_scaling=True, sharded=True)
        step = TrainStep(applied, torch.optim.AdamW(net.parameters()), 1.0, "cpu")
        step.micro({"x": torch.randn(2, 4)}, 1.0, sync_grads=True)
        step.optimizer_step()  # unscale_: all-reduces the inf flags on the scaler's group

    one_step()  # imports ShardedGradScaler now, with this (first) group alive
    env.rebuild_group()  # an out-of-memory error elsewhere: the group is aborted and replaced
    try:
        one_step()
    except Exception as exc:  # noqa: BLE001 - the result says what failed
        return f"{type(exc).__name__}: {exc}"[:300]
    return "ok"


def fail_in_region(payload: dict[str, Any]) -> dict[str, Any]:
    """Rank 1 fails (not out of memory) inside a guarded region before any collective; rank 0 has finished the
    region and waits for the others' arrival (item 6: it must stop at once, naming rank 1's failure)."""
    from pretrain_planner.trainer.oom import guarded
    from pretrain_planner.trainer.rank import close_rank, init_rank

    cfg, _ = run_config("tiny-gptneox", "naive", 2)
    env = init_rank(cfg)
    t0 = time.monotonic()
    try:
        if env.rank == 1:

            def boom() -> None:
                raise ValueError("boom on rank 1")

            try:
                guarded(env, boom)
            except ValueError as exc:
                if getattr(env, "watch", None) is not None:
                    env.watch.announce(f"{type(exc).__name__}: {exc}")  # what run_rank does with a failure
                raise
        try:
            guarded(env, lambda: None)
        except Exception as exc:  # noqa: BLE001
            return {"error_seen": str(exc), "seconds": time.monotonic() - t0}
        return {"error_seen": None, "seconds": time.monotonic() - t0}
    finally:
        close_rank(env)


def killed_rank(payload: dict[str, Any]) -> dict[str, Any]:
    """Rank 1 is killed (SIGKILL, as the kernel's out-of-memory killer does) while rank 0 waits in a region: rank
    0's watch must notice the silence and end the wait (item 6/7)."""
    from pretrain_planner.trainer.oom import guarded
    from pretrain_planner.trainer.rank import close_rank, init_rank
    from pretrain_planner.trainer.watch import PeerWatch

    cfg, _ = run_config("tiny-gptneox", "naive", 2)
    env = init_rank(cfg)
    env.watch.stop()
    env.watch = PeerWatch(env, stale_s=payload["stale_s"]).start()
    t0 = time.monotonic()
    try:
        if env.rank == 1:
            time.sleep(1.5)  # beat a little first
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            guarded(env, lambda: None)
        except Exception as exc:  # noqa: BLE001
            return {"error_seen": str(exc), "seconds": time.monotonic() - t0, "host_oom": env.watch.host_oom}
        return {"error_seen": None, "seconds": time.monotonic() - t0}
    finally:
        close_rank(env)


def run_cell(payload: dict[str, Any]) -> dict[str, Any]:
    """A whole cell through the trainer's entry point (run_rank) on every rank; rank 0 returns its result."""
    from pretrain_planner.trainer.run import run_rank

    _, spec = run_config(payload["model"], payload["method"], 2, **payload.get("bench", {}))
    spec["outputs"] = {"result": payload["result"], "steps": payload["steps"]}
    out = run_rank(spec)
    return {"rank": out["rank"], "result": out.get("result"), "steps": out.get("steps")}


def run_spec(payload: dict[str, Any]) -> dict[str, Any]:
    """A cell's spec as the planner wrote it (any catalog, tests/test_decoder_families.py's made-up model) through
    run_rank on every rank; rank 0 returns its result."""
    from pretrain_planner.trainer.run import run_rank

    out = run_rank(payload["spec"])
    return {"rank": out["rank"], "result": out.get("result"), "steps": out.get("steps")}


def deepspeed_groups(payload: dict[str, Any]) -> dict[str, Any]:
    """One rank: ZeRO-3 is partitioned before the engine (item 7); after an abort + rebuild DeepSpeed's cached
    groups are dropped even without `_release_process_group_references` (an older DeepSpeed, item 5) and a new
    engine trains on the new group."""
    import torch
    from pretrain_planner.trainer.measure import batches_for
    from pretrain_planner.trainer.rank import close_rank, init_rank
    from pretrain_planner.trainer.run import make_builder
    from torch.distributed.device_mesh import DeviceMesh

    cfg, _ = run_config("tiny-gptneox", "naive+zero3", 1, precision="bf16")
    env = init_rank(cfg)
    out: dict[str, Any] = {}
    try:
        step = make_builder(cfg, env, [])(2, 1)
        out["build"] = step.settings["deepspeed"].get("build")
        out["device"] = step.settings["deepspeed"].get("device")
        batches = batches_for(cfg, env, 2, 1)
        out["loss_before"] = float(step(batches, 1))
        step.close()
        from deepspeed.utils import groups

        out["cached_before"] = groups._WORLD_GROUP is not None or groups._DATA_PARALLEL_GROUP is not None
        if payload.get("old_deepspeed"):
            del groups._release_process_group_references  # as in DeepSpeed < 0.19.8
        env.rebuild_group()
        out["cached_after"] = [
            name
            for name, value in vars(groups).items()
            if isinstance(value, (torch.distributed.ProcessGroup, DeviceMesh))
        ]
        step = make_builder(cfg, env, [])(2, 1)
        out["loss_after"] = float(step(batches, 1))
        step.close()
    finally:
        close_rank(env)
    return out


def zero3_engines_freed(payload: dict[str, Any]) -> dict[str, Any]:
    """One rank: two ZeRO-3 steps built, run and closed one after the other, as a micro-batch trial and the timed
    build are (with `abort`: each closed on an aborted group, as after an out-of-memory error); how many DeepSpeed
    engines and bytes of tensors are left once the garbage is collected."""
    import gc

    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine
    from pretrain_planner.trainer.measure import batches_for
    from pretrain_planner.trainer.rank import close_rank, init_rank
    from pretrain_planner.trainer.run import make_builder

    def left() -> dict[str, int]:
        gc.collect()
        live = gc.get_objects()
        tensors = [o for o in live if isinstance(o, torch.Tensor)]
        engines = sum(isinstance(o, DeepSpeedEngine) for o in live)
        return {"engines": engines, "tensor_bytes": sum(t.untyped_storage().nbytes() for t in tensors)}

    cfg, _ = run_config("tiny-gptneox", "naive+zero3", 1)
    env = init_rank(cfg)
    out: dict[str, Any] = {}
    try:
        for micro_batch in (4, 2):
            step = make_builder(cfg, env, [])(micro_batch, 1)
            batches = batches_for(cfg, env, micro_batch, 1)
            for _ in range(3):  # ZeRO-3 records its trace in the first step and uses (and caches) it after
                step(batches, 1)
            out[f"while_{micro_batch}"] = left()
            if payload.get("abort"):  # as after an out-of-memory error: the group aborted, the step closed, a new group
                env.abort_group()
                step.close()
                env.rebuild_group()
            else:
                step.close()
            del step
        out["after"] = left()
    finally:
        close_rank(env)
    return out


def bf16_paths(payload: dict[str, Any]) -> dict[str, Any]:
    """tiny-gptneox in bf16 on this rank for each method of the payload (autocast + DDP, FSDP2's bf16 mixed precision,
    DeepSpeed's bf16 engine): the settings applied, what the model computes in, and the losses of 2 steps on the same
    batches (the paths the fp32 stand-ins no longer take in the other tests)."""
    import torch
    from pretrain_planner.trainer.measure import batches_for
    from pretrain_planner.trainer.rank import close_rank, init_rank
    from pretrain_planner.trainer.run import make_builder

    out: dict[str, Any] = {}
    env = None
    try:
        for method in payload["methods"]:
            cfg, _ = run_config("tiny-gptneox", method, 2, precision="bf16")
            env = env or init_rank(cfg)
            torch.manual_seed(0)
            step = make_builder(cfg, env, [])(2, 4)
            batches = batches_for(cfg, env, 2, 4)
            losses = [float(step(batches, 4)) for _ in range(2)]
            s = step.settings
            out[method] = {
                "losses": losses,
                "autocast": s.get("autocast"),
                "parallel": s.get("parallel"),
                "fsdp_param_dtype": ((s.get("fsdp") or {}).get("mixed_precision") or {}).get("param_dtype"),
                "deepspeed_bf16": (((s.get("deepspeed") or {}).get("config") or {}).get("bf16") or {}).get("enabled"),
            }
            step.close()
    finally:
        if env is not None:
            close_rank(env)
    return out


def tiny_step_time(payload: dict[str, Any]) -> dict[str, Any]:
    """The quickest of a few whole benchmark steps of `payload["model"]` (micro-batch 4, the recipe's accumulation) on
    one thread: what a test that needs a run of some seconds divides by to size it on this machine."""
    import time as clock

    import torch
    from pretrain_planner.trainer.measure import batches_for
    from pretrain_planner.trainer.rank import close_rank, init_rank
    from pretrain_planner.trainer.run import make_builder

    torch.set_num_threads(1)
    cfg, _ = run_config(payload["model"], "naive", 1)
    accum = cfg.recipe["global_batch"] // 4
    env = init_rank(cfg)
    try:
        step = make_builder(cfg, env, [])(4, accum)
        batches = batches_for(cfg, env, 4, accum)
        times = []
        for _ in range(2 + payload.get("steps", 5)):
            t0 = clock.perf_counter()
            step(batches, accum)
            times.append(clock.perf_counter() - t0)
        step.close()
    finally:
        close_rank(env)
    return {"step_s": min(times[2:])}  # the machine at its quickest: a run sized by it lasts at least as long


def aborts_at_exit(payload: dict[str, Any]) -> dict[str, Any]:
    """Succeed, leaving an interpreter whose teardown aborts the process: what DeepSpeed's leaked gloo groups did to a
    rank once (benchmarks/multirank.py's docstring)."""
    import atexit

    atexit.register(os.abort)
    return {"done": True}


def warns_then_aborts(payload: dict[str, Any]) -> dict[str, Any]:
    """The same warning many times, a last word, then SIGABRT from C: a rank that dies by a signal mid-run."""
    import sys

    for _ in range(payload.get("repeats", 500)):
        print("FutureWarning: `torch.distributed.reduce_scatter_tensor` is deprecated.", file=sys.stderr)
    print("last words of the rank", file=sys.stderr, flush=True)
    os.abort()
    return {}
