"""The shared training loop and the train stage (issue 16): accumulation, the recipe's schedule, resume exactly
after a SIGKILL, every task family from a plan.json, the throughput record, two gloo ranks under torchrun, the
`pretrain-planner train` command and the Snakemake target. Tiny models, few steps, CPU."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pretrain_planner import cli, layout
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.train import record
from pretrain_planner.trainer.schedule import recipe_lr

from .conftest import BIN, REPO, snakemake, steps_of, write_config, write_plan

CATALOG = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "workflow")}


def train(plan: Path, out: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m pretrain_planner.train PLAN --out OUT ...` as its own process (one thread)."""
    cmd = [sys.executable, "-m", "pretrain_planner.train", str(plan), "--out", str(out), "--threads", "1", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600, cwd=out.parent)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def result_of(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    """tiny-gptneox, 6 steps of micro-batch 4 x 4 accumulation, uninterrupted (checkpoints every 2 steps)."""
    tmp = tmp_path_factory.mktemp("gpt")
    plan = write_plan(tmp / "plan", "tiny-gptneox")
    train(plan, tmp / "a", "--steps", "6", "--checkpoint-every-steps", "2")
    return tmp, plan


def test_recipe_schedules():
    cos = {"name": "cosine", "warmup_steps": 10, "min_lr_ratio": 0.1}
    assert [recipe_lr(cos, 1.0, s, s / 100, 100) for s in (0, 5, 10)] == [0.0, 0.5, 1.0]
    assert recipe_lr(cos, 1.0, 100, 1.0, 100) == pytest.approx(0.1)  # the floor at the end
    assert recipe_lr(cos, 1.0, 55, 0.55, 100) == pytest.approx(0.55)  # half-way down the cosine
    lin = {"name": "linear", "warmup_fraction": 0.5}
    assert [recipe_lr(lin, 2.0, 0, p, None) for p in (0.25, 0.5, 0.75, 1.0)] == [1.0, 2.0, 1.0, 0.0]
    assert recipe_lr({"name": "constant"}, 3.0, 7, 0.9, None) == 3.0


def test_throughput_record_leaves_out_warmup_and_compares():
    steps = [{"step": 1, "step_time_s": 9.0, "warmup": True}, {"step": 2, "step_time_s": 1.0},
             {"step": 3, "step_time_s": 3.0}]  # fmt: skip
    t = record.sustained(steps, 8, 100, {"step_time_s": 1.0, "samples_per_s": 8.0, "tokens_per_s": 800.0})
    assert (t["steps_timed"], t["warmup_steps"], t["step_time_s"]) == (2, 1, 2.0)
    assert t["samples_per_s"] == 4.0 and t["tokens_per_s"] == 400.0
    assert t["ratio"] == {"step_time_s": 2.0, "samples_per_s": 0.5, "tokens_per_s": 0.5}


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_causal_lm_run_from_plan(gpt):
    tmp, _ = gpt
    res, steps = result_of(tmp / "a"), steps_of(tmp / "a")
    assert res["steps"] == 6 and res["stop_reason"] == "steps" and res["task"] == "causal_lm"
    assert (res["micro_batch"], res["grad_accum_steps"], res["world_size"]) == (4, 4, 1)
    assert res["data"]["synthetic"] and "generated corpus" in res["data"]["label"]
    assert res["data"]["blocks"] >= 16 and res["data"]["seq_len"] == 128
    # the recipe's schedule (cosine, 10 warm-up steps) over the run's 6 steps, set every step
    sched = res["schedule"]
    assert [s["lr"] for s in steps] == pytest.approx([recipe_lr(sched, 1e-3, k, k / 6, 6) for k in range(6)])
    assert res["method_settings"]["parallel"] == "single" and res["method_settings"]["autocast"] is None  # fp32 recipe
    if res["method_settings_plan"] is not None:
        assert res["settings_differences"] == []
    # the throughput after 2 warm-up steps, beside plan.json's measured 0.5 s
    t = res["throughput"]
    assert t["steps_timed"] == 4 and [s.get("warmup", False) for s in steps] == [True, True] + [False] * 4
    assert t["step_time_s"] == pytest.approx(sum(s["step_time_s"] for s in steps[2:]) / 4)
    assert t["ratio"]["step_time_s"] == pytest.approx(t["step_time_s"] / 0.5)
    assert re.search(r"\| step_time_s +\|", (tmp / "a/throughput.md").read_text())
    assert (tmp / "a/throughput.csv").read_text().splitlines()[0] == ",".join(record.COLUMNS)


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_sigkill_then_resume_gives_the_uninterrupted_losses(gpt):
    """Rank 0 SIGKILLed after step 5 (last checkpoint at step 4), rerun: it resumes at 4 and its 6 losses, learning
    rates and data are the uninterrupted run's (model, optimizer, schedule, data position, RNG restored)."""
    tmp, plan = gpt
    proc = train(plan, tmp / "b", "--steps", "6", "--checkpoint-every-steps", "2", "--kill-at-step", "5", check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert len(steps_of(tmp / "b")) == 5 and not (tmp / "b/result.json").exists()
    train(plan, tmp / "b", "--steps", "6", "--checkpoint-every-steps", "2")
    assert "resumed at step 4" in (tmp / "b/train.log").read_text()
    want, got = steps_of(tmp / "a"), steps_of(tmp / "b")
    assert [g["step"] for g in got] == list(range(1, 7))
    assert [g["loss"] for g in got] == pytest.approx([w["loss"] for w in want], rel=1e-5, abs=1e-6)
    assert [g["lr"] for g in got] == pytest.approx([w["lr"] for w in want])
    res = result_of(tmp / "b")
    assert res["starts_at_step"] == [0, 4]
    # after the resume 2 more warm-up steps (5, 6) are left out of the sustained figure
    assert [s.get("warmup", False) for s in got] == [True, True, False, False, True, True]


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
def test_accumulation_matches_one_big_micro_batch(tmp_path):
    """16 samples as 4 x 4 accumulated micro-batches or as one micro-batch of 16 give the same update: the second
    step's loss (after one optimizer step) agrees (tiny-vit: fp32, no dropout)."""
    losses = {}
    for mb in (4, 16):
        plan = write_plan(tmp_path / f"plan{mb}", "tiny-vit", mb=mb)
        train(plan, tmp_path / f"vit{mb}", "--steps", "2", "--warmup-steps", "0")
        losses[mb] = [s["loss"] for s in steps_of(tmp_path / f"vit{mb}")]
        assert result_of(tmp_path / f"vit{mb}")["grad_accum_steps"] == 16 // mb
    assert losses[4] == pytest.approx(losses[16], rel=1e-4)
    assert losses[4][1] != pytest.approx(losses[4][0], rel=1e-6), "the optimizer step changed the model"


@pytest.mark.slow  # a training subprocess or gloo ranks: not in the everyday subset
@pytest.mark.parametrize("model", ["tiny-bert", "tiny-mamba", "tiny-vit"])
def test_every_family_trains_from_its_plan(tmp_path, model):
    """MLM through trainer/data/mlm.py, Mamba on packed text, ViT on a local image folder (.npy): not synthetic."""
    import numpy as np

    args = ["--steps", "3"]
    if model == "tiny-vit":
        for c in ("cat", "dog"):
            (tmp_path / "imgs" / c).mkdir(parents=True)
            for i in range(4):
                np.save(tmp_path / "imgs" / c / f"{i}.npy", np.random.default_rng(i).integers(0, 255, (40, 40, 3)))
        args += ["--data", str(tmp_path / "imgs")]
    plan = write_plan(tmp_path / "plan", model)
    train(plan, tmp_path / "out", *args)
    res = result_of(tmp_path / "out")
    task = {"tiny-bert": "masked_lm", "tiny-mamba": "causal_lm", "tiny-vit": "image_classification"}[model]
    assert res["task"] == task and res["steps"] == 3
    assert res["throughput"]["steps_timed"] == 1 and res["throughput"]["ratio"]["samples_per_s"] > 0
    assert res["method_settings"]["method_parts"]["slug"] == "naive"
    # the held-out loss at the end (issue 54): the last image / blocks, the masked LM's validation shards
    assert res["val_loss"] > 0 and res["validation"]["points"][-1]["step"] == 3
    if model == "tiny-vit":
        assert not res["data"]["synthetic"] and res["data"]["images"] == 8 and res["data"]["classes"] == 2
    else:
        assert res["data"]["synthetic"] and "generated corpus" in res["data"]["label"]
    if task == "masked_lm":
        assert res["data"]["prepared_by"].startswith("trainer/data/mlm.py") and res["data"]["tokenizer_vocab"] <= 512


@pytest.mark.slow
def test_two_gloo_ranks_under_torchrun(tmp_path):
    plan = write_plan(tmp_path / "plan", "tiny-gptneox", mb=4, gpus_per_node=2)
    out = tmp_path / "out"
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", "-m", "pretrain_planner.train", str(plan),
           "--out", str(out), "--steps", "3", "--threads", "1"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = result_of(out)
    assert (res["world_size"], res["grad_accum_steps"], res["launched_by"]) == (2, 2, "torchrun")
    assert res["method_settings"]["parallel"] == "ddp" and res["notes"] == []


def test_cli_train_debug_launcher(tmp_path, capsys):
    write_plan(tmp_path / "plan", "tiny-vit")
    out = tmp_path / "out"
    rc = cli.main(["train", "--plan", str(tmp_path / "plan"), "--launcher", "debug", "--steps", "2", "--out",
                   str(out)])  # fmt: skip
    assert rc == 0 and "train / prediction" in capsys.readouterr().out
    assert result_of(out)["steps"] == 2 and (out / "launch.log").is_file()


def test_cli_train_takes_the_configs_train_section(tmp_path, capsys, monkeypatch):
    """Issue 27: `pretrain-planner train` reads the config's `train:` section as the train rule does (its steps here);
    a flag given wins. (In a folder of its own: a results/ of another sweep where it runs would refuse this config.)"""
    monkeypatch.chdir(tmp_path)
    write_plan(tmp_path / "plan", "tiny-vit")
    cfg = write_config(tmp_path / "c.yaml", sweep={"models": ["tiny-vit"], "gpus": ["cpu"]}, train={"steps": 3})
    for args, steps in (([], 3), (["--steps", "2"], 2)):
        out = tmp_path / f"out{steps}"
        rc = cli.main(["train", "--plan", str(tmp_path / "plan"), "--config", str(cfg), "--launcher", "debug", "--out",
                       str(out), *args])  # fmt: skip
        assert rc == 0, capsys.readouterr().err
        assert result_of(out)["steps"] == steps


@pytest.mark.slow
def test_snakemake_target_runs_the_plan_through_the_local_launcher(tmp_path):
    write_plan(tmp_path / "results/optimal/tiny-gptneox/cpu/1x1", "tiny-gptneox")
    cfg = write_config(tmp_path / "c.yaml", sweep={"models": ["tiny-gptneox"], "gpus": ["cpu"], "methods": ["naive"]},
                       launcher={"kind": "local", "timeout_min": 10}, train={"steps": 2})  # fmt: skip
    target = f"results/{layout.TRAIN}/tiny-gptneox/cpu/1x1/result.json"
    proc = snakemake(tmp_path, "--configfile", str(cfg), "-c2", target)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads((tmp_path / target).read_text())
    assert res["steps"] == 2 and res["launched_by"] == "single process"
    log = (tmp_path / "results/logs/train/tiny-gptneox/cpu/1x1.log").read_text()
    assert "submitted local job" in log
    assert (tmp_path / target).with_name(layout.THROUGHPUT_MD).is_file()


# ------------------------------------------------------------------------------------- issue 54: resume, metrics
@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    """tiny-gptneox in-process: 2 steps, then the same run asked for 4 (validation every step, one batch)."""
    from pretrain_planner.train.run import train_plan

    tmp = tmp_path_factory.mktemp("extended")
    plan = write_plan(tmp / "plan", "tiny-gptneox")
    kw = {"out": tmp / "out", "threads": 1, "eval_every": 1, "eval_batches": 1, "warmup_steps": 0}
    first = train_plan(plan, steps=2, **kw)
    steps_after_first = steps_of(tmp / "out")
    second = train_plan(plan, steps=4, **kw)
    return tmp, plan, first, steps_after_first, second


def test_a_larger_step_budget_extends_the_run(extended):
    """Issue 54: --steps 4 after a 2-step run trains 2 more steps (the budget is not part of the checkpoint's
    identity), the step log continuous; the schedule is recomputed over the new budget, and the log says so."""
    tmp, _, first, before, second = extended
    assert first["steps"] == 2 and [s["step"] for s in before] == [1, 2]
    assert second["status"] == "ok" and second["steps"] == 4 and second["starts_at_step"] == [0, 2]
    steps = steps_of(tmp / "out")
    assert [s["step"] for s in steps] == [1, 2, 3, 4] and steps[:2] == before
    sched = second["schedule"]
    assert [s["lr"] for s in steps[2:]] == pytest.approx([recipe_lr(sched, 1e-3, k, k / 4, 4) for k in (2, 3)])
    log = (tmp / "out/train.log").read_text()
    assert "budget 4 steps (was 2 steps): the run is extended; the cosine schedule is recomputed" in log


def test_validation_loss_in_the_step_log_and_the_result(extended):
    """The held-out loss at every eval_every step and at the end: in steps.jsonl, metrics.csv and result.json."""
    import csv

    tmp, _, _, _, second = extended
    steps = steps_of(tmp / "out")
    assert all(isinstance(s["val_loss"], float) and 0 < s["val_loss"] < 20 for s in steps)
    assert second["val_loss"] == steps[-1]["val_loss"] and second["validation"]["held_out"] >= 1
    assert [p["step"] for p in second["validation"]["points"]] == [1, 2, 3, 4]
    with (tmp / "out/run/metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert [float(r["val_loss"]) for r in rows] == pytest.approx([s["val_loss"] for s in steps])
    assert all(float(r["tokens_per_s"]) > 0 for r in rows)


def test_tensorboard_reads_the_runs_train_and_validation_loss(extended):
    """TensorBoard's own reader finds the run's losses, one continuous series over both starts."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tmp, _, _, _, second = extended
    acc = EventAccumulator(second["metrics"]["tensorboard"])
    acc.Reload()
    steps = steps_of(tmp / "out")
    for tag, key in (("train/loss", "loss"), ("val/loss", "val_loss")):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [1, 2, 3, 4], tag
        assert [e.value for e in events] == pytest.approx([s[key] for s in steps], rel=1e-6)


def test_a_checkpoint_of_another_run_is_refused_in_one_line(extended, capsys):
    """Another seed on the same run folder: one line naming what differs and the two ways out, from the run and from
    `python -m pretrain_planner.train` (exit 2) and from `pretrain-planner train` (exit 1), before the data is prepared
    (the folder's data is left as it was); the same identity through `pretrain-planner train` then resumes it."""
    from pretrain_planner.train.__main__ import main as train_main
    from pretrain_planner.train.run import train_plan

    tmp, plan, _, _, _ = extended
    res = train_plan(plan, out=tmp / "out", steps=6, threads=1, seed=1)
    ckpt, run = tmp / "out/run/checkpoint.pt", tmp / "out/run"
    assert res == {"status": "refused", "rank": 0, "reason": f"{ckpt} was made with seed 0, this run asks seed 1: "
                   f"delete {run} to start over, or run with seed 0 to resume"}  # fmt: skip
    capsys.readouterr()
    assert train_main([str(plan), "--out", str(tmp / "out"), "--steps", "6", "--seed", "1", "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"pretrain_planner.train: {res['reason']}"
    plan8 = write_plan(tmp / "plan8", "tiny-gptneox", mb=8)  # another plan's micro-batch, the same folder
    rc = cli.main(["train", "--plan", str(plan8.parent), "--launcher", "debug", "--steps", "6", "--out",
                   str(tmp / "out"), "--threads", "1"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    was = "micro_batch 4 and grad_accum_steps 4"
    want = (
        f"pretrain-planner train: {ckpt} was made with {was}, this run asks micro_batch 8 and grad_accum_steps 2: "
        f"delete {run} to start over, or run with {was} to resume"
    )
    assert rc == 1 and err == want
    rc = cli.main(["train", "--plan", str(plan.parent), "--launcher", "debug", "--steps", "6", "--out",
                   str(tmp / "out"), "--threads", "1"])  # fmt: skip
    assert rc == 0  # the same identity (seed 0): it resumes and trains to 6
    assert [s["step"] for s in steps_of(tmp / "out")] == list(range(1, 7))


def test_the_mismatch_names_every_part_that_differs():
    from pretrain_planner.trainer.runidentity import mismatch_message

    made = {"model": "m", "micro_batch": 4, "grad_accum_steps": 4, "ranks": 1, "seed": 0}
    asked = {**made, "micro_batch": 8, "grad_accum_steps": 2}
    msg = mismatch_message(Path("r/run/checkpoint.pt"), Path("r/run"), made, {}, asked, {})
    assert msg == ("r/run/checkpoint.pt was made with micro_batch 4 and grad_accum_steps 4, this run asks micro_batch "
                   "8 and grad_accum_steps 2: delete r/run to start over, or run with micro_batch 4 and "
                   "grad_accum_steps 4 to resume")  # fmt: skip
    old = mismatch_message(Path("c.pt"), Path("r"), None, None, asked, {})
    assert "older checkpoint" in old and "delete r to start over" in old and "\n" not in old


def test_relative_and_absolute_paths_are_one_run(tmp_path, monkeypatch):
    """Issue 54: a run started with relative --data and --out resumes when given the same paths absolute."""
    from pretrain_planner.train.run import train_plan

    monkeypatch.chdir(tmp_path)
    plan = write_plan(tmp_path / "plan", "tiny-gptneox")
    (tmp_path / "corpus.txt").write_text("".join(f"Document {i} says words and more words {i % 7}.\n"
                                                 for i in range(3000)))  # fmt: skip
    kw = {"threads": 1, "eval_batches": 0, "warmup_steps": 0, "tokenizer": "train"}
    assert train_plan(plan, out="out", data="corpus.txt", steps=1, **kw)["steps"] == 1
    res = train_plan(plan, out=str(tmp_path / "out"), data=str(tmp_path / "corpus.txt"), steps=2, **kw)
    assert res["status"] == "ok" and res["starts_at_step"] == [0, 1] and res["steps"] == 2
    assert res["val_loss"] is None and res["validation"]["batches"] == 0


@pytest.mark.slow  # Snakemake, the CLI's local launcher and torchrun: three training processes
def test_the_readmes_three_train_commands_train_one_run(tmp_path):
    """Issue 54: README's three train commands, verbatim and in order, in a checkout (the repository's files linked,
    `.venv/`, a plan with its launch.sh): the Snakemake target trains config/config.yaml's 10 steps, `pretrain-planner
    train --steps 20` resumes it and trains 10 more, launch.sh --steps 40 (torchrun) 20 more; one continuous step
    log, a validation loss at the end of each, and the console shows progress with an ETA. Then launch.sh with
    another seed: one line, exit 2."""
    import yaml
    from pretrain_planner.tables.export import launch_script

    from .readme_text import readme_command

    work = tmp_path / "clone"
    (work / "config").mkdir(parents=True)
    for name in ("Snakefile", "workflow", "cluster", "envs", "pyproject.toml"):
        (work / name).symlink_to(REPO / name)
    (work / ".venv").symlink_to(BIN.parent)
    for f in (REPO / "config").iterdir():
        if f.name != "config.yaml":
            (work / "config" / f.name).symlink_to(f)
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    assert config["train"] == {"steps": 10}  # the README's story: 10, then 20, then 40 steps
    # a sweep without this setting (its plan is given here, not exported by a sweep), a validation every 10 steps
    config["sweep"]["models"] = ["tiny-bert"]
    config["train"].update(eval_every=10, eval_batches=1)
    (work / "config/config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    folder = work / "results/optimal/tiny-gptneox/cpu/1x1"
    write_plan(folder, "tiny-gptneox")
    row = {"nodes": 1, "gpus_per_node": 1, "best_method": "naive", "micro_batch": 4, "grad_accum_steps": 4,
           "step_time_s": 0.5, "training_days": 0.01}  # fmt: skip
    (folder / "launch.sh").write_text(launch_script(CATALOG.model("tiny-gptneox"), CATALOG.gpu("cpu"), row,
                                                    python=sys.executable, folder=folder))  # fmt: skip
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}  # a fresh login: the venv not on PATH
    env.pop("PYTHON", None)
    out = work / "results/train/tiny-gptneox/cpu/1x1"
    commands = [readme_command(".venv/bin/snakemake --profile cluster/local results/train/"),
                readme_command(".venv/bin/pretrain-planner train"),
                readme_command("bash results/optimal/")]  # fmt: skip
    for command, steps, starts in zip(commands, (10, 20, 40), ([0], [0, 10], [0, 10, 20]), strict=True):
        proc = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (command, proc.stdout[-2000:] + proc.stderr[-4000:])
        res = result_of(out)
        assert (res["steps"], res["starts_at_step"]) == (steps, starts), command
        assert [s["step"] for s in steps_of(out)] == list(range(1, steps + 1)), command
        assert res["val_loss"] == steps_of(out)[-1]["val_loss"] and (out / "throughput.md").is_file()
        if "snakemake" not in command:  # the console: the extension, progress lines with an ETA, rounded
            assert f"budget {steps} steps (was {steps // 2} steps): the run is extended" in proc.stdout, proc.stdout
            assert re.search(rf"train: step {steps}/{steps} \(100%\) loss \d\.\d\d val_loss \d\.\d\d [\d,]+ tokens/s "
                             r"step [\d.]+ m?s ETA 0 s", proc.stdout), proc.stdout  # fmt: skip
    assert res["method"] == "naive" and res["data"]["validation_blocks"] >= 1
    # another seed through launch.sh: refused in one line, exit 2, no traceback of torchrun's (nor any file left)
    refused = f"{readme_command('bash results/optimal/')} --seed 1"
    proc = subprocess.run(["bash", "-c", refused], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    ckpt = out.resolve() / "run/checkpoint.pt"
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"pretrain_planner.train: {ckpt} was made with seed 0, this run asks seed 1: delete" in proc.stderr
    assert [s["step"] for s in steps_of(out)] == list(range(1, 41))


@pytest.mark.slow  # five in-process runs, about 14 s
def test_each_corpus_format_trains_tiny_gptneox(tmp_path):
    """Issue 54: a generated corpus written as .npy tokens, raw .bin (uint16), a datasets folder, a parquet file and
    a jsonl folder each trains tiny-gptneox for 2 steps in-process on the cpu stand-in, its format and token count
    in the result (text: tokenized into token shards by the given tokenizer)."""
    from pretrain_planner.train.run import train_plan
    from pretrain_planner.trainer.data.tokens import byte_level_bpe

    from .test_corpus import DOCS, write_corpus

    byte_level_bpe(DOCS, 300, tmp_path / "tokenizer.json")
    plan = write_plan(tmp_path / "plan", "tiny-gptneox")
    want = {"npy": "npy tokens", "bin": "bin tokens (uint16)", "datasets": "datasets", "parquet": "parquet",
            "jsonl": "jsonl"}  # fmt: skip
    for kind, fmt in want.items():
        data = write_corpus(tmp_path / kind, kind)
        text = kind not in ("npy", "bin")
        opts = {"data_dtype": "uint16"} if kind == "bin" else {}
        if text:
            opts = {"data_field": "body", "tokenizer": str(tmp_path / "tokenizer.json")}
        res = train_plan(plan, out=tmp_path / f"out-{kind}", steps=2, data=data, threads=1, warmup_steps=1,
                         checkpoint_every_min=None, **opts)  # fmt: skip
        d = res["data"]
        assert res["steps"] == 2 and not d["synthetic"] and d["format"] == fmt, (kind, d)
        if text:
            assert d["documents"] == len(DOCS) and d["tokens"] > len(DOCS) and d["tokenizer"].startswith("from ")
        else:
            assert d["tokens"] == 4000
        assert d["blocks"] == d["tokens"] // 128 and d["seq_len"] == 128
        assert res["loss_first"] is not None
