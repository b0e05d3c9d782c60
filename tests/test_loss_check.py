"""The loss-equivalence check with real training (issue 39): every method of the real trainer on a tiny model is
`same` as naive, and three faults injected here only (trainer/losscheck.FAULT_ENV) are `differs`, at the step
where their curve leaves naive's band.

Three check jobs through the local launcher (submitit processes, gloo), as the `loss_check` rule runs them: tiny-bert
fp32 on 2 ranks (DDP, activation checkpointing, free-lunch, FSDP2 grad / full / + CPU offload, ZeRO-1/2/3 and
ZeRO-3-Offload, the fused linear + cross-entropy head; and two faults: gradient accumulation without dividing the
loss, free-lunch's learning rate doubled), tiny-bert on 1 rank (naive only: its curve is the 2-rank naive's
world-size variant, another reduction order), and tiny-gptneox in bf16 on 1 rank (free-lunch, and bf16 weights
updated without fp32 master copies)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pretrain_planner.launch import losscheck as driver
from pretrain_planner.planning import losscheck as lc
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.configtypes import BenchmarkSection, LauncherSection
from pretrain_planner.planning.losscheck import FAULT_ENV
from pretrain_planner.tables import aggregate

from .conftest import HAVE_DS, REPO

pytestmark = pytest.mark.slow

CATALOG = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
CONF = lc.settings()
FP32_STEPS, BF16_STEPS = 12, 20  # the bf16 fault leaves the band at step ~8 (measured: +0.2% at step 8)
ZERO = ["naive+zero1", "naive+zero2", "naive+zero3", "naive+zero3+off"] if HAVE_DS else []
METHODS = ["fl", "fl+ac", "naive+fsdp-grad", "naive+fsdp-full", "naive+fsdp-full+off", *ZERO, "fl+flce"]
FAULTS = {"naive!unscaled_accum": ("naive", "unscaled_accum"), "fl!lr_x2": ("fl", "lr_x2"),
          "naive!bf16_no_master": ("naive", "bf16_no_master")}  # fmt: skip


def _job(work, model: dict, world: int, runs: list[dict], steps: int) -> str:
    c = {"model": model["name"], "gpu": "cpu", "nodes": 1, "gpus_per_node": world, "method": "naive"}
    spec = {"cell": c, "name": f"{model['name']}-{world}", "model": model, "gpu": CATALOG.gpu("cpu").to_dict(),
            "benchmark": BenchmarkSection.given().to_json(),
            "launcher": LauncherSection.given({"kind": "local", "timeout_min": 15}).job_options()}  # fmt: skip
    folder = work / "loss_check" / model["name"] / "cpu" / f"1x{world}"
    check = {"steps": steps, "global_batch": model["recipe"]["global_batch"], "seed": 0,
             "init": str(work / "loss_check" / model["name"] / "init-seed0.pt")}  # fmt: skip
    curves = str(folder / "curves.json")
    driver.launch_check(spec, runs, check, curves, str(folder / "check.log"))
    return curves


def _naive(mb: int, dropout: bool = True) -> list[dict]:
    runs = [{"name": "naive", "method": "naive", "micro_batch": mb, "role": "reference"},
            {"name": f"naive~mb{mb // 2}", "method": "naive", "micro_batch": mb // 2, "role": "variant",
             "of": "naive"}]  # fmt: skip
    if dropout:
        runs.append({"name": "naive~dropout1", "method": "naive", "micro_batch": mb, "dropout_seed": 1,
                     "role": "variant", "of": "naive", "only_if_dropout": True})  # fmt: skip
    return runs


def _method(name: str, method: str | None = None) -> dict:
    return {"name": name, "method": method or name, "micro_batch": 4, "role": "method", "against": "naive"}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    work = tmp_path_factory.mktemp("loss_check")
    bert = CATALOG.model("tiny-bert").to_dict()
    gpt = CATALOG.model("tiny-gptneox").to_dict()
    gpt_bf16 = {**gpt, "name": "tiny-gptneox-bf16", "recipe": {**gpt["recipe"], "precision": "bf16"}}
    faults = ";".join(f"{name}={fault}" for name, (_, fault) in FAULTS.items())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(FAULT_ENV, faults)  # inherited by the job's rank processes
        files = [
            _job(
                work,
                bert,
                2,
                [
                    *_naive(4),
                    *[_method(m) for m in METHODS],
                    _method("naive!unscaled_accum", "naive"),
                    _method("fl!lr_x2", "fl"),
                ],
                FP32_STEPS,
            ),  # fmt: skip
            _job(work, bert, 1, _naive(4)[:1], FP32_STEPS),
            _job(
                work,
                gpt_bf16,
                1,
                [*_naive(4, dropout=False), _method("fl"), _method("naive!bf16_no_master", "naive")],
                BF16_STEPS,
            ),  # fmt: skip
        ]
    table, hours = aggregate.loss_check_table(files, CONF)
    return {"files": files, "table": table, "rows": table.to_dicts(), "hours": hours}


def _row(checked, model: str, world: int, method: str) -> dict:
    hits = [r for r in checked["rows"] if r["model"] == model and r["world_size"] == world and r["method"] == method]
    assert len(hits) == 1, (model, world, method, checked["rows"])
    return hits[0]


@pytest.mark.parametrize("method", METHODS)
def test_every_real_method_is_same(checked, method):
    r = _row(checked, "tiny-bert", 2, method)
    assert r["loss"] == "same", r
    # naive's band at 2 ranks is its micro-batch split, its dropout seed and the 1-rank naive (another reduction)
    assert r["band_runs"] == 3


def test_a_correct_bf16_method_is_same_against_bf16_naive(checked):
    assert _row(checked, "tiny-gptneox-bf16", 1, "fl")["loss"] == "same"


@pytest.mark.parametrize(("name", "left_by"), [("naive!unscaled_accum", 0), ("fl!lr_x2", FP32_STEPS - 1),
                                               ("naive!bf16_no_master", BF16_STEPS - 1)])  # fmt: skip
def test_each_injected_fault_differs_where_it_leaves_the_band(checked, name, left_by):
    model, world = ("tiny-gptneox-bf16", 1) if "bf16" in name else ("tiny-bert", 2)
    r = _row(checked, model, world, name)
    assert r["loss"].startswith("differs") and r["test_fault"] == FAULTS[name][1], r
    assert r["left_at"] <= left_by and f"at step {r['left_at']}" in r["loss"]
    # the step it left is the first beyond k x the band, or the start of the tail's run outside it: before it, the
    # curve was inside k x the band (recomputed from the curves file)
    rec = json.loads(Path(next(f for f in checked["files"] if model in f and f"1x{world}" in f)).read_text())
    runs = {x["name"]: x for x in rec["runs"]}
    ref, bad = runs["naive"]["loss"], runs[name]["loss"]
    variants = [x["loss"] for x in rec["runs"] if x.get("of") == "naive" and not x.get("skipped")]
    width = lc.band(ref, variants)
    assert all(abs(b - a) <= CONF.k * w for a, b, w in zip(ref[: r["left_at"]], bad, width, strict=False))
    assert abs(bad[r["left_at"]] - ref[r["left_at"]]) > width[r["left_at"]]  # and at it, outside the band


def test_the_unscaled_accumulation_shows_in_loss_and_gradient(checked):
    rec = json.loads(Path(checked["files"][0]).read_text())
    runs = {x["name"]: x for x in rec["runs"]}
    accum = runs["naive"]["grad_accum_steps"]
    assert accum == 2
    assert runs["naive!unscaled_accum"]["grad_norm"][0] == pytest.approx(accum * runs["naive"]["grad_norm"][0])


def test_every_run_started_from_the_one_saved_init_and_the_same_batches(checked):
    for f in checked["files"]:
        rec = json.loads(Path(f).read_text())
        first = {x["name"]: x["loss"][0] for x in rec["runs"] if x["loss"]}
        ref = first["naive"]
        for name, loss in first.items():
            if name != "naive!unscaled_accum":  # its recorded loss is accum x the mean: the fault itself
                assert loss == pytest.approx(ref, rel=5e-3), (f, name)  # bf16 runs round in the forward
    assert len({json.loads(Path(f).read_text())["check"]["init"] for f in checked["files"][:2]}) == 1


def test_the_table_has_a_line_per_checked_run(checked):
    assert checked["table"].height == len(METHODS) + 2 + 2
