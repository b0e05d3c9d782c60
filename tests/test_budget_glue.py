"""Budget stage: GLUE readers and metrics, and the whole stage end to end through Snakemake on CPU."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess

import numpy as np
import pytest
import yaml
from pretrain_planner.budget import glue

from .conftest import BIN, REPO


def test_metrics_against_known_values():
    y = np.array([1, 1, 0, 0, 1, 0])
    p = np.array([1, 0, 0, 1, 1, 0])
    assert glue.accuracy(y, p) == pytest.approx(4 / 6)
    assert glue.f1_binary(y, p) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert glue.matthews(y, p) == pytest.approx((2 * 2 - 1 * 1) / math.sqrt(3 * 3 * 3 * 3))
    assert glue.matthews(y, np.ones_like(y)) == 0.0  # constant prediction
    assert glue.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert glue.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # ties get averaged ranks (as scipy.stats.spearmanr): ranks [1.5, 1.5, 3] vs [1, 2, 3]
    assert glue.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(np.corrcoef([1.5, 1.5, 3], [1, 2, 3])[0, 1])


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
    (work / "Snakefile").write_text(
        f'configfile: "main.yaml"\n\n\ninclude: "{REPO}/workflow/rules/common.smk"\n'
        f'include: "{REPO}/workflow/rules/pretrain.smk"\n'
    )
    main = {"catalog": {"models": str(REPO / "config/models.yaml"), "gpus": str(REPO / "config/gpus.yaml")},
            "sweep": {"models": ["tiny-bert"], "gpus": ["cpu"]}, "launcher": {"kind": "local"}}  # fmt: skip
    (work / "main.yaml").write_text(yaml.safe_dump(main))
    cfg = yaml.safe_load((REPO / "config/budget.yaml").read_text())
    cfg["corpus"]["files"] = [str(REPO / "tests/data/corpus/*.txt")]
    cfg["glue"].update(data_dir=str(REPO / "tests/data/glue"), epochs=1)
    # two data-parallel ranks (gloo processes of the local launcher): global batch 32 = 8 x 2 x 2
    cfg["train"].update(budget_hours=10 / 3600, fake_step_s=1.0, checkpoint_every_s=5, gpus_per_node=2, micro_batch=8)
    cfg["train"]["validation"].update(every=0.5, dense_first=0.0, dense_last=0.0)
    (work / "config").mkdir()
    (work / "config/budget.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [str(BIN / "snakemake"), "-s", str(work / "Snakefile"), "-d", str(work), "--cores", "2",
           "--force-use-threads", "budget"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return work / "results"


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
    assert "| mnli | pretrained |" in md and "Average score" in md


@pytest.mark.slow
def test_end_to_end_pretraining_and_logs(pipeline):
    res = pipeline
    result = json.loads((res / "budget/pretrain/result.json").read_text())
    assert result["stop_reason"] == "budget" and result["steps"] == 10
    assert result["loss_last"] < result["loss_first"]
    assert result["world_size"] == 2 and result["method_settings"]["parallel"] == "ddp"
    assert result["setting"] == {"gpu": "cpu", "nodes": 1, "gpus_per_node": 2, "world_size": 2, "source": "config",
                                 "plan": None, "micro_batch": 8, "grad_accum_steps": 2, "global_batch": 32,
                                 "method": "fl"}  # fmt: skip
    assert result["sparse_prediction"] and result["model_class"].endswith("WithSparsePrediction")
    assert "submitted local job" in (res / "logs/budget/pretrain.log").read_text()
    assert "submitted local job" in (res / "logs/budget/finetune_rte.log").read_text()
    assert json.loads((res / "budget/data/index.json").read_text())["samples"]["train"] > 0
    for name in ("prepare_data", "pretrain", "finetune_mnli", "finetune_rte", "finetune_stsb", "finetune_mrpc",
                 "glue_table"):  # fmt: skip
        assert (res / f"logs/budget/{name}.log").stat().st_size > 0, name
    assert (res / "budget/glue/mnli/model/config.json").is_file()
