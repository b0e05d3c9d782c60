"""Budget stage: micro-batch, accumulation and method from the benchmark's plan (or the config), and sparse
prediction in the budget model."""

from __future__ import annotations

import json

import pytest
import torch
from pretrain_planner.budget import config as bconfig
from pretrain_planner.budget import jobs, pretrain
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.configtypes import BudgetPrep, BudgetRecipe
from pretrain_planner.schema import ConfigError
from pretrain_planner.tables.export import _plan_record
from pretrain_planner.trainer.data import mlm as data
from pretrain_planner.trainer.data import shards
from pretrain_planner.trainer.models import build_model

from .conftest import DEBUG_LAUNCH, REPO, budget_cfg, snakemake, write_config

CATALOG = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")


def _write_plan(results, method="fl+ac", mb=4, accum=2, gpn=2):
    """A plan.json as the export_plan rule writes it, for catalog model tiny-bert on 1 x gpn cpu."""
    row = {"best_method": method, "nodes": 1, "gpus_per_node": gpn, "micro_batch": mb, "grad_accum_steps": accum,
           "step_time_s": 0.1, "training_days": 1.0}  # fmt: skip
    rec = _plan_record(CATALOG.model("tiny-bert"), CATALOG.gpu("cpu"), row, [])
    path = results / "optimal/tiny-bert/cpu" / f"1x{gpn}" / "plan.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rec))
    return path


def _cfg(tmp_path, **train):
    """A budget config file for catalog model tiny-bert with these train settings."""
    return budget_cfg(tmp_path, load=False, model="tiny-bert", train=train)


def test_setting_from_benchmark_plan_config_or_error(tmp_path):
    results = tmp_path / "results"
    path = _cfg(tmp_path, gpus_per_node=2, setting="benchmark")
    with pytest.raises(ConfigError) as err:  # asked for the benchmark's, there is none: name the file and keys
        bconfig.resolve_setting(bconfig.load(path, results=results), results, str(path))
    msg = str(err.value)
    assert "train.setting: benchmark" in msg and str(results / "optimal/tiny-bert/cpu/1x2/plan.json") in msg
    assert "train.gpu" in msg and "export_plan" in msg
    plan = _write_plan(results)
    s = bconfig.load(path, results=results)["setting"].to_json()
    assert s == {"gpu": "cpu", "nodes": 1, "gpus_per_node": 2, "world_size": 2, "source": "benchmark",
                 "plan": str(plan), "micro_batch": 4, "grad_accum_steps": 2, "global_batch": 16,
                 "method": "fl+ac", "grad_sync": None}  # fmt: skip
    assert bconfig.load(_cfg(tmp_path, gpus_per_node=2, setting="auto"), results=results)["setting"].source == (
        "benchmark"
    )
    own = bconfig.load(_cfg(tmp_path, gpus_per_node=2, setting="config", micro_batch=2), results=results)["setting"]
    assert (own.source, own.micro_batch, own.grad_accum_steps, own.method.slug) == ("config", 2, 2, "fl")
    # auto without a plan for that count: the config's
    assert bconfig.load(_cfg(tmp_path, gpus_per_node=1), results=results)["setting"].source == "config"
    with pytest.raises(ConfigError, match=r"global batch \d+ is not a multiple of micro-batch 4 x 4 ranks"):
        bconfig.load(_cfg(tmp_path, gpus_per_node=4, setting="config"), results=results)


def test_fsdp_gradient_sync_comes_from_the_plan(tmp_path):
    """Issue 16: the budget stage runs FSDP2 with the gradient synchronisation the measurement found to fit (the
    plan's method_settings.fsdp_policy.grad_sync), not always once per step."""
    results = tmp_path / "results"
    plan = _write_plan(results, method="naive+fsdp-grad")
    rec = json.loads(plan.read_text())
    assert rec["method_settings"]["fsdp_policy"]["grad_sync"] == "last"
    rec["method_settings"]["fsdp_policy"]["grad_sync"] = "every"  # as a cell that fitted only so records it
    plan.write_text(json.dumps(rec))
    s = bconfig.load(_cfg(tmp_path, gpus_per_node=2, setting="benchmark"), results=results)["setting"]
    assert s.method.slug == "naive+fsdp-grad" and s.grad_sync == "every"


@pytest.mark.slow  # Snakemake's dry run in a subprocess
def test_missing_plan_warns_at_parse_and_stops_the_pretrain_job(tmp_path):
    path = budget_cfg(tmp_path, load=False, model="tiny-bert", train={"setting": "benchmark", "gpu": "cpu"})
    main = write_config(tmp_path / "main.yaml", budget=str(path), sweep={"models": ["tiny-bert"], "gpus": ["cpu"]},
                        launcher={"kind": "local"})  # fmt: skip
    proc = snakemake(tmp_path, "budget", "-n", "--configfile", str(main))
    assert proc.returncode == 0, proc.stderr[-3000:]  # a benchmark sweep can still run (and write the plan)
    assert "warning" in proc.stderr and "results/optimal/tiny-bert/cpu/1x1/plan.json" in proc.stderr
    cfg = bconfig.load(path, results=tmp_path / "results")
    assert cfg["setting"].source == "missing"
    with pytest.raises(ConfigError, match="train.setting: benchmark, but there is no benchmark plan"):
        jobs.pretrain(BudgetRecipe.of(cfg), DEBUG_LAUNCH, "i", "m", "r", "run",
                      "log")  # fmt: skip
    _write_plan(tmp_path / "results", gpn=1)
    with pytest.raises(ConfigError, match="It exists now"):
        jobs.pretrain(BudgetRecipe.of(cfg), DEBUG_LAUNCH, "i", "m", "r", "run",
                      "log")  # fmt: skip


@pytest.mark.slow  # Snakemake's dry run in a subprocess
def test_a_benchmark_run_never_reads_the_budget_files(tmp_path):
    """A budget file whose corpus matches nothing stops the `budget` target's dry run, naming the file and the key,
    but not a benchmark sweep's: the stage's files are read only when one of its rules is asked for."""
    path = budget_cfg(tmp_path, load=False, model="tiny-bert", corpus={"files": [str(tmp_path / "missing-*.txt")]})
    main = write_config(tmp_path / "main.yaml", budget=str(path), sweep={"models": ["tiny-gptneox"], "gpus": ["cpu"]},
                        launcher={"kind": "local"})  # fmt: skip
    proc = snakemake(tmp_path, "-n", "--configfile", str(main))
    assert proc.returncode == 0 and "budget configuration error" not in proc.stderr, proc.stderr[-3000:]
    proc = snakemake(tmp_path, "budget", "-n", "--configfile", str(main))
    assert proc.returncode != 0
    assert "budget configuration error" in proc.stderr and "corpus.files" in proc.stderr and str(path) in proc.stderr


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("setting")
    cfg = budget_cfg(tmp)
    data.prepare_data(BudgetPrep.of(cfg), tmp / "data/index.json")
    return tmp, json.loads((tmp / "data/index.json").read_text())


@pytest.mark.slow  # a training run
def test_pretrain_applies_and_records_the_benchmark_setting(prepared, tmp_path):
    tmp, _ = prepared
    results = tmp_path / "results"
    _write_plan(results, method="fl+ac", mb=2, accum=3, gpn=1)
    cfg = bconfig.load(_cfg(tmp_path, max_steps=2), results=results)
    d = tmp_path / "run"
    res = pretrain.pretrain(
        cfg, tmp / "data/index.json", d / "model", d / "result.json", d / "run", d / "log", threads=1
    )
    assert res["setting"]["source"] == "benchmark" and res["setting"]["plan"].endswith("tiny-bert/cpu/1x1/plan.json")
    assert (res["micro_batch"], res["grad_accum_steps"], res["global_batch"]) == (2, 3, 6)
    assert res["method_settings"]["activation_checkpointing"] and res["method_settings"]["method"] == "fl+ac"
    assert res["method_settings"]["attn_implementation"] == "sdpa" and "global batch 6" in res["note"]
    assert json.loads((d / "result.json").read_text())["setting"] == res["setting"]


def test_sparse_prediction_is_in_effect(prepared):
    """The budget model's head and loss see only the masked positions, and the loss is the dense head's."""
    tmp, index = prepared
    cfg = budget_cfg(tmp)
    shipped = bconfig.load(REPO / "config/budget.yaml", REPO)
    assert shipped["model"]["arch"]["sparse_prediction"] is True
    assert CATALOG.model("bert-24h").arch["sparse_prediction"] is True
    recipe = BudgetRecipe.of(cfg)
    mdict = pretrain.model_dict(recipe.model, recipe.prep.tokenizer, index)
    torch.manual_seed(0)
    sparse, _ = build_model(mdict, "eager")
    dense, _ = build_model({**mdict, "arch": {**mdict["arch"], "sparse_prediction": False}}, "eager")
    dense.load_state_dict(sparse.state_dict())
    sparse.eval(), dense.eval()
    sampler = shards.ShardSampler(tmp / "data", index["splits"]["train"], index["duplication_factor"], 0)
    batch = shards.to_batch(sampler.take(4), index["special_ids"]["pad"], torch.device("cpu"))
    masked = int((batch["labels"] != -100).sum())
    with torch.no_grad():
        out_s, out_d = sparse(**batch), dense(**batch)
    assert type(sparse).__name__.endswith("WithSparsePrediction")
    # the head spans the vocabulary padded to a multiple of 8 (tokenizer.pad_vocab_to_multiple_of), as the reference
    assert mdict["arch"]["vocab_size"] == -(-index["vocab_size"] // 8) * 8
    assert out_s.logits.shape == (masked, mdict["arch"]["vocab_size"])
    assert out_d.logits.shape[:2] == batch["input_ids"].shape
    assert masked < batch["input_ids"].numel() // 4
    assert float(out_s.loss) == pytest.approx(float(out_d.loss), rel=1e-5)
