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


@pytest.mark.slow  # five in-process runs, about 14 s
def test_each_corpus_format_trains_tiny_gptneox(tmp_path):
    """Issue 54: a generated corpus written as .npy tokens, raw .bin (uint16), a datasets folder, a parquet file and
    a jsonl folder each trains tiny-gptneox for 2 steps in-process on the cpu stand-in, its format and token count
    in the result (text: tokenized into token shards by the given tokenizer)."""
    from pretrain_planner.train.run import train_plan
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from .test_corpus import DOCS, write_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(DOCS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                      show_progress=False))  # fmt: skip
    tok.save(str(tmp_path / "tokenizer.json"))
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
