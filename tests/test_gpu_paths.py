"""Issue 14: the GPU-only paths that would crash or mismeasure on a multi-GPU node, tested where their mechanism
exists on CPUs: two real gloo ranks (benchmarks/multirank.py starts them with the local launcher's
environment; tests/rank_workers.py is what each rank runs), the meta device, a loss scaler forced to overflow,
the fake out-of-memory hook, the profiler's count of collectives. What needs a GPU to confirm is a case of
benchmarks/gpu_check.py (gpucheck/plans.py: multi_plans)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest
import torch

from .conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from multirank import run_ranks  # noqa: E402

from .rank_workers import run_config  # noqa: E402

HAVE_DS = importlib.util.find_spec("deepspeed") is not None


def _ranks(target: str, world: int = 2, payload: dict | None = None, timeout_s: float = 150) -> list[dict]:
    out = run_ranks(f"tests.rank_workers:{target}", world, payload or {}, timeout_s)
    assert not out[0]["timed_out"], f"{target} did not finish within {timeout_s} s (a hang?)\n{out[0]['stderr']}"
    return out


def _ok(rec: dict) -> dict:
    assert rec["returncode"] == 0, (rec.get("error"), rec.get("traceback"), rec["stderr"][-3000:])
    return rec["result"]


# ------------------------------------------------------------------------------------------ pure rules


def test_one_device_rule_and_process_group():
    """Item 4: one device rule (local rank modulo the visible GPUs) for the trainer, DeepSpeed and the budget
    stage; items 1 and 6: NCCL + gloo on GPUs, communicators created eagerly where there are peers."""
    from pretrain_planner.trainer.rank import device_index, eager_init_kwargs, process_group_backend

    assert device_index(3, 8) == 3 and device_index(9, 8) == 1
    assert device_index(3, 1) == 0  # --gpus-per-task=1: each task's only GPU, whatever its local rank
    cuda1 = torch.device("cuda", 1)  # a device object needs no GPU
    assert process_group_backend(cuda1) == "cuda:nccl,cpu:gloo"
    assert process_group_backend(torch.device("cpu")) == "gloo"
    assert eager_init_kwargs(cuda1, 8) == {"device_id": cuda1}
    assert eager_init_kwargs(cuda1, 1) == {} and eager_init_kwargs(torch.device("cpu"), 8) == {}


def test_cudnn_autotuning_under_free_lunch_on_gpus_only():
    """Item 13: free-lunch turns cuDNN's autotuner on, on CUDA only (recorded as method_settings.cudnn_benchmark)."""
    from pretrain_planner.planning.settings import resolve
    from pretrain_planner.trainer.rank import RankEnv

    fl, naive = run_config("tiny-gptneox", "fl", 1)[0], run_config("tiny-gptneox", "naive", 1)[0]
    gpu = RankEnv(0, 1, 0, torch.device("cuda", 0))
    cpu = RankEnv(0, 1, 0, torch.device("cpu"))

    def autotunes(cfg, env) -> bool:
        return resolve(cfg.run_spec(env), 1, 1).cudnn_benchmark

    assert autotunes(fl, gpu) and not autotunes(naive, gpu) and not autotunes(fl, cpu)


def test_fake_oom_at_build():
    from pretrain_planner.trainer.oom import FAKE_OOM_ENV, FakeOom

    fake = FakeOom(2, 1, "build")
    fake.at_build(4, rank=0)  # another rank
    fake.at_build(2, rank=1)  # not above the size
    with pytest.raises(torch.cuda.OutOfMemoryError, match="while building"):
        fake.at_build(4, rank=1)
    assert fake.install(torch.nn.Linear(2, 2), rank=1) is None  # no forward hook in build mode
    import os

    old = os.environ.get(FAKE_OOM_ENV)
    try:
        os.environ[FAKE_OOM_ENV] = "2:1@build"
        assert FakeOom.from_env() == fake
        os.environ[FAKE_OOM_ENV] = "2@nosync"
        assert FakeOom.from_env() == FakeOom(2, None, "nosync")
    finally:
        os.environ.pop(FAKE_OOM_ENV) if old is None else os.environ.update({FAKE_OOM_ENV: old})


def test_cgroup_oom_kill_counter_reads(tmp_path, monkeypatch):
    """The kernel's out-of-memory kills of this process's cgroup, read from fake cgroup trees (/proc and /sys moved
    under tmp_path): the count the file holds, and None where there is none (unknown, never 0). It asserted only
    `kills is None or kills >= 0` on this host, which any reader passes."""
    from pathlib import Path

    from pretrain_planner.launch import hostpool
    from pretrain_planner.trainer.watch import cgroup_oom_kills

    v2, v1 = "low 0\nhigh 0\nmax 4\noom 2\noom_kill 3\n", "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"
    cases = [
        # cgroup v2 under a SLURM task cgroup: the step's counter (hierarchical: every task of the step)
        ("0::/slurm/job_7/step_0/task_1\n", {"sys/fs/cgroup/slurm/job_7/step_0/memory.events": v2}, 3),
        # cgroup v1: the memory controller's line; the cpu line and the empty v2 hierarchy are passed over
        ("3:cpu:/u\n4:memory:/u\n0::/\n", {"sys/fs/cgroup/memory/u/memory.oom_control": v1}, 5),
        ("0::/user.slice\n", {}, None),  # no counter file
        ("0::/a\n", {"sys/fs/cgroup/a/memory.events": "low 0\noom 1\n"}, None),  # a kernel without oom_kill
    ]
    for i, (cgroup, files, want) in enumerate(cases):
        root = tmp_path / str(i)
        for rel, text in {"proc/self/cgroup": cgroup, **files}.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)

        def rooted(*parts, root=root):
            p = Path(*parts)
            return root / p.relative_to("/") if p.is_absolute() else p

        monkeypatch.setattr(hostpool, "Path", rooted)
        got = cgroup_oom_kills()
        assert got == want and type(got) is type(want), (cgroup, files, got)


# ------------------------------------------------------------------------------------------ one process


def _tiny_step(cuda_graphs: bool = False, global_batch: int | None = None):
    from pretrain_planner.trainer.config import RunConfig
    from pretrain_planner.trainer.methodbuild import build_with_extras
    from pretrain_planner.trainer.parallel import Applied
    from pretrain_planner.trainer.step import TrainStep

    cfg, spec = run_config("tiny-gptneox", "naive", 1)
    if global_batch is not None:
        spec["model"]["recipe"]["global_batch"] = global_batch
        cfg = RunConfig.from_spec(spec)
    net, _, _ = build_with_extras(cfg.model, cfg.method, "eager", None, 0)
    applied = Applied(net, net, cuda_graphs=cuda_graphs)
    return cfg, TrainStep(applied, torch.optim.AdamW(net.parameters(), lr=1e-3), 1.0, "cpu")


def test_cuda_graph_gradients_are_stable_buffers():
    """Item 2: under `cg` the gradients exist before the first backward and are the same buffers through
    accumulation and steps (a replay's output is added into them, never adopted as .grad), with the same
    update as without."""
    from pretrain_planner.trainer.measure import batches_for
    from pretrain_planner.trainer.rank import RankEnv

    cfg, step = _tiny_step(cuda_graphs=True)
    params = [p for p in step.applied.raw.parameters()]
    assert all(p.grad is not None and not p.grad.any() for p in params)
    ptrs = [p.grad.data_ptr() for p in params]
    batches = batches_for(cfg, RankEnv(0, 1, 0, torch.device("cpu")), 2, 2)
    for _ in range(2):
        step(batches, 3)
        assert [p.grad.data_ptr() for p in params] == ptrs
    _, ref = _tiny_step()
    for _ in range(2):
        ref(batches, 3)
    worst = max((a - b).abs().max().item() for a, b in zip(params, ref.applied.raw.parameters(), strict=True))
    assert worst < 1e-6


def test_skipped_steps_are_never_timed():
    """Item 9: a loss scaler that starts far too high skips the first steps (inf gradients); those are counted,
    never timed, and every timed step records the scale it ran with."""
    from pretrain_planner.trainer.measure import time_steps
    from pretrain_planner.trainer.rank import RankEnv

    cfg, step = _tiny_step(global_batch=2)  # one micro-batch of 2 a step: the loss is not divided by accumulation
    step.applied.loss_scaling = True
    start = 2.0**127
    step.scaler = torch.amp.GradScaler("cpu", init_scale=start)
    timing = time_steps(cfg, RankEnv(0, 1, 0, torch.device("cpu")), step, 2)
    assert timing.skipped_steps >= 1
    assert len(timing.step_times) == cfg.bench.timed_steps
    # a kept step leaves the scale alone (growth every 2000), a skipped one halves it: the books balance only
    # if no timed step was a skipped one
    scale = start
    for s, skipped in zip(timing.loss_scales, timing.skipped_before, strict=True):
        scale *= 0.5**skipped
        assert s == scale
    assert sum(timing.skipped_before) == timing.skipped_steps
    assert all(math.isfinite(loss) for loss in timing.losses)


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_compile_evidence_sees_zero3_style_graph_breaks():
    """Item 11: what compilation covered, from the profiler: one whole-model graph, or many small ones when
    every submodule has a dynamo-disabled hook (as DeepSpeed ZeRO-3's parameter hooks are)."""
    from pretrain_planner.trainer import kernels

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = torch.nn.functional.gelu(layer(x))
            return x.sum()

    seen = {}
    for hooked in (False, True):
        torch._dynamo.reset()
        net = Mlp()
        if hooked:

            @torch.compiler.disable
            def pre_hook(module, args):
                return None

            for layer in net.layers:
                layer.register_forward_pre_hook(pre_hook)
        net.compile()
        x = torch.randn(2, 8)
        net(x).backward()  # compile outside the profile
        seen[hooked] = kernels.compile_observed(kernels.profiled_names(lambda net=net, x=x: net(x).backward()))
    torch._dynamo.reset()
    assert seen[False]["compiled_graphs"] == 1 and seen[False]["compiled_region_entries"] == 1
    assert seen[True]["compiled_graphs"] > 1 and seen[True]["compiled_region_entries"] > 1


# ------------------------------------------------------------------------------------------ two gloo ranks


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_fsdp2_paths_on_two_ranks():
    """Item 8: one reduce-scatter per FSDP unit and step at accumulation 4 (four with grad_sync "every"), the
    same gradients either way; item 7: rank 1 builds a meta skeleton and gets rank 0's weights and buffers
    (tied embeddings, offload); item 1: offload + clipping steps; item 3: the fp16 sharded scaler after a
    process-group rebuild reduces on the live group."""
    for rank, rec in enumerate(_ranks("fsdp_paths")):
        r = _ok(rec)
        assert r["rs_last"] == r["units"] == 3, r  # 2 GPT-NeoX layers + the root
        assert r["rs_every"] == 4 * r["units"]
        assert r["last_vs_every_max_rel_diff"] < 1e-5
        for model in ("tiny-bert", "tiny-gptneox"):
            assert r[f"{model}_rank_built_on_meta"] is (rank == 1)
            assert r[f"{model}_max_weight_diff"] == 0.0 and r[f"{model}_max_buffer_diff"] == 0.0
            assert "meta device" in r[f"{model}_build"]
            assert math.isfinite(r[f"{model}_loss"])
        assert r["scaler"] == "ok"


@pytest.mark.slow  # gloo ranks in subprocesses, timed
def test_one_rank_failure_stops_every_rank():
    """Item 6: rank 1 fails (not out of memory) in a region; rank 0, waiting for it, stops within seconds and
    says why, instead of waiting for the 10-minute timeout."""
    r0, r1 = _ranks("fail_in_region", timeout_s=60)
    assert r1["returncode"] != 0 and "boom on rank 1" in r1["error"]
    seen = _ok(r0)
    assert "boom on rank 1" in (seen["error_seen"] or ""), seen
    assert seen["seconds"] < 20


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_killed_rank_is_noticed():
    """Items 6/7: a rank killed by a signal (the kernel's out-of-memory killer) never announces anything; rank 0
    notices its silence and stops, naming it."""
    r0, r1 = _ranks("killed_rank", payload={"stale_s": 3.0}, timeout_s=60)
    assert r1["returncode"] == -9
    seen = _ok(r0)
    assert "rank 1: stopped responding" in (seen["error_seen"] or ""), seen
    assert seen["seconds"] < 30


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_cell_survives_an_oom_before_any_collective(tmp_path):
    """Item 6 through the trainer's entry point: rank 1 runs out of memory while building (before any collective
    of that instance) at micro-batch 4; both ranks agree, rebuild the group, and time micro-batch 2 with FSDP2's
    one reduce-scatter per step (item 8, in method_settings) and rank 1 built on the meta device (item 7)."""
    result = _cell(tmp_path, "naive+fsdp-full", "2:1@build")
    assert result["status"] == "ok", result.get("reason")
    first, second = result["micro_batch_trials"][:2]
    assert first["micro_batch"] == 4 and not first["fits"] and first["oom_ranks"] == [1]
    assert "while building" in first["error"]
    assert second["micro_batch"] == 2 and second["fits"] and second["grad_sync"] == "last"
    s = result["method_settings"]
    assert s["process_group_rebuilds"] == 1
    assert (result["micro_batch"], result["grad_accum_steps"]) == (2, 4)
    assert s["fsdp"]["grad_sync"] == "last" and "meta device" in s["fsdp"]["build"]
    assert s["collectives_per_step"]["reduce_scatter"] == 3  # one per FSDP unit, not one per micro-batch
    assert result["skipped_steps"] is None and s["loss_scaling"] is None  # fp32: no loss scaler


def _cell(tmp_path, method: str, fake: str) -> dict:
    """A whole 2-rank cell through run_rank with the fake out-of-memory hook set on its ranks."""
    import os

    from pretrain_planner.trainer.oom import FAKE_OOM_ENV

    payload = {
        "model": "tiny-gptneox",
        "method": method,
        "result": str(tmp_path / "result.json"),
        "steps": str(tmp_path / "steps.jsonl"),
    }
    os.environ[FAKE_OOM_ENV] = fake
    try:
        recs = _ranks("run_cell", payload=payload, timeout_s=240)
    finally:
        os.environ.pop(FAKE_OOM_ENV)
    _ok(recs[1])
    return json.loads((tmp_path / "result.json").read_text())


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_fsdp2_falls_back_to_a_reduce_scatter_per_micro_batch(tmp_path):
    """Item 8's memory side: where the accumulated unsharded gradients of one reduce-scatter per step do not
    fit (forced: an OOM on rank 1 in any micro-batch without gradient sync), the same micro-batch is tried,
    and timed, with a reduce-scatter on every micro-batch."""
    result = _cell(tmp_path, "naive+fsdp-grad", "2:1@nosync")
    assert result["status"] == "ok", result.get("reason")
    first, second = result["micro_batch_trials"][:2]
    assert (first["micro_batch"], first["fits"], first["grad_sync"], first["oom_ranks"]) == (4, False, "last", [1])
    assert (second["micro_batch"], second["fits"], second["grad_sync"]) == (4, True, "every")
    s = result["method_settings"]
    assert (result["micro_batch"], result["grad_accum_steps"]) == (4, 2)
    assert s["fsdp"]["grad_sync"] == "every"
    assert s["collectives_per_step"]["reduce_scatter"] == 3 * 2  # every micro-batch, each FSDP unit


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
@pytest.mark.skipif(not HAVE_DS, reason="DeepSpeed is not installed (bash envs/setup.sh test)")
def test_deepspeed_forgets_groups_without_release_function():
    """Item 5: after an abort + rebuild, DeepSpeed's cached groups are dropped also where
    `_release_process_group_references` does not exist (DeepSpeed < 0.19.8), and a new engine trains; item 7:
    ZeRO-3 is partitioned by zero.Init before the engine, which then never moves the whole model."""
    (rec,) = _ranks("deepspeed_groups", world=1, payload={"old_deepspeed": True}, timeout_s=150)
    r = _ok(rec)
    assert r["cached_before"] and r["cached_after"] == []
    assert "zero.Init" in r["build"] and r["device"] == "cpu"
    assert math.isfinite(r["loss_before"]) and math.isfinite(r["loss_after"])


@pytest.mark.slow  # gloo ranks
@pytest.mark.skipif(not HAVE_DS, reason="DeepSpeed is not installed (bash envs/setup.sh test)")
@pytest.mark.parametrize("abort", [False, True], ids=["closed", "closed-after-abort"])
def test_a_closed_zero3_step_frees_its_engine(abort):
    """DeepSpeed's ZeRO-3 keeps every engine it built (a class-wide lru_cache keyed by each coordinator and submodule,
    the module stack each engine pushes its model onto): closing a step releases them, so a micro-batch trial's engine
    is not in memory under the timed build (trainer/zero.release_zero3_references). After an out-of-memory error the
    group is aborted and the engine's destroy() fails before removing its hooks: they are removed by hand."""
    (rec,) = _ranks("zero3_engines_freed", world=1, payload={"abort": abort}, timeout_s=150)
    r = _ok(rec)
    assert r["while_4"]["engines"] == 1 and r["while_2"]["engines"] == 1, r  # the trial's engine went with its step
    assert r["after"]["engines"] == 0, r
    assert r["after"]["tensor_bytes"] < r["while_2"]["tensor_bytes"] / 100, r  # a few kB of DeepSpeed's own buffers
