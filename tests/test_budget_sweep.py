"""Issue 18, item 3: the paper's ablations as a Snakemake sweep - budget.sweep expands into one recipe per
combination, each pre-trained within the budget and fine-tuned on GLUE, compared in one table with a plot of
validation loss against time; and the reference's exp learning-rate curve, a value of the sweep's `curve`."""

from __future__ import annotations

import csv
import json
import math
import re

import pytest
import yaml
from pretrain_planner.budget import config as bconfig
from pretrain_planner.budget import jobs, sweep
from pretrain_planner.planning.configtypes import BudgetPrep, BudgetRecipe
from pretrain_planner.schema import ConfigError
from pretrain_planner.trainer import schedule

from .conftest import REPO, budget_workflow


def _budget_file(tmp_path, **sections):
    cfg = yaml.safe_load((REPO / "config/budget.yaml").read_text())
    cfg["corpus"]["files"] = [str(REPO / "tests/data/corpus/*.txt")]
    cfg["glue"]["data_dir"] = str(REPO / "tests/data/glue")
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "budget.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_every_combination_is_a_recipe_with_its_own_setting_and_data(tmp_path):
    cfg = bconfig.load(_budget_file(tmp_path, sweep={"global_batch": [16, 32], "seq_len": [64, 32]}), REPO)
    got = sweep.recipes_or_exit(cfg)
    assert list(got) == ["", "recipes/gb16-seq64/", "recipes/gb16-seq32/", "recipes/gb32-seq64/",
                         "recipes/gb32-seq32/"]  # fmt: skip
    assert got[""] is cfg and "recipe" not in cfg and sweep.swept(got) == list(got)[1:]
    r = got["recipes/gb32-seq32/"]
    assert r["recipe"] == {"name": "gb32-seq32", "values": {"global_batch": 32, "seq_len": 32}}
    assert r["train"]["global_batch"] == 32 and r["data"]["seq_len"] == 32 and cfg["data"]["seq_len"] == 64
    assert r["recipe_keys"]["train.global_batch"] == r["recipe_keys"]["data.seq_len"] == "sweep"
    # micro-batch 16 on one rank: the accumulation makes up each recipe's global batch
    assert [got[k]["setting"].grad_accum_steps for k in sweep.swept(got)] == [1, 1, 2, 2]
    typed = {k: BudgetRecipe.of(v) for k, v in got.items()}
    assert {k: sweep.data_key(v, typed[""]) for k, v in typed.items()} == {
        "": "data", "recipes/gb16-seq64/": "data", "recipes/gb16-seq32/": "data-seq32",
        "recipes/gb32-seq64/": "data", "recipes/gb32-seq32/": "data-seq32"}  # fmt: skip
    data = sweep.data_sets(typed)
    assert data["data"] is typed[""] and data["data-seq32"].prep.data.seq_len == 32
    # each recipe's jobs have a name of their own (the driver tracks running jobs by name)
    assert jobs._of(BudgetRecipe.of(r)) == "-gb32-seq32" and jobs._of(BudgetRecipe.of(cfg)) == ""
    names = {sweep.recipe_name(v) for v in ({"lr": 1e-3, "warmup_fraction": 0.06, "curve": "exp"},)}
    assert names == {"lr0.001-wu0.06-exp"}


def test_bad_sweeps_stop_the_parse_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"allowed keys: global_batch, lr, warmup_fraction, seq_len, curve"):
        bconfig.load(_budget_file(tmp_path, sweep={"batch": [16]}), REPO)
    cfg = bconfig.load(_budget_file(tmp_path, sweep={"global_batch": [24]}), REPO)
    with pytest.raises(SystemExit, match=r"recipe gb24: sweep.global_batch: global batch 24 is not a multiple of"):
        sweep.recipes_or_exit(cfg)
    cfg = bconfig.load(_budget_file(tmp_path, sweep={"lr": [1e-3, 1.0000001e-3]}), REPO)
    with pytest.raises(SystemExit, match=r"get the same name 'lr0.001'"):
        sweep.recipes_or_exit(cfg)
    with pytest.raises(ConfigError, match=r"sweep.curve"):
        bconfig.load(_budget_file(tmp_path, sweep={"curve": ["cosine"]}), REPO)


def test_the_exp_curve_is_the_references():
    """pretraining/schedules.py: ExpCurve under the TimeScheduler (position in hours) - warm-up value ** 2,
    then decay_rate ** ((hours - warm-up hours) / decay_step); the linear curve unchanged."""
    tr = {"curve": "exp", "decay_rate": 0.5, "decay_step_hours": 2.0}
    budget_s, wu = 10 * 3600.0, 0.1  # warm-up: the first hour
    assert schedule.lr_at(0.5 * 3600, budget_s, 1e-3, wu, tr) == pytest.approx(1e-3 * 0.25)
    assert schedule.lr_at(1 * 3600, budget_s, 1e-3, wu, tr) == pytest.approx(1e-3)
    assert schedule.lr_at(5 * 3600, budget_s, 1e-3, wu, tr) == pytest.approx(1e-3 * 0.5**2)
    assert schedule.lr_at(10 * 3600, budget_s, 1e-3, wu, tr) == pytest.approx(1e-3 * 0.5**4.5)
    lin = {"curve": "linear", "decay_rate": 0.5, "decay_step_hours": 2.0}
    for h in (0.5, 1, 5, 10):
        assert schedule.lr_at(h * 3600, budget_s, 1e-3, wu, lin) == schedule.lr_at(h * 3600, budget_s, 1e-3, wu)
    assert schedule.lr_at(5 * 3600, budget_s, 1e-3, wu, lin) == pytest.approx(1e-3 * 5 / 9)


@pytest.fixture(scope="module")
def swept_run(tmp_path_factory):
    """The `budget` target with a 2 x 2 sweep (global batch x sequence length) through our own Snakefile, jobs in
    the driver's threads (debug launcher), one GLUE task, one setting, one seed."""
    work = tmp_path_factory.mktemp("budget_sweep")
    (work / "config").mkdir()
    path = _budget_file(
        work / "config",
        sweep={"global_batch": [16, 32], "seq_len": [32, 64]},
        glue={"tasks": ["rte"], "lr": 1e-3, "batch": 16, "epochs": 1, "seeds": [0], "eval_steps": 2},
    )
    # 6 steps in each recipe
    return budget_workflow(work, yaml.safe_load(path.read_text()), "debug", 6, micro_batch=16, plot=False) / "budget"


@pytest.mark.slow
def test_the_sweep_pretrains_finetunes_and_compares_every_recipe(swept_run):
    res = swept_run
    rows = list(csv.DictReader((res / "sweep.csv").open()))
    assert [r["recipe"] for r in rows] == ["gb16-seq32", "gb16-seq64", "gb32-seq32", "gb32-seq64"]
    for r in rows:
        gb, seq = int(r["global_batch"]), int(r["seq_len"])
        assert r["recipe"] == f"gb{gb}-seq{seq}" and r["stop_reason"] == "budget" and int(r["steps"]) == 6
        assert int(r["sequences"]) == 6 * gb and int(r["tokens"]) == 6 * gb * seq
        assert math.isfinite(float(r["val_loss"])) and math.isfinite(float(r["loss_last"]))
        assert int(r["glue_tasks"]) == 1 and 0 <= float(r["glue_avg"]) <= 100
        result = json.loads((res / f"recipes/{r['recipe']}/pretrain/result.json").read_text())
        assert result["recipe"]["values"] == {"global_batch": gb, "seq_len": seq}
        assert result["setting"]["grad_accum_steps"] == gb // 16 and result["global_batch"] == gb
        assert [v["step"] for v in result["validation"]] == [3, 6]  # half-way and the end, on the budget's clock
        assert [v["elapsed_s"] for v in result["validation"]] == pytest.approx([3.0, 6.0])
        glue_rte = json.loads((res / f"recipes/{r['recipe']}/glue/rte/metrics.json").read_text())
        assert glue_rte["init_model"].endswith(f"recipes/{r['recipe']}/pretrain/model")
        assert float(r["glue_avg"]) == pytest.approx(100 * glue_rte["acc"])
    # one data preparation per sequence length; the budget file's own recipe is not run
    assert json.loads((res / "data-seq32/index.json").read_text())["seq_len"] == 32
    assert json.loads((res / "data/index.json").read_text())["seq_len"] == 64
    assert not (res / "pretrain").exists() and not (res / "glue.csv").exists()
    md = (res / "sweep.md").read_text()
    assert re.search(r"\| recipe +\| global_batch +\| seq_len +\| stop_reason +\| steps +\| sequences +\|", md)
    assert "Lowest validation loss" in md and "Highest GLUE average" in md
    png = (res / "sweep_loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


@pytest.mark.slow
def test_a_run_on_the_exp_curve_follows_it(tmp_path):
    """train.curve exp drives the pre-training's learning rate: each step's lr (logged) is the curve's at the
    step's start on the fake clock (1 s a step), not the linear one's."""
    from pretrain_planner.budget import pretrain
    from pretrain_planner.trainer.data import mlm as data

    from .conftest import budget_cfg

    cfg = budget_cfg(tmp_path)
    cfg["train"].update(curve="exp", decay_rate=0.5, decay_step_hours=3 / 3600)  # halves every 3 s
    data.prepare_data(BudgetPrep.of(cfg), tmp_path / "data/index.json")
    d = tmp_path / "run"
    result = pretrain.pretrain(cfg, tmp_path / "data/index.json", d / "model", d / "result.json", d / "run",
                               d / "log", threads=1)  # fmt: skip
    steps = [json.loads(ln) for ln in (d / "run/steps.jsonl").read_text().splitlines()]
    budget_s, tr = result["budget_s"], cfg["train"]
    assert len(steps) == result["steps"] >= 8
    want = [schedule.lr_at(k, budget_s, tr["lr"], tr["warmup_fraction"], tr) for k in range(len(steps))]
    assert [s["lr"] for s in steps] == pytest.approx(want, rel=1e-6, abs=1e-12)
    linear = [schedule.lr_at(k, budget_s, tr["lr"], tr["warmup_fraction"]) for k in range(len(steps))]
    assert want != pytest.approx(linear, rel=0.1)  # a different curve: quadratic warm-up, halving every 3 s
    assert steps[-1]["lr"] == pytest.approx(tr["lr"] * 0.5 ** ((len(steps) - 1 - tr["warmup_fraction"] * budget_s) / 3))


def test_the_presets_commented_sweep_is_the_papers_grid(tmp_path):
    """config/budget-24h.yaml's sweep, uncommented: 9 recipes of the catalog's 24-hour recipe, each with its global
    batch made up by accumulation over micro-batch 32 x 8 GPUs, everything else the recipe's."""
    from .conftest import preset_cfg

    text = (REPO / "config/budget-24h.yaml").read_text()
    commented = text[text.index("# sweep:") :].splitlines()
    grid = yaml.safe_load("\n".join(line.removeprefix("# ") for line in commented))["sweep"]
    assert grid == {"global_batch": [4096, 8192, 16384], "lr": [5e-4, 1e-3, 2e-3]}
    got = sweep.recipes_or_exit(preset_cfg(tmp_path, sweep=grid))
    swept = sweep.swept(got)
    assert len(swept) == 9 and swept[0] == "recipes/gb4096-lr0.0005/" and swept[-1] == "recipes/gb16384-lr0.002/"
    assert [got[r]["setting"].grad_accum_steps for r in swept[::3]] == [16, 32, 64]
    assert {got[r]["train"]["precision"] for r in swept} == {"fp16"} and got[""]["train"]["lr"] == 1e-3
    assert got["recipes/gb8192-lr0.002/"]["recipe_keys"]["train.lr"] == "sweep"
    assert got[""]["recipe_keys"]["train.lr"] == "catalog"
