"""DeepSpeed ZeRO end to end on CPU (2 gloo ranks through Snakemake), its generated configs, and the
cases it cannot run (`unsupported`, never a crash)."""

from __future__ import annotations

import sys

import pytest
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.grid import Cell
from pretrain_planner.planning.spec import cell_spec

from .conftest import HAVE_DS, REPO, TIMED, cell, leftover_processes, losses, sections
from .conftest import ZERO_METHODS as ZERO

needs_ds = pytest.mark.skipif(not HAVE_DS, reason="DeepSpeed is not installed (bash envs/setup.sh test)")

MODEL = "tiny-bert"
METHODS = ["naive", *ZERO]


@pytest.fixture(scope="module")
def sweep(request):
    """tests/conftest.py's `methods_sweep` (tiny-bert's methods on 2 gloo ranks, shared with test_sharding.py)."""
    if not HAVE_DS:
        pytest.skip("DeepSpeed is not installed (bash envs/setup.sh test)")
    return request.getfixturevalue("methods_sweep")


def _run_config(model: str, method: str, ranks: int = 2, gpu: str = "cpu", precision: str | None = None):
    from pretrain_planner.trainer.config import RunConfig

    catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    config = {"benchmark": {"warmup_steps": 1, "timed_steps": 1}, "launcher": {"kind": "local", "timeout_min": 5}}
    spec = cell_spec(Cell(model, gpu, 1, ranks, method), catalog, *sections(config), "r.json", "s.jsonl")
    if precision:
        spec["model"]["recipe"]["precision"] = precision
    return RunConfig.from_spec(spec)


def _env(ranks: int = 2):
    import torch
    from pretrain_planner.trainer.rank import RankEnv

    return RankEnv(0, ranks, 0, torch.device("cpu"), backend="gloo")


def _validate(config: dict, world: int, monkeypatch) -> None:
    """DeepSpeedConfig with no process group: the world size it checks the batch product against is `world`."""
    from deepspeed.runtime import config as ds_config

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: world)
    ds_config.DeepSpeedConfig(config)


# ------------------------------------------------------------------------------ end to end


@pytest.mark.slow
@needs_ds
def test_every_stage_ran(sweep):
    for method in METHODS:
        result, steps = cell(sweep, MODEL, method)
        assert result["status"] == "ok", (method, result.get("reason"))
        assert (result["micro_batch"], result["grad_accum_steps"]) == (4, 2)
        assert len(steps) == TIMED
        assert result["versions"]["deepspeed"]


@pytest.mark.slow
@needs_ds
@pytest.mark.parametrize("method", ZERO)
def test_zero_in_effect(sweep, method):
    s = cell(sweep, MODEL, method)[0]["method_settings"]
    assert s["parallel"] == "deepspeed"
    ds = s["deepspeed"]
    stage = int(method.split("+")[1][-1])
    assert ds["zero_stage"] == stage == ds["config"]["zero_optimization"]["stage"]
    assert ds["config"]["train_micro_batch_size_per_gpu"] == 4 and ds["config"]["gradient_accumulation_steps"] == 2
    # the optimizer's fp32 master weights and state: this rank holds half
    assert ds["optimizer_state_fraction"] == pytest.approx(0.5, abs=0.01)
    assert ds["zero_optimizer"] == ("DeepSpeedZeroOptimizer_Stage3" if stage == 3 else "DeepSpeedZeroOptimizer")
    if stage == 3:  # parameters partitioned too, and released after each block's forward
        assert ds["sharded_param_fraction"] == pytest.approx(0.5, abs=0.01)
        assert s["observed"]["param_state_after_forward"] == "zero3:NOT_AVAILABLE"
    else:
        assert "sharded_param_fraction" not in ds
        assert s["observed"]["param_state_after_forward"] == "unsharded"
    if method.endswith("+off"):
        assert ds["offload_optimizer"] == "cpu" and ds["base_optimizer"] == "DeepSpeedCPUAdam"
        assert ds["config"]["optimizer"]["params"]["adam_w_mode"] is True  # recipe: adamw
        assert ds["offload_param"] == ("cpu" if stage == 3 else None)
    else:  # the recipe's torch optimizer as DeepSpeed's client optimizer
        assert ds["offload_optimizer"] is None and ds["base_optimizer"] == "AdamW"
        assert "optimizer" not in ds["config"]


@pytest.mark.slow
@needs_ds
def test_recorded_configs_validate(sweep, monkeypatch):
    for method in ZERO:
        config = cell(sweep, MODEL, method)[0]["method_settings"]["deepspeed"]["config"]
        _validate(config, 2, monkeypatch)


@pytest.mark.slow
@needs_ds
def test_recorded_settings_are_the_exported_ones(sweep):
    """Issue 16: each ZeRO cell ran planning.settings' DeepSpeed dict (the study's overlap and buckets), exactly
    what the export writes for it."""
    from .conftest import assert_recorded_is_exported

    for method in METHODS:
        assert_recorded_is_exported(sweep, MODEL, method, 2)
    z2 = cell(sweep, MODEL, "naive+zero2")[0]["method_settings"]["deepspeed"]["config"]["zero_optimization"]
    assert z2["overlap_comm"] and z2["reduce_bucket_size"] == 200_000_000


@pytest.mark.slow
@needs_ds
def test_losses_agree_with_ddp(sweep):
    reference = losses(cell(sweep, MODEL, "naive")[1])
    for method in ZERO:
        assert losses(cell(sweep, MODEL, method)[1]) == pytest.approx(reference, rel=1e-4), method


@pytest.mark.slow
@needs_ds
def test_no_process_left(sweep):
    assert leftover_processes(str(sweep)) == []


# ------------------------------------------------------------------------------ configs, no process group


@needs_ds
@pytest.mark.parametrize(
    ("model", "ranks", "method"),
    [
        ("tiny-gptneox", 2, "naive+zero1"),
        ("tiny-gptneox", 2, "naive+zero2+off"),
        ("tiny-gptneox", 2, "naive+zero3"),
        ("tiny-gptneox", 2, "naive+zero3+off"),
        ("tiny-bert", 1, "naive+zero2+off"),  # one GPU: ZeRO is planned only with offload
        ("tiny-bert", 1, "naive+zero3+off"),
    ],
)
def test_generated_config_validates(model, ranks, method, monkeypatch):
    from pretrain_planner.planning.settings import resolve

    bf16 = model == "tiny-gptneox"  # in bf16 here (the stand-in's recipe is fp32): both precisions are validated
    cfg = _run_config(model, method, ranks, precision="bf16" if bf16 else None)
    config = resolve(cfg.run_spec(_env(ranks)), 2, 16 // ranks // 2).deepspeed_config
    _validate(config, ranks, monkeypatch)
    assert config["bf16"]["enabled"] is bf16  # the recipe's precision
    assert config["gradient_clipping"] == (1.0 if model == "tiny-gptneox" else 0.0)
    zero_opt = config["zero_optimization"]
    assert ("offload_param" in zero_opt) is (method == "naive+zero3+off")


@needs_ds
def test_bad_config_is_rejected(monkeypatch):
    from pretrain_planner.planning.settings import resolve

    config = resolve(_run_config("tiny-bert", "naive+zero2").run_spec(_env()), 4, 2).deepspeed_config
    with pytest.raises(AssertionError, match="train_batch_size"):
        _validate({**config, "train_batch_size": 99}, 2, monkeypatch)


# ------------------------------------------------------------------------------ unsupported, with the reason


def test_fp16_on_cpu_is_unsupported():
    from pretrain_planner.trainer.rank import Unsupported
    from pretrain_planner.trainer.run import check_supported

    cfg = _run_config("pythia-160m", "naive+zero2")  # fp16 recipe; the `cpu` type runs on CPUs
    assert cfg.recipe["precision"] == "fp16"
    with pytest.raises(Unsupported, match="fp16"):
        check_supported(cfg, _env())


def test_missing_deepspeed_is_unsupported(monkeypatch):
    from pretrain_planner.trainer import zero
    from pretrain_planner.trainer.rank import Unsupported
    from pretrain_planner.trainer.run import check_supported

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # `import deepspeed` raises ImportError
    with pytest.raises(Unsupported, match="DeepSpeed is not installed"):
        zero.import_deepspeed(_env())
    with pytest.raises(Unsupported, match="DeepSpeed is not installed"):
        check_supported(_run_config("tiny-bert", "naive+zero3"), _env())


BROKEN_IMPORT_CELL = """
import json, sys
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.grid import Cell
from pretrain_planner.planning.configtypes import BenchmarkSection, LauncherSection
from pretrain_planner.planning.spec import cell_spec
from pretrain_planner.trainer.run import run_rank

try:
    import deepspeed  # noqa: F401
    raised = None
except BaseException as exc:  # what a GPU image with a mismatched pair shows
    raised = type(exc).__name__
repo, out = sys.argv[1], sys.argv[2]
catalog = load_catalog(f"{repo}/config/models.yaml", f"{repo}/config/gpus.yaml")
config = {"benchmark": {"warmup_steps": 1, "timed_steps": 1}, "launcher": {"kind": "debug", "timeout_min": 5}}
typed = BenchmarkSection.given(config["benchmark"]), LauncherSection.given(config["launcher"])
spec = cell_spec(Cell("tiny-bert", "cpu", 1, 1, "naive+zero1"), catalog, *typed, f"{out}/result.json",
                 f"{out}/steps.jsonl")
run_rank(spec)
print(json.dumps({"raised": raised, "result": json.load(open(f"{out}/result.json"))}))
"""


@pytest.mark.slow  # a cell through run_rank in a subprocess
def test_broken_deepspeed_import_is_unsupported(tmp_path):
    """Issue 28: a DeepSpeed whose import raises something other than ImportError (here: a pydantic-core of
    another version than pydantic requires, shadowing the real one on PYTHONPATH, so `import pydantic` inside
    `import deepspeed` raises SystemError, as a GPU image with a mismatched pair does) makes a ZeRO cell
    `unsupported` with the reason, not an error."""
    import json
    import os
    import subprocess

    if not HAVE_DS:
        pytest.skip("DeepSpeed is not installed (bash envs/setup.sh test)")
    fake = tmp_path / "site" / "pydantic_core"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "0.0.1"  # not the version pydantic requires\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO / "workflow")]),
           "HF_HUB_OFFLINE": "1"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", BROKEN_IMPORT_CELL, str(REPO), str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["raised"] == "SystemError"  # the import really fails, and not with ImportError
    result = out["result"]
    assert result["status"] == "unsupported", result
    assert "does not import" in result["reason"] and "SystemError" in result["reason"]
    assert "pydantic-core" in result["reason"]
