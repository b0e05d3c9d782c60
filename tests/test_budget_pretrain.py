"""Budget stage: time-budgeted pre-training; SIGKILL mid-run and resume follows the uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from pretrain_planner.budget import config as bconfig
from pretrain_planner.budget import jobs, pretrain
from pretrain_planner.planning.configtypes import BudgetPrep, BudgetRecipe, BudgetTrain
from pretrain_planner.schema import ConfigError
from pretrain_planner.trainer.data import mlm as data
from safetensors.torch import load_file

from .conftest import DEBUG_LAUNCH, REPO, budget_cfg


def _steps(run_dir):
    return [json.loads(ln) for ln in (run_dir / "steps.jsonl").read_text().splitlines()]


def _run(cfg, tmp, name, **kw):
    d = tmp / name
    return pretrain.pretrain(cfg, tmp / "data/index.json", d / "model", d / "result.json", d / "run", d / "log", **kw)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pretrain")
    cfg = budget_cfg(tmp)
    data.prepare_data(BudgetPrep.of(cfg), tmp / "data/index.json")
    result = _run(cfg, tmp, "a", threads=1)
    return cfg, tmp, result


@pytest.mark.slow  # a training run (the module's uninterrupted run and more)
def test_budget_run(uninterrupted):
    _, tmp, result = uninterrupted
    # fake clock: 1 s per step, budget 12 s -> 12 steps, stopped by the budget
    assert result["steps"] == 12 and result["stop_reason"] == "budget"
    assert result["elapsed_s"] == pytest.approx(12.0)
    steps = _steps(tmp / "a/run")
    assert [s["step"] for s in steps] == list(range(1, 13))
    assert steps[0]["lr"] == 0.0 and max(s["lr"] for s in steps) <= 1e-3
    assert result["loss_last"] < result["loss_first"], "loss goes down"
    vals = [json.loads(ln) for ln in (tmp / "a/run/validation.jsonl").read_text().splitlines()]
    assert [v["step"] for v in vals] == [3, 6, 9, 12]
    assert result["val_loss"] == pytest.approx(vals[-1]["val_loss"])
    assert (tmp / "a/run/finetune-0.50/model.safetensors").is_file()
    assert (tmp / "a/model/tokenizer.json").is_file() and (tmp / "a/model/config.json").is_file()
    assert "checkpoint at step 4" in (tmp / "a/log").read_text()
    assert result["sparse_prediction"] and result["model_class"].endswith("WithSparsePrediction")


@pytest.mark.slow  # a training run (the module's uninterrupted run and more)
def test_a_budget_of_n_fake_seconds_takes_n_steps(uninterrupted):
    """57 / 3600 h is 57.00000000000001 s as `hours * 3600`: the run took a 58th step (CI's chaos soak: 512 steps
    for a budget of 511)."""
    _, tmp, _ = uninterrupted
    (tmp / "n57").mkdir()
    cfg = budget_cfg(tmp / "n57", train={"budget_hours": 57 / 3600, "checkpoint_every_s": None,
                                         "finetune_checkpoints": []})  # fmt: skip
    result = _run(cfg, tmp, "n57", threads=1)
    assert result["stop_reason"] == "budget" and result["steps"] == 57
    assert [s["step"] for s in _steps(tmp / "n57/run")] == list(range(1, 58))


@pytest.mark.slow  # a training run (the module's uninterrupted run and more)
def test_what_checkpointing_cost_is_recorded_and_the_default_writes_only_the_last(uninterrupted):
    """Every 4 s of training: steps 4, 8, 12 and the end, their write time in the result and the summary; the default
    (null, the reference run's) writes the end's alone."""
    cfg, tmp, result = uninterrupted
    assert result["checkpoint_every_s"] == 4 and result["checkpoints"] == 4 and result["checkpoint_s"] > 0
    assert "Checkpoints: every 4 s of training time. 4 written" in (tmp / "a/summary.md").read_text()
    assert bconfig.load(budget_cfg(tmp, load=False, train={"checkpoint_every_s": None}))["train"][
        "checkpoint_every_s"] is None  # fmt: skip
    raw = yaml.safe_load(budget_cfg(tmp, load=False).read_text())
    del raw["train"]["checkpoint_every_s"]
    (tmp / "default.yaml").write_text(yaml.safe_dump(raw))
    default = bconfig.load(tmp / "default.yaml")
    assert default["train"]["checkpoint_every_s"] is None
    once = _run(default, tmp, "once", threads=1)
    assert once["steps"] == 12 and once["checkpoints"] == 1
    log = (tmp / "once/log").read_text()
    assert "checkpoint at step 12" in log and "checkpoint at step 4" not in log
    assert "none during the run (the reference's" in (tmp / "once/summary.md").read_text()


@pytest.mark.slow  # a training run (the module's uninterrupted run and more)
def test_validation_rotates_through_the_held_out_shards(uninterrupted):
    """Each validation takes the next held-out shard, round the held-out set, as the reference's pretrain_validation
    (shard index mod n), not always the first samples; the shards are named in validation.jsonl and the result."""
    _, tmp, result = uninterrupted
    held_out = [s["name"] for s in json.loads((tmp / "data/index.json").read_text())["splits"]["validation"]]
    assert len(held_out) >= 4  # the shipped corpus: one held-out shard per training shard
    vals = [json.loads(ln) for ln in (tmp / "a/run/validation.jsonl").read_text().splitlines()]
    assert [v["shards"] for v in vals] == [[held_out[i % len(held_out)]] for i in range(len(vals))]
    assert [v["shards"] for v in result["validation"]] == [v["shards"] for v in vals]
    assert len({v["val_loss"] for v in vals}) == len(vals)


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_sigkill_and_resume_matches_uninterrupted(uninterrupted):
    cfg, tmp, result = uninterrupted
    b = tmp / "b"
    code = (
        "import json, sys; from pretrain_planner.budget import pretrain;"
        "cfg, d, b = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3];"
        "pretrain.pretrain(cfg, d + '/data/index.json', b + '/model', b + '/result.json', b + '/run', b + '/log',"
        " threads=1, kill_at_step=6)"
    )
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(BudgetRecipe.of(cfg).to_job()), str(tmp), str(b)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          cwd=REPO)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert len(_steps(b / "run")) == 6  # steps 5 and 6 ran after the last checkpoint (step 4): they are lost
    assert not (b / "result.json").exists()
    resumed = _run(cfg, tmp, "b", threads=1)
    assert "resumed at step 4" in (b / "log").read_text()
    want, got = _steps(tmp / "a/run"), _steps(b / "run")
    assert [s["step"] for s in got] == list(range(1, 13))
    for w, g in zip(want, got, strict=True):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-5, abs=1e-6), (w, g)
        assert g["lr"] == pytest.approx(w["lr"])
        assert g["elapsed_s"] == pytest.approx(w["elapsed_s"])
    assert resumed["val_loss"] == pytest.approx(result["val_loss"], rel=1e-5)
    wa, wb = load_file(tmp / "a/model/model.safetensors"), load_file(b / "model/model.safetensors")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


@pytest.mark.slow  # a training run (the module's uninterrupted run and more)
def test_early_stop_and_max_steps(uninterrupted):
    cfg, tmp, _ = uninterrupted
    stop = {**cfg, "train": {**cfg["train"], "early_stop": [{"at_fraction": 0.2, "max_loss": 0.5}]}}
    res = _run(stop, tmp, "c", threads=1)
    assert res["stop_reason"].startswith("early stop") and res["steps"] == 3
    capped = {**cfg, "train": {**cfg["train"], "max_steps": 2}}
    res = _run(capped, tmp, "d", threads=1)
    assert res["stop_reason"] == "max_steps" and res["steps"] == 2
    bf16 = {**cfg, "train": {**cfg["train"], "max_steps": 2, "precision": "bf16"}}
    res = _run(bf16, tmp, "f", threads=1)
    assert res["steps"] == 2 and 0 < res["loss_last"] < 20


@pytest.mark.slow  # a training run (the module's uninterrupted run and more)
def test_checkpoint_of_another_config_is_refused(uninterrupted):
    cfg, tmp, _ = uninterrupted
    other = {**cfg, "train": {**cfg["train"], "lr": 5e-4}}
    with pytest.raises(RuntimeError, match="another configuration"):
        _run(other, tmp, "a", threads=1)


@pytest.mark.slow  # a training run (the module's uninterrupted run and more)
def test_sigterm_checkpoints_then_resumes(uninterrupted):
    """Pre-emption (SLURM sends SIGTERM / SIGUSR1): checkpoint after the current step, exit, resume exactly."""
    cfg, tmp, result = uninterrupted
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit, match="checkpoint saved"):
        _run(cfg, tmp, "e", threads=1, kill_at_step=5, kill_signal=signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before, "the handler is restored"
    assert "checkpoint at step 6" in (tmp / "e/log").read_text()
    resumed = _run(cfg, tmp, "e", threads=1)
    assert "resumed at step 6" in (tmp / "e/log").read_text()
    got, want = _steps(tmp / "e/run"), _steps(tmp / "a/run")
    assert [g["loss"] for g in got] == pytest.approx([w["loss"] for w in want], rel=1e-5, abs=1e-6)
    assert resumed["steps"] == result["steps"]


@pytest.mark.slow  # a training run (the module's uninterrupted run and more)
def test_debug_launcher_runs_in_process_and_refuses_ranks(uninterrupted):
    cfg, tmp, _ = uninterrupted
    capped = {**cfg, "train": {**cfg["train"], "max_steps": 2}}
    d = tmp / "g"
    res = jobs.pretrain(BudgetRecipe.of(capped), DEBUG_LAUNCH,
                        str(tmp / "data/index.json"), str(d / "model"), str(d / "result.json"), str(d / "run"),
                        str(d / "log"))  # fmt: skip
    assert res["steps"] == 2 and res["world_size"] == 1 and res["method_settings"]["parallel"] == "single"
    assert "launcher debug, 1 rank(s)" in (d / "log").read_text() and not (d / "submitit").exists()
    two = {**cfg, "train": {**cfg["train"], "gpus_per_node": 2}}
    with pytest.raises(ConfigError, match="launcher.kind debug runs one rank"):
        bconfig.launch_settings(DEBUG_LAUNCH.launcher, BudgetTrain.of(two["train"]), two["source"], REPO)


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_wall_clock_counts_what_training_time_does_not(uninterrupted, monkeypatch):
    """The reference's budget is wall time from the start: start-up, validation and checkpoint writes count. With
    the fake clock (1 s a step, budget 12 s) and a checkpoint write made 1 s slower, training time still runs 12
    steps; the wall clock stops earlier, and the result records both clocks."""
    cfg, tmp, _ = uninterrupted
    from pretrain_planner.trainer.loop import Loop

    write = Loop.checkpoint

    def slow_write(self):
        time.sleep(1.0)
        write(self)

    monkeypatch.setattr(Loop, "checkpoint", slow_write)
    train = _run(cfg, tmp, "wall-t", threads=1)
    wall = _run({**cfg, "train": {**cfg["train"], "clock": "wall"}}, tmp, "wall-w", threads=1)
    assert train["clock"] == "train" and train["steps"] == 12 and train["elapsed_s"] == pytest.approx(12.0)
    assert train["wall_s"] > train["train_s"] + 2.0, "four slow checkpoints (steps 4, 8, 12, the end), the start-up"
    assert wall["clock"] == "wall" and wall["stop_reason"] == "budget"
    assert wall["steps"] < train["steps"] and wall["steps"] <= 10
    assert wall["elapsed_s"] == wall["wall_s"] >= 12.0 and wall["train_s"] == pytest.approx(wall["steps"])
    steps = _steps(tmp / "wall-w/run")
    assert all(s["wall_s"] >= s["elapsed_s"] for s in steps)
    assert [s["lr"] for s in steps] != [s["lr"] for s in _steps(tmp / "wall-t/run")][: len(steps)], "lr on wall time"


@pytest.mark.slow  # a training run (the module's uninterrupted run and more)
def test_a_nan_loss_stops_the_run_with_its_reason(uninterrupted, monkeypatch):
    """A NaN loss (the weights poisoned inside the second step, as a diverged model would be) ends the run after
    the step that saw it, with the reason in stop_reason."""
    cfg, tmp, _ = uninterrupted

    def poison(self, state):
        if state["step"] == 1:  # inside the second step, after its optimizer step
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))

    monkeypatch.setattr(pretrain._Run, "in_step", poison, raising=False)
    res = _run(cfg, tmp, "nan", threads=1)
    assert res["steps"] == 3 and res["stop_reason"] == "non-finite loss: nan at step 3"
    assert "stopping: non-finite loss" in (tmp / "nan/log").read_text()
    # without the step-loss check, the reference's own rule still ends it: a NaN validation loss (step 3)
    off = {**cfg, "train": {**cfg["train"], "stop_on_nonfinite_loss": False}}
    assert _run(off, tmp, "nan-off", threads=1)["stop_reason"] == "nan validation loss"


def test_fp16_run_stops_on_a_loss_scale_stuck_at_its_floor():
    """The hook that applies the rule (fp16 needs CUDA: its scaler is stubbed here): the count is kept in the
    run's state (checkpointed), and the stop reason set when it reaches train.loss_scale_floor.steps."""
    from dataclasses import replace
    from types import SimpleNamespace

    from pretrain_planner.planning.configtypes import LossScaleFloor
    from pretrain_planner.schema import validate

    logged = []
    section = validate({"corpus": {"files": ["c.txt"]}, "model": "tiny-bert"}, "budget", "test")["train"]
    tr = replace(BudgetTrain.of(section), stop_on_nonfinite_loss=True, precision="fp16",
                 loss_scale_floor=LossScaleFloor(scale=1.0, steps=3))  # fmt: skip
    run = SimpleNamespace(state={"step": 0, "stop": None, "scale_floor_steps": 0}, tr=tr,
                          logger=SimpleNamespace(info=lambda *a: logged.append(a)))  # fmt: skip
    scales = iter([4.0, 1.0, 1.0, 1.0])
    loop = SimpleNamespace(last={"loss": 2.0}, step_fn=SimpleNamespace(loss_scale=lambda: next(scales)))
    stops = []
    for _ in range(4):
        run.state["step"] += 1
        stops.append(pretrain._Run._loss_checks(run, loop))
    assert stops == [False, False, False, True] and run.state["scale_floor_steps"] == 3
    assert run.state["stop"].startswith("loss scale stuck at its floor") and logged
    run.tr = replace(tr, precision="bf16")
    run.state.update(stop=None, scale_floor_steps=0)
    assert not pretrain._Run._loss_checks(run, loop)  # no loss scaler outside fp16
