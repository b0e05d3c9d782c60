"""Budget stage: GLUE readers and metrics, and the whole stage end to end through Snakemake on CPU."""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest
import yaml
from pretrain_planner.budget import glue, glue_report
from pretrain_planner.planning.configtypes import BudgetGlue

from .conftest import REPO, budget_workflow


def glue_section(**over) -> BudgetGlue:
    """The budget file's glue section, typed as a job types it: the schema's defaults, `over` replacing keys."""
    from pretrain_planner.schema import validate

    section = validate({"corpus": {"files": ["c.txt"]}, "model": "tiny-bert"}, "budget", "test")["glue"]
    return BudgetGlue.of({**section, **over})


def test_metrics_are_the_libraries_of_the_reference():
    """scikit-learn's accuracy, F1, Matthews and scipy's Pearson, Spearman (the reference's `glue` metric), not
    hand-written ones: equal on random data with ties, and NaN where scipy gives NaN (a constant prediction)."""
    import importlib

    from scipy import stats
    from sklearn import metrics as skm

    m = glue.glue_metrics
    rng = np.random.default_rng(0)
    y, p = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
    for metric, dotted in m.LIBRARY.items():  # what the table says computes each metric is what does
        module, name = dotted.rsplit(".", 1)
        got = getattr(importlib.import_module(module), name)(y, p)
        assert m.compute(metric, y, p) == pytest.approx(float(got[0] if isinstance(got, tuple) else got)), dotted
    y, p = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
    assert m.compute("acc", y, p) == skm.accuracy_score(y, p)
    assert m.compute("f1", y, p) == skm.f1_score(y, p)
    assert m.compute("mcc", y, p) == skm.matthews_corrcoef(y, p)
    a, b = rng.integers(0, 5, 40).astype(float), rng.normal(size=40)  # ties in `a`
    assert m.compute("pearson", a, b) == pytest.approx(stats.pearsonr(a, b)[0], abs=1e-12)
    assert m.compute("spearman", a, b) == pytest.approx(stats.spearmanr(a, b)[0], abs=1e-12)
    assert math.isnan(m.compute("pearson", a, np.ones_like(a)))  # scipy: NaN (a hand-written one said 0.0)
    assert m.compute("mcc", y, np.ones_like(y)) == 0.0
    assert {t: m.monitor(t) for t in ("cola", "mrpc", "qqp", "stsb", "mnli", "rte")} == {
        "cola": "mcc", "mrpc": "f1", "qqp": "f1", "stsb": "spearman", "mnli": "acc", "rte": "acc"}  # fmt: skip


def test_grid_and_the_median_of_the_best_setting():
    """Every lr x batch x epochs (a scalar is a one-value axis); per setting the median over seeds, the best
    setting by that median (not by its best seed, nor by the mean)."""
    assert glue.grid(glue_section(lr=[1e-4, 5e-5], batch=32, epochs=[3, 5])) == [
        {"lr": 1e-4, "batch": 32, "epochs": 3}, {"lr": 1e-4, "batch": 32, "epochs": 5},
        {"lr": 5e-5, "batch": 32, "epochs": 3}, {"lr": 5e-5, "batch": 32, "epochs": 5}]  # fmt: skip
    runs = [
        # setting A: one lucky seed (best single run and best mean), median 0.50
        {"lr": 1e-4, "batch": 16, "epochs": 3, "seed": 0, "acc": 0.50, "f1": 0.1},
        {"lr": 1e-4, "batch": 16, "epochs": 3, "seed": 1, "acc": 0.95, "f1": 0.2},
        {"lr": 1e-4, "batch": 16, "epochs": 3, "seed": 2, "acc": 0.48, "f1": 0.3},
        # setting B: median 0.60
        {"lr": 5e-5, "batch": 32, "epochs": 3, "seed": 0, "acc": 0.60, "f1": 0.6},
        {"lr": 5e-5, "batch": 32, "epochs": 3, "seed": 1, "acc": 0.58, "f1": 0.4},
        {"lr": 5e-5, "batch": 32, "epochs": 3, "seed": 2, "acc": 0.62, "f1": float("nan")},
    ]
    agg = glue.glue_metrics.aggregate(runs, "acc", ["acc", "f1"])
    assert agg["setting"] == {"lr": 5e-5, "batch": 32, "epochs": 3} and agg["seeds"] == [0, 1, 2]
    assert agg["metrics"] == {"acc": pytest.approx(0.60), "f1": pytest.approx(0.5)}  # NaN left out of a median
    assert [s["acc"] for s in agg["settings"]] == [pytest.approx(0.50), pytest.approx(0.60)]


def _tiny_classifier(num_labels=2):
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=num_labels)  # fmt: skip
    model = tf.BertForSequenceClassification(cfg)

    def encode(rows):
        ids = torch.tensor([[2 + (hash(r[0]) % 30) for _ in range(4)] for r in rows])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    return model, encode


def test_a_run_warms_up_decays_clips_evaluates_every_n_steps_and_keeps_the_best(monkeypatch):
    """run_glue's recipe: linear warm-up then linear decay, gradient norm clipped at 1.0, an evaluation every
    eval_steps; with glue.select best_dev (an option since issue 24) the best evaluated checkpoint restored at the
    end, and patience stopping the run."""
    import torch
    import transformers as tf
    from pretrain_planner.budget import glue_train
    from pretrain_planner.trainer import methodbuild

    model, encode = _tiny_classifier()
    x = [(f"row {i}",) for i in range(40)]
    y = [i % 2 for i in range(40)]
    task = glue.TASKS["rte"]
    g = glue_section(weight_decay=0.01, warmup_steps=3, eval_steps=2, patience=2, max_grad_norm=1.0,
                     select="best_dev")  # fmt: skip
    # the schedule, a catalog schedule (trainer/schedule.py): 0 -> lr over 3 warm-up steps, then linear to 0 at the
    # last of 13 steps; within 1e-7 of run_glue.py's (transformers' polynomial decay, power 1, to lr_end 1e-7)
    lrs = [glue_train.lr_at(glue_train.schedule(3, 13), 1e-3, k, 13) for k in range(14)]
    assert lrs[:4] == pytest.approx([0, 1e-3 / 3, 2e-3 / 3, 1e-3]) and lrs[8] == pytest.approx(1e-3 * 5 / 10)
    assert lrs[13] == 0.0 and glue_train.schedule(50, 20) == {"name": "linear", "warmup_steps": 19}
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3)
    reference = tf.get_polynomial_decay_schedule_with_warmup(sgd, 3, 13, lr_end=1e-7, power=1.0)
    for k in range(13):
        assert abs(sgd.param_groups[0]["lr"] - lrs[k]) <= 1e-7 + 1e-12, k
        sgd.step()
        reference.step()
    # AdamW as transformers' Trainer builds it (the trainer's construction): no weight decay on biases and LayerNorm
    opt = glue_train.build_optimizer(model, 1e-3, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = ([names[id(p)] for p in group["params"]] for group in opt.param_groups)
    assert [group["weight_decay"] for group in opt.param_groups] == [0.01, 0.0] and len(names) == len(decay + no_decay)
    assert not any(n.endswith("bias") or "LayerNorm" in n for n in decay) and "classifier.weight" in decay
    assert all(n.endswith("bias") or "LayerNorm" in n for n in no_decay)
    assert (opt.defaults["betas"], opt.defaults["eps"], opt.defaults["lr"]) == ((0.9, 0.999), 1e-8, 1e-3)
    # the run's steps are the shared loop's: its learning rate set by methodbuild.Built, clipped by TrainStep
    set_lrs, clips = [], []
    real_set_lr, real_clip = methodbuild.Built.set_lr, torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(methodbuild.Built, "set_lr", lambda self, v: set_lrs.append(v) or real_set_lr(self, v))
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda ps, norm: clips.append(norm) or real_clip(ps, norm))
    # scripted dev scores: best at the 2nd evaluation (step 4), then two without improvement -> stop at step 8
    scores, states = iter([0.5, 0.7, 0.6, 0.7]), []

    def scripted(m, enc, devs, t, batch):
        states.append({k: v.clone() for k, v in m.state_dict().items()})
        return {"acc": next(scores), "dev_rows": 24}

    monkeypatch.setattr(glue_train, "evaluate", scripted)
    run = glue_train.train_run(model, encode, x, y, {"dev": (x, y)}, task, g, lr=1e-3, batch=4, epochs=3, seed=0,
                               device=torch.device("cpu"))  # fmt: skip
    assert run["total_steps"] == 30 and run["steps"] == 8 and run["stopped_early"]
    assert [e["step"] for e in run["evaluations"]] == [2, 4, 6, 8] and run["best_step"] == 4 and run["acc"] == 0.7
    assert clips == [1.0] * 8
    assert set_lrs == pytest.approx([glue_train.lr_at(glue_train.schedule(3, 30), 1e-3, k, 30) for k in range(8)])
    final = model.state_dict()
    assert all(torch.equal(final[k], states[1][k]) for k in final)  # the step-4 weights, not the last ones
    assert not all(torch.equal(final[k], states[3][k]) for k in final)
    # without patience: every eval_steps and once after the last step
    model, encode = _tiny_classifier()
    scores = iter([0.1] * 100)
    run = glue_train.train_run(model, encode, x, y, {"dev": (x, y)}, task, replace(g, patience=None, eval_steps=4),
                               lr=1e-3, batch=8, epochs=2, seed=0, device=torch.device("cpu"))  # fmt: skip
    assert [e["step"] for e in run["evaluations"]] == [4, 8, 10] and not run["stopped_early"]


def test_a_run_reports_its_final_model_by_default(monkeypatch):
    """The reference's command evaluates the model after the last step (run_glue.py: trainer.evaluate() after
    trainer.train(), no load_best_model_at_end): the run reports that evaluation and keeps those weights, however
    much better an earlier one scored; the best evaluation is recorded beside it. Patience needs best_dev."""
    import torch
    from pretrain_planner.budget import glue_train

    model, encode = _tiny_classifier()
    x, y = [(f"row {i}",) for i in range(40)], [i % 2 for i in range(40)]
    g = glue_section(weight_decay=0.01, warmup_steps=3, eval_steps=2, patience=None, max_grad_norm=1.0,
                     select="final")  # fmt: skip
    scores, states = iter([0.5, 0.9, 0.6, 0.4, 0.55]), []

    def scripted(m, enc, devs, t, batch):
        states.append({k: v.clone() for k, v in m.state_dict().items()})
        return {"acc": next(scores), "dev_rows": 40}

    monkeypatch.setattr(glue_train, "evaluate", scripted)
    run = glue_train.train_run(model, encode, x, y, {"dev": (x, y)}, glue.TASKS["rte"], g, lr=1e-3, batch=4,
                               epochs=1, seed=0, device=torch.device("cpu"))  # fmt: skip
    assert [e["step"] for e in run["evaluations"]] == [2, 4, 6, 8, 10] and run["steps"] == 10
    assert run["acc"] == 0.55 and run["select"] == "final" and run["selected_step"] == 10
    assert run["best_step"] == 4 and run["best_dev_acc"] == 0.9
    final = model.state_dict()
    assert all(torch.equal(final[k], states[-1][k]) for k in final)  # the last weights, not the step-4 ones
    with pytest.raises(ValueError, match="glue.patience needs glue.select: best_dev"):
        glue_train.train_run(model, encode, x, y, {"dev": (x, y)}, glue.TASKS["rte"], replace(g, patience=2),
                             lr=1e-3, batch=4, epochs=1, seed=0, device=torch.device("cpu"))  # fmt: skip


def test_the_default_is_the_final_model_and_patience_needs_best_dev(tmp_path):
    from pretrain_planner.budget import config as bconfig
    from pretrain_planner.schema import ConfigError

    from .conftest import budget_cfg

    assert budget_cfg(tmp_path)["glue"]["select"] == "final"
    with pytest.raises(ConfigError, match=r"budget.yaml: glue.patience 2 needs glue.select: best_dev"):
        bconfig.load(budget_cfg(tmp_path, load=False, glue={"patience": 2}))
    assert budget_cfg(tmp_path, glue={"patience": 2, "select": "best_dev"})["glue"]["select"] == "best_dev"


def _metric_files(tmp_path, select: str | None = None) -> list[str]:
    files = []
    for task, metrics in {"mnli": {"acc": 0.61, "acc_mm": 0.6}, "rte": {"acc": 0.55},
                          "stsb": {"pearson": 0.3, "spearman": 0.25}}.items():  # fmt: skip
        f = tmp_path / f"{task}.json"
        record = {"task": task, "init": "pretrained", "setting": {"lr": 5e-5, "batch": 32, "epochs": 5},
                  "seeds": [0, 1, 2, 3, 4], **metrics, **({"select": select} if select else {})}  # fmt: skip
        f.write_text(json.dumps(record))
        files.append(str(f))
    return files


def test_every_average_on_one_basis_with_its_entries(tmp_path):
    """MNLI matched and mismatched count as two entries in every average shown - ours, the published 24-hour
    model's, Cramming's (which counts them so) - and each average lists its entries."""
    glue_report.glue_table(_metric_files(tmp_path, "final"), tmp_path / "glue.csv", tmp_path / "glue.md")
    md = (tmp_path / "glue.md").read_text()
    assert "Average score over 4 entries (dev): 51.5 - entries: mnli, mnli_mm, rte, stsb" in md  # (61+60+55+30)/4
    assert "Published 24-hour model, same entries (test): 77.0 - entries: mnli, mnli_mm, rte, stsb" in md
    assert "all 9 entries (test): 78.5 - entries: mnli, mnli_mm, qnli, qqp, rte, sst2, mrpc, cola, stsb" in md
    assert "MNLI matched and mismatched as two entries, WNLI left out" in md
    assert "Cramming" in md.split("on the same basis")[1]
    assert "MosaicBERT" in md.split("Quoted apart")[1]
    assert "each run's **final model**" in md and "best dev checkpoint" not in md
    rows = list(csv.DictReader((tmp_path / "glue.csv").open()))
    assert {r["select"] for r in rows} == {"final"}
    mnli_wnli = [{"task": "mnli", "acc": 0.8, "acc_mm": 0.7}, {"task": "wnli", "acc": 0.5}]
    assert glue_report.average_score(mnli_wnli) == (["mnli", "mnli_mm"], pytest.approx(75.0))


def test_a_best_dev_table_says_it_is_biased(tmp_path):
    glue_report.glue_table(_metric_files(tmp_path, "best_dev"), tmp_path / "glue.csv", tmp_path / "glue.md")
    md = (tmp_path / "glue.md").read_text()
    assert "**best dev checkpoint**" in md and "biased upward" in md


def test_table_shows_the_published_24h_test_numbers_beside_ours(tmp_path):
    files = _metric_files(tmp_path)
    rows = glue_report.glue_table(files, tmp_path / "glue.csv", tmp_path / "glue.md")
    got = {r["task"]: r for r in csv.DictReader((tmp_path / "glue.csv").open())}
    assert [r["task"] for r in rows] == ["mnli", "rte", "stsb"]
    assert (got["mnli"]["published_24h_test"], got["mnli"]["published_24h_test_mm"]) == ("84.4", "83.8")
    assert got["rte"]["published_24h_test"] == "57.7" and got["stsb"]["published_24h_test"] == "82.0"
    assert got["rte"]["seeds"] == "5" and got["rte"]["lr"] == "5e-05" and got["stsb"]["score"] == "0.3"
    md = (tmp_path / "glue.md").read_text()
    # tables.markdown's table: padded columns, metrics x100 in 3 digits, the published numbers beside them
    assert re.search(r"\| mnli +\| pretrained +\| 0\.00005 +\| 32 +\| 5 +\| 5 +\| 61 +\| 60 +\|", md)
    assert re.search(r"\| mnli +\|.* 84\.4 +\|", md) and re.search(r"\| mnli +\|.* 83\.8 +\|", md)  # (a cut table)
    assert "dev-set" in md and "*test* sets" in md and "median over seeds of the best setting" in md
    assert "Published 24-hour model, same entries (test): 77.0" in md  # (84.4 + 83.8 + 57.7 + 82.0) / 4
    assert "Cramming" in md and "78.6" in md and "80.7" in md and "MosaicBERT" in md and "79.6" in md


def test_readers_of_the_standard_layout(tmp_path):
    (tmp_path / "CoLA").mkdir()
    (tmp_path / "CoLA/train.tsv").write_text("gj04\t1\t\tThe cat sat.\ngj04\t0\t*\tCat the sat.\n")
    x, y = glue.read_tsv(tmp_path / "CoLA/train.tsv", glue.TASKS["cola"])
    assert x == [("The cat sat.",), ("Cat the sat.",)] and y == [1, 0]
    x, y = glue.read_tsv(REPO / "tests/data/glue/MNLI/dev_matched.tsv", glue.TASKS["mnli"])
    assert len(x) == 24 and set(y) <= {0, 1, 2} and all(len(r) == 2 for r in x)
    x, y = glue.read_tsv(REPO / "tests/data/glue/STS-B/train.tsv", glue.TASKS["stsb"])
    assert all(isinstance(v, float) and 0 <= v <= 5 for v in y)
    x, y = glue.read_tsv(REPO / "tests/data/glue/MRPC/train.tsv", glue.TASKS["mrpc"])
    assert len(x) == 48 and set(y) == {0, 1}
    assert glue.task_dir(REPO / "tests/data/glue", "stsb").name == "STS-B"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """A Snakefile of our own that includes common.smk and pretrain.smk, run to the `budget` target with the
    local launcher: pre-training on two ranks, each fine-tune in a process of its own."""
    work = tmp_path_factory.mktemp("budget_e2e")
    cfg = yaml.safe_load((REPO / "config/budget.yaml").read_text())
    cfg["corpus"]["files"] = [str(REPO / "tests/data/corpus/*.txt")]
    # the protocol's grid at its smallest: 2 settings (learning rates) x 2 seeds per task
    cfg["glue"].update(data_dir=str(REPO / "tests/data/glue"), lr=[1e-3, 3e-4], batch=16, epochs=1, seeds=[0, 1],
                       eval_steps=2)  # fmt: skip
    # two data-parallel ranks (gloo processes of the local launcher): global batch 32 = 8 x 2 x 2; 10 steps
    return budget_workflow(work, cfg, "local", 10, checkpoint_every_s=5, gpus_per_node=2, micro_batch=8)


@pytest.mark.slow
def test_end_to_end_glue_table(pipeline):
    res = pipeline
    rows = {r["task"]: r for r in csv.DictReader((res / "budget/glue.csv").open())}
    assert list(rows) == ["mnli", "rte", "mrpc", "stsb"]
    filled = {t: {k for k in ("acc", "acc_mm", "f1", "mcc", "pearson", "spearman") if r[k]} for t, r in rows.items()}
    assert filled == {"mnli": {"acc", "acc_mm"}, "rte": {"acc"}, "mrpc": {"acc", "f1"}, "stsb": {"pearson", "spearman"}}
    assert rows["mnli"]["init"] == "pretrained" and {rows[t]["init"] for t in ("rte", "mrpc", "stsb")} == {"mnli"}
    assert float(rows["mrpc"]["score"]) == float(rows["mrpc"]["f1"])
    assert float(rows["stsb"]["score"]) == float(rows["stsb"]["pearson"])
    md = (res / "budget/glue.md").read_text()
    assert re.search(r"\| mnli +\| pretrained +\| (0\.001|0\.0003) +\| 16 +\| 1 +\| 2 +\|", md)
    assert "Average score" in md and re.search(r"\| mnli +\|.* 84\.4 +\|", md) and re.search(r"\| mnli +\|.* 83\.8", md)
    for task in ("mnli", "rte", "mrpc", "stsb"):
        m = json.loads((res / f"budget/glue/{task}/metrics.json").read_text())
        key = m["monitor"]
        assert [(r["lr"], r["seed"]) for r in m["runs"]] == [(1e-3, 0), (1e-3, 1), (3e-4, 0), (3e-4, 1)], task
        assert all(r["evaluations"][0]["step"] == 2 and r["steps"] == r["total_steps"] == 3 for r in m["runs"])
        best = m["setting"]
        mine = [r[key] for r in m["runs"] if r["lr"] == best["lr"]]
        other = [r[key] for r in m["runs"] if r["lr"] != best["lr"]]
        assert m[key] == pytest.approx(float(np.median(mine))) and m[key] >= float(np.median(other)), task
        assert float(rows[task]["lr"]) == best["lr"] and rows[task]["seeds"] == "2"
    mnli = json.loads((res / "budget/glue/mnli/metrics.json").read_text())
    assert mnli["model"]["lr"] == mnli["setting"]["lr"] and mnli["model"]["seed"] in (0, 1)


@pytest.mark.slow
def test_end_to_end_pretraining_and_logs(pipeline):
    res = pipeline
    result = json.loads((res / "budget/pretrain/result.json").read_text())
    assert result["stop_reason"] == "budget" and result["steps"] == 10
    assert result["loss_last"] < result["loss_first"]
    assert result["world_size"] == 2 and result["method_settings"]["parallel"] == "ddp"
    assert result["setting"] == {"gpu": "cpu", "nodes": 1, "gpus_per_node": 2, "world_size": 2, "source": "config",
                                 "plan": None, "micro_batch": 8, "grad_accum_steps": 2, "global_batch": 32,
                                 "method": "fl", "grad_sync": None}  # fmt: skip
    assert result["sparse_prediction"] and result["model_class"].endswith("WithSparsePrediction")
    assert "submitted local job" in (res / "logs/budget/pretrain.log").read_text()
    assert "submitted local job" in (res / "logs/budget/finetune_rte.log").read_text()
    assert json.loads((res / "budget/data/index.json").read_text())["samples"]["train"] > 0
    for name in ("prepare_data", "pretrain", "finetune_mnli", "finetune_rte", "finetune_stsb", "finetune_mrpc",
                 "glue_table"):  # fmt: skip
        assert (res / f"logs/budget/{name}.log").stat().st_size > 0, name
    assert (res / "budget/glue/mnli/model/config.json").is_file()
