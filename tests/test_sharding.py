"""FSDP2 and activation checkpointing end to end on CPU: 2 gloo ranks through the real Snakemake pipeline.

One Snakemake run (module-scoped) measures tiny-bert (fp32) with DDP, activation checkpointing, FSDP2 in
both modes, FSDP2 + CPU offload and one compiled FSDP2 cell; the tests check that each method was in
effect (the evidence in method_settings) and that the losses of the timed steps agree across methods.
The helpers here (a Snakemake run that cannot outlive its timeout, result loading) serve
test_deepspeed.py and test_oom.py too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from .conftest import BIN, REPO, write_config

pytestmark = pytest.mark.slow

MODEL = "tiny-bert"  # fp32 recipe: losses agree across methods to float rounding
METHODS = ["naive", "naive+ac", "naive+fsdp-grad", "naive+fsdp-full", "naive+fsdp-full+off", "fl+fsdp-full"]
TIMED = 3
BENCH = {"warmup_steps": 1, "timed_steps": TIMED, "max_micro_batch": 4, "max_spread": 50}  # wiring, not noise


def snakemake_bounded(workdir: Path, *args: str, env: dict | None = None, timeout: int = 600):
    """`snakemake ...` in its own session; past `timeout` the whole tree (driver and every rank) is killed
    and the test fails: a hang can neither block the suite nor leave processes behind."""
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    proc = subprocess.Popen(
        cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"snakemake did not finish within {timeout} s (a hang?)\n{out[-3000:]}\n{err[-5000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_sweep(work: Path, models: list[str], methods: list[str], env: dict | None = None, timeout: int = 600):
    cfg = write_config(
        work / "sweep.yaml",
        sweep={"models": models, "gpus": ["cpu"], "nodes": [1], "gpus_per_node": [2], "methods": methods},
        launcher={"kind": "local", "timeout_min": 5},
        benchmark=BENCH,
    )
    proc = snakemake_bounded(
        work, "--profile", str(REPO / "cluster/local"), "--cores", "2", "--configfile", str(cfg), env=env,
        timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return work


def cell(work: Path, model: str, method: str, ranks: int = 2) -> tuple[dict, list[dict]]:
    d = work / "results/cells" / model / "cpu" / f"1x{ranks}" / method
    result = json.loads((d / "result.json").read_text())
    steps = [json.loads(line) for line in (d / "steps.jsonl").read_text().splitlines()]
    return result, steps


def losses(steps: list[dict]) -> list[float]:
    return [s["loss"] for s in steps]


def leftover_processes(marker: str) -> list[str]:
    """Command lines of live processes that mention `marker` (a test's work folder)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{pid}: {cmdline[:200]}")
    return found


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return run_sweep(tmp_path_factory.mktemp("sharding"), [MODEL], METHODS)


def test_every_cell_ran(sweep):
    for method in METHODS:
        result, steps = cell(sweep, MODEL, method)
        assert result["status"] == "ok", (method, result.get("reason"))
        assert (result["micro_batch_size"], result["grad_accum_steps"]) == (4, 2)
        assert len(steps) == TIMED and all(s["time_s"] > 0 for s in steps)


def test_ddp_baseline(sweep):
    s = cell(sweep, MODEL, "naive")[0]["method_settings"]
    assert s["parallel"] == "ddp"
    assert s["observed"]["forward_calls_per_micro_batch"] == 1  # no recompute without checkpointing


def test_activation_checkpointing_recomputes(sweep):
    s = cell(sweep, MODEL, "naive+ac")[0]["method_settings"]
    assert s["activation_checkpointing"] is True
    # the checkpointed block's first layer runs in the forward and again in the backward's recompute
    assert s["observed"]["block"].startswith("bert.encoder.layer.0")
    assert s["observed"]["forward_calls_per_micro_batch"] == 2


@pytest.mark.parametrize(
    ("method", "reshard", "after_forward"),
    [
        ("naive+fsdp-grad", False, "unsharded"),
        ("naive+fsdp-full", True, "sharded"),
        ("naive+fsdp-full+off", True, "sharded"),
    ],
)
def test_fsdp2_shards_parameters(sweep, method, reshard, after_forward):
    s = cell(sweep, MODEL, method)[0]["method_settings"]
    assert s["parallel"] == "fsdp2"
    f = s["fsdp"]
    assert f["reshard_after_forward"] is reshard
    assert f["sharded_modules"] == {"BertLayer": 2} and f["root"] == "BertForMaskedLM"
    assert "bert.embeddings" in f["left_to_root"]  # tied with the MLM decoder: one FSDP group (the root's)
    # every parameter is a DTensor sharded on dim 0 across the 2 ranks: each holds about half
    assert f["dtensor_params"] == f["params"] > 0
    assert f["placements"] == ["(Shard(dim=0),)"]
    assert f["local_numel"] < f["global_numel"]
    assert f["sharded_param_fraction"] == pytest.approx(0.5, abs=0.01)
    assert f["mixed_precision"] is None  # fp32 recipe
    # reshard_after_forward in effect: the block's parameters right after its forward
    assert s["observed"]["param_state_after_forward"] == after_forward
    assert s["observed"]["forward_calls_per_micro_batch"] == 1
    if method.endswith("+off"):
        assert f["offload"] == {"policy": "CPUOffloadPolicy", "pin_memory": False}
        assert f["param_devices"] == ["cpu"]
    else:
        assert f["offload"] is None


def test_compiled_fsdp2(sweep):
    s = cell(sweep, MODEL, "fl+fsdp-full")[0]["method_settings"]
    assert s["compile"] is True and s["attn_implementation"] == "sdpa"
    assert s["fsdp"]["compile"] == "per block, before sharding"
    assert s["fsdp"]["sharded_param_fraction"] == pytest.approx(0.5, abs=0.01)
    assert s["observed"] is None  # no probe hooks inside compiled graphs


def test_losses_agree_across_methods(sweep):
    """Same seed, same data, same weights on every method: the timed steps' losses agree."""
    reference = losses(cell(sweep, MODEL, "naive")[1])
    assert reference[-1] < reference[0]  # it trains
    for method in METHODS[1:]:
        got = losses(cell(sweep, MODEL, method)[1])
        # eager attention: float rounding only; fl: SDPA attention and its own dropout stream
        rel = 1e-2 if method.startswith("fl") else 1e-4
        assert got == pytest.approx(reference, rel=rel), method


def test_recorded_settings_are_the_exported_ones(sweep):
    """Issue 16: every cell recorded planning.settings' values as applied, and the sweep's exported plan for the
    setting holds its fastest cell's settings."""
    from .test_method_settings import assert_recorded_is_exported

    for method in METHODS:
        assert_recorded_is_exported(sweep, MODEL, method, 2)
    plan = json.loads((sweep / "results/optimal" / MODEL / "cpu/1x2/plan.json").read_text())
    recorded = cell(sweep, MODEL, plan["method"])[0]["method_settings"]
    assert {k: recorded[k] for k in plan["method_settings"]} == plan["method_settings"]


def test_no_process_left(sweep):
    assert leftover_processes(str(sweep)) == []
