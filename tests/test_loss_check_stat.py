"""The loss check's statistic and run plan (planning/losscheck.py), on made-up curves: no torch, no training."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from pretrain_planner.planning import losscheck as lc
from pretrain_planner.planning.catalog import load_catalog

from .conftest import REPO

CATALOG = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
CONF = lc.settings()
REF = [6.0 - 0.05 * s for s in range(20)]
NOISE = [[r + 1e-3 * ((-1) ** s) * (s + 1) / 20 for s, r in enumerate(REF)]]  # a variant: drifting by <= 1e-3


def run(loss, grad=None):
    return {"loss": list(loss), "grad_norm": list(grad) if grad is not None else [None] * len(loss)}


def test_band_is_a_running_envelope_with_a_floor():
    width = lc.band(REF, NOISE)
    assert all(b >= a for a, b in zip(width, width[1:], strict=False) if a > lc.FLOOR_REL * 6.0)
    assert width[-1] == pytest.approx(1e-3)
    assert lc.band(REF, [REF])[0] == pytest.approx(lc.FLOOR_REL * REF[0])  # bitwise equal: the floor, never 0


def test_inside_the_band_is_same():
    v = lc.judge(run([r + 4e-4 for r in REF]), run(REF), [run(NOISE[0])], CONF.k, CONF.tail)
    assert v.verdict == lc.SAME and v.text == "same" and v.left_at is None


def test_a_curve_that_leaves_is_differs_at_the_step_it_left():
    curve = [r if s < 12 else r * 0.97 for s, r in enumerate(REF)]
    v = lc.judge(run(curve), run(REF), [run(NOISE[0])], CONF.k, CONF.tail)
    assert v.verdict == lc.DIFFERS and v.left_at == 12
    assert v.text == f"differs {v.tail_rel * 100:+.1f}% at step 12" and v.tail_rel == pytest.approx(-0.03)


def test_a_slow_drift_fails_on_the_tail_mean_without_a_jump():
    # never beyond k x band at any step, but every tail step outside the band: differs, from where it left for good
    width = lc.band(REF, NOISE)
    curve = [r + (2.0 * w if s >= 15 else 0.0) for s, (r, w) in enumerate(zip(REF, width, strict=True))]
    v = lc.judge(run(curve), run(REF), [run(NOISE[0])], CONF.k, CONF.tail)
    assert v.verdict == lc.DIFFERS and v.left_at == 15 and v.worst_ratio <= CONF.k


def test_the_gradient_norm_decides_when_the_loss_agrees():
    grads = [1.0] * 20
    v = lc.judge(run(REF, [4.0] * 20), run(REF, grads), [run(NOISE[0], [1.0001] * 20)], CONF.k, CONF.tail)
    assert v.verdict == lc.DIFFERS and v.quantity == "grad_norm" and v.text.startswith("differs grad_norm +300.0%")


def test_a_nan_loss_differs():
    curve = [*REF[:5], math.nan, *REF[6:]]
    assert lc.judge(run(curve), run(REF), [run(NOISE[0])], 3, 0.2).left_at == 5


def test_best_may_take_same_and_not_checked_only():
    assert lc.allowed("same") and lc.allowed(None) and lc.allowed(lc.NOT_CHECKED)
    assert not lc.allowed("differs +3.1% at step 4") and lc.allowed("differs +3.1% at step 4", allow_differs=True)


# --- the run plan -----------------------------------------------------------------------------------------------
def rows(**methods):
    return {m: {"method": m, "status": st, "step_time_s": t, "micro_batch": 4, "suspect": False}
            for m, (st, t) in methods.items()}  # fmt: skip


def plan(rows_, mode="chosen", model="tiny-bert", gpu="cpu", world=2, **conf):
    c = replace(CONF, mode=mode, **conf)
    cuda = gpu != "cpu"
    return lc.plan_runs(rows_, c, CATALOG.model(model).to_dict(), CATALOG.gpu(gpu).to_dict(), world, 1, cuda)


def test_chosen_checks_the_pick_against_naive_and_its_variants():
    runs, why, size = plan(rows(naive=("ok", 2.0), fl=("ok", 1.0), **{"fl+ac": ("ok", 1.5)}))
    assert why is None and size == 16
    names = {r["name"]: r for r in runs}
    assert set(names) == {"naive", "naive~mb2", "naive~dropout1", "fl"}
    assert names["naive"]["role"] == "reference" and names["fl"]["against"] == "naive"
    assert names["naive~dropout1"]["only_if_dropout"] and names["naive~mb2"]["micro_batch"] == 2


def test_all_checks_every_method_that_ran_and_off_none():
    r = rows(naive=("ok", 2.0), fl=("ok", 1.0), **{"fl+ac": ("noisy", 1.5), "naive+zero3": ("oom", None)})
    runs, _, _ = plan(r, "all")
    assert [x["name"] for x in runs if x["role"] == "method"] == ["fl", "fl+ac"]
    assert plan(r, "off")[:2] == ([], "benchmark.loss_check.mode is off")


def test_nothing_to_check_says_why():
    assert plan(rows(naive=("ok", 1.0), fl=("ok", 2.0)))[1] == "the pick is naive itself: nothing to check"
    assert "naive did not train" in plan(rows(naive=("oom", None), fl=("ok", 2.0)))[1]
    odd = plan(rows(naive=("ok", 1.0), fl=("ok", 0.5)), global_batch=15)[1]
    assert odd == "the check's global batch 15 is not divisible by 2 GPUs"


def test_a_precision_change_gets_its_own_naive():
    # free-lunch turns TF32 on where the GPU has it: compared with naive + TF32, which is compared with naive
    runs, _, _ = plan(rows(naive=("ok", 2.0), fl=("ok", 1.0)), model="pythia-160m", gpu="h100", world=8)
    names = {r["name"]: r for r in runs}
    assert names["fl"]["against"] == "naive~tf32" and names["naive~tf32"]["role"] == "precision"
    assert names["naive~tf32"]["overrides"] == {"tf32": True} and "naive~tf32~mb2" in names


def test_judge_records_uses_other_world_sizes_as_band_and_names_precision_lines():
    def rec(world, runs_):
        return {"setting": {"model": "m", "gpu": "cpu", "nodes": 1, "gpus_per_node": world},
                "check": {"steps": 20, "global_batch": 16, "seed": 0}, "runs": runs_}  # fmt: skip

    naive1 = {"name": "naive", "role": "reference", **run(REF)}
    naive2 = {"name": "naive", "role": "reference", **run(NOISE[0])}
    fl = {"name": "fl", "role": "method", "against": "naive", **run([r + 8e-4 for r in REF])}
    out = lc.judge_records([rec(1, [naive1, fl]), rec(2, [naive2])], 3, 0.2)
    assert [(r["method"], r["loss"], r["band_runs"]) for r in out] == [("fl", "same", 1)]
    alone = lc.judge_records([rec(1, [naive1, fl])], 3, 0.2)  # no variant: the floor only, 8e-4 is beyond it
    assert alone[0]["loss"].startswith("differs")


# --- what `best`, the tables and the export do with a verdict -------------------------------------------------------
def test_best_passes_over_a_faster_method_that_differs(tmp_path, capsys):
    """The fastest cell (fl+zero1) trains another model (its curve leaves naive's band): time_to_train, feasibility
    and `best` take fl, name fl+zero1 as passed over; --allow-differs takes it, saying so."""
    import json

    from pretrain_planner import cli, layout
    from pretrain_planner.tables import aggregate

    from .conftest import COSTS, P, cell_result, write_set

    cells = [cell_result(P, "a100", 1, 4, m, "ok", d) for m, d in (("naive", 25.0), ("fl", 20.0), ("fl+zero1", 17.5))]
    plan, paths = write_set(tmp_path, cells)
    runs = [{"name": "naive", "role": "reference", **run(REF)},
            {"name": "naive~mb2", "role": "variant", "of": "naive", **run(NOISE[0])},
            {"name": "fl", "role": "method", "against": "naive", **run([r + 2e-4 for r in REF])},
            {"name": "fl+zero1", "role": "method", "against": "naive",
             **run([r if s < 6 else r * 0.95 for s, r in enumerate(REF)])}]  # fmt: skip
    curves = tmp_path / layout.LOSS_CHECK / P / "a100/1x4" / layout.LOSS_CURVES
    curves.parent.mkdir(parents=True)
    curves.write_text(json.dumps({"setting": {"model": P, "gpu": "a100", "nodes": 1, "gpus_per_node": 4},
                                  "check": {"steps": 20, "global_batch": 1024, "seed": 0}, "runs": runs}))  # fmt: skip
    tables = aggregate.build_tables(plan, paths, aggregate.table_files(str(tmp_path / "tables")), str(tmp_path / "log"),
                                    CATALOG, COSTS, loss_checks=[str(curves)], loss_check=CONF)  # fmt: skip
    ttt = tables["time_to_train"].row(0, named=True)
    assert (ttt["best_method"], ttt["loss"]) == ("fl", "same")
    assert ttt["passed_over"] == "fl+zero1 (differs -5.0% at step 6)"
    assert tables["feasibility"].row(0, named=True)["loss"] == "same"
    verdicts = dict(tables["cells"].select("method", "loss").iter_rows())
    assert verdicts == {"naive": "reference", "fl": "same", "fl+zero1": "differs -5.0% at step 6"}
    assert cli.main(["best", "--model", P, "--gpu", "a100", "--count", "4", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "best method fl," in out and "passed over, faster but training another model: fl+zero1" in out
    assert cli.main(["best", "--model", P, "--gpu", "a100", "--count", "4", "--results", str(tmp_path),
                     "--allow-differs"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "best method fl+zero1," in out and "picked anyway (--allow-differs)" in out


def test_a_run_is_kept_for_a_later_check_only_while_nothing_it_depends_on_changed(tmp_path, monkeypatch):
    """A setting's check job runs again whenever one of its cells changes; each run it made before is kept by its key
    (its definition and the check's identity, steps, batch, seed, initial weights): a changed definition or check is
    another key, a run a test broke is never kept, nor one a test asks to break now."""
    import json

    run = {"name": "naive", "method": "naive", "micro_batch": 4, "dropout_seed": 0, "overrides": {},
           "role": "reference"}  # fmt: skip
    check = {"identity": "abc", "steps": 10, "global_batch": 16, "seed": 0, "init": "/x/init-seed0.pt"}
    key = lc.run_key(run, check)
    assert key == lc.run_key(dict(run), dict(check))
    assert all(lc.run_key(run, {**check, k: v}) != key for k, v in
               (("identity", "def"), ("steps", 20), ("global_batch", 32), ("seed", 1), ("init", "/y.pt")))  # fmt: skip
    assert lc.run_key({**run, "micro_batch": 2}, check) != key
    path = tmp_path / f"{key}.json"
    assert lc.kept_run(path, run) is None  # nothing kept yet
    done = {**run, "loss": [6.2, 6.1], "grad_norm": [1.0, 0.9]}
    path.write_text(json.dumps(done))
    assert lc.kept_run(path, run) == done
    assert lc.kept_run(path, {**run, "micro_batch": 2}) is None  # another run's record
    monkeypatch.setenv(lc.FAULT_ENV, "naive=lr_x2")
    assert lc.kept_run(path, run) is None  # a test breaks it now: it runs
    monkeypatch.delenv(lc.FAULT_ENV)
    assert not lc.keepable({**done, "test_fault": "lr_x2"}) and not lc.keepable({**run, "loss": [6.2, None]})
    assert lc.keepable({**run, "skipped": "no dropout"})
