"""Tables from synthetic results (written with results.write_result, no training): the fastest method,
feasibility, costs, the Pareto front, the analytic estimate, unusable files, plots and the report."""

from __future__ import annotations

import csv
import json
import time

import polars as pl
import pytest
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.flops import train_flops_per_sample
from pretrain_planner.planning.pipeline import PLAN_COLUMNS
from pretrain_planner.report import document
from pretrain_planner.report import plots as pp_plots
from pretrain_planner.results import write_result
from pretrain_planner.tables import aggregate

from .conftest import REPO

CATALOG = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
COSTS = {"amortisation_years": 5, "pareto_cost": "hardware"}


def cell_result(model, gpu, nodes, gpn, method, status="ok", days=None, mb=4, suspect=False, **extra):
    """A plausible result.json for a cell; `days` sets the step time through the recipe's steps."""
    m = CATALOG.models[model]
    world = nodes * gpn
    r = {"status": status, "model": model, "gpu": gpu, "nodes": nodes, "gpus_per_node": gpn, "world_size": world,
         "method": method, "precision": m.recipe.precision, "global_batch": m.recipe.global_batch,
         "wall_time_s": 360.0, "versions": {"torch": "synthetic"}}  # fmt: skip
    if status == "ok":
        steps = m.recipe.steps
        step = days * 86400 / steps if days is not None else 0.5
        per_sample = train_flops_per_sample(m.to_dict())
        flops = per_sample * m.recipe.global_batch
        peak = CATALOG.gpus[gpu].peak_for(m.recipe.precision, tf32=method.startswith("fl"))
        r.update(
            micro_batch_size=mb, grad_accum_steps=m.recipe.global_batch // world // mb, step_time_s=step,
            step_time_p10_s=0.95 * step, step_time_p90_s=1.1 * step, timed_steps=5, warmup_steps=2,
            samples_per_s=m.recipe.global_batch / step, tokens_per_s=m.recipe.global_batch * 2048 / step,
            flops_per_step=flops, peak_tflops=peak, mfu=flops / (step * world * peak * 1e12) if peak else None,
            suspect=suspect, peak_mem_gib=40.0, recipe_steps=steps,
            training_days=steps * step / 86400 if steps else None,
            steps_in_budget=m.recipe.time_budget_hours * 3600 / step if m.recipe.time_budget_hours else None,
            method_settings={"base": method.split("+")[0]}, micro_batch_trials=[{"micro_batch": mb, "fits": True}],
        )  # fmt: skip
    else:
        r["reason"] = "micro-batch 1 does not fit on every rank" if status == "oom" else "not here"
    r.update(extra)
    return r


def write_set(root, results: list[dict], invalid: list[tuple] = ()) -> tuple[str, list[str]]:
    """plan.csv (the results' cells, valid, plus `invalid` (model, gpu, nodes, gpn, method, reason)) and the
    result files; returns (plan path, result paths)."""
    rows, paths = [], []
    for r in results:
        path = f"cells/{r['model']}/{r['gpu']}/{r['nodes']}x{r['gpus_per_node']}/{r['method']}"
        rows.append({"model": r["model"], "gpu": r["gpu"], "nodes": r["nodes"], "gpus_per_node": r["gpus_per_node"],
                     "world_size": r["nodes"] * r["gpus_per_node"], "method": r["method"], "valid": True, "reason": "",
                     "per_rank_batch": 1.0, "partition": "gpu", "time_limit_min": 60,
                     "gpu_hours_max": float(r["nodes"] * r["gpus_per_node"]), "path": path})  # fmt: skip
        write_result(root / path / "result.json", r)
        paths.append(str(root / path / "result.json"))
    for model, gpu, nodes, gpn, method, reason in invalid:
        rows.append({"model": model, "gpu": gpu, "nodes": nodes, "gpus_per_node": gpn, "world_size": nodes * gpn,
                     "method": method, "valid": False, "reason": reason, "per_rank_batch": 1.0, "partition": "gpu",
                     "time_limit_min": 60, "gpu_hours_max": 0.0,
                     "path": f"cells/{model}/{gpu}/{nodes}x{gpn}/{method}"})  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "plan.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=PLAN_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return str(root / "plan.csv"), paths


P = "pythia-1b"
# (gpu, nodes, gpn, method, status, days): the hand-made Pythia-1B sweep. Hardware prices per setting:
# a100 x1 $20,000, x2 $39,500, x4 $83,500; h100 x1 $31,000, x4 $127,500; rtx3090 x1 $2,300, x2 $4,100;
# a6000 x4 $26,700, x8 $48,900; 2 nodes x 4 a100 $167,000; h200 has no price.
GPU_SET = [
    ("a100", 1, 1, "naive", "oom", None),
    ("a100", 1, 1, "fl", "ok", 60.0),
    ("a100", 1, 2, "naive", "ok", 40.0),
    ("a100", 1, 2, "fl", "ok", 30.0),
    ("a100", 1, 4, "naive", "ok", 25.0),
    ("a100", 1, 4, "fl", "ok", 20.0),
    ("a100", 1, 4, "fl+zero1", "ok", 17.57),
    ("h100", 1, 4, "fl", "ok", 8.0),
    ("h100", 1, 1, "fl", "ok", 70.0),  # dominated by a100 x1 (60 d, $20,000)
    ("rtx3090", 1, 1, "naive", "oom", None),
    ("rtx3090", 1, 1, "fl", "oom", None),
    ("rtx3090", 1, 1, "fl+ac", "ok", 200.0),
    ("rtx3090", 1, 2, "fl", "ok", 108.0),
    ("rtx3090", 1, 4, "naive", "oom", None),
    ("rtx3090", 1, 4, "fl", "oom", None),
    ("a6000", 1, 4, "fl", "ok", 40.0),
    ("a6000", 1, 8, "fl", "ok", 35.0),  # dominated by a100 x2 (30 d, $39,500)
    ("a6000", 1, 8, "fl+fsdp-full", "ok", 36.0),
    ("h200", 1, 8, "fl", "ok", 5.0),  # no price: blank cost
    ("a100", 2, 4, "fl+fsdp-full", "ok", 9.0),  # dominated by h100 x4 (8 d, $127,500)
    ("h100", 1, 2, "fl+ac", "ok", 1.0),  # suspect: never the best
    ("h100", 1, 2, "fl", "ok", 25.0),
]
FRONT = {("rtx3090", 1, 1), ("rtx3090", 1, 2), ("a100", 1, 1), ("a6000", 1, 4), ("a100", 1, 2), ("a100", 1, 4),
         ("h100", 1, 4), ("h100", 1, 2)}  # fmt: skip
DOMINATED = {("h100", 1, 1), ("a6000", 1, 8), ("a100", 2, 4)}


def gpu_set_results() -> list[dict]:
    out = [cell_result(P, g, n, k, m, s, d, suspect=(g, k, m) == ("h100", 2, "fl+ac")) for g, n, k, m, s, d in GPU_SET]
    out.append(cell_result("bert-24h", "a100", 1, 1, "fl", "ok", None))
    out.append(cell_result("tiny-gptneox", "cpu", 1, 1, "naive", "ok", 0.01))
    out.append(cell_result("tiny-gptneox", "cpu", 1, 1, "fl", "ok", 0.008))
    return out


INVALID = [(P, "v100", 1, 1, "naive", "bf16 (recipe precision of pythia-1b) is not supported by v100")]


@pytest.fixture(scope="module")
def gpu_tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("agg") / "results"
    plan, paths = write_set(root, gpu_set_results(), INVALID)
    out = aggregate.table_files(str(root / "tables"))
    tables = aggregate.build_tables(plan, paths, out, str(root / "logs/aggregate.log"), CATALOG, COSTS)
    return root, out, tables


def _row(df: pl.DataFrame, gpu: str, nodes: int, gpn: int, model: str = P) -> dict:
    sel = df.filter(
        (pl.col("model") == model) & (pl.col("gpu") == gpu) & (pl.col("nodes") == nodes)
        & (pl.col("gpus_per_node") == gpn)
    )  # fmt: skip
    assert sel.height == 1, (gpu, nodes, gpn, sel)
    return sel.row(0, named=True)


def test_every_table_file_is_written(gpu_tables):
    root, out, _ = gpu_tables
    assert set(out) == {"cells_parquet"} | {f"{n}_{e}" for n in aggregate.TABLE_NAMES for e in ("csv", "md")}
    for path in out.values():
        assert (root / "tables").joinpath(path.rsplit("/", 1)[1]).stat().st_size > 0, path
    for name in aggregate.TABLE_NAMES:
        md = (root / "tables" / f"{name}.md").read_text()
        assert md.startswith("# ") and "null" not in md
    log = (root / "logs/aggregate.log").read_text()
    assert "0 unusable result files" in log


def test_time_to_train_picks_the_fastest_method(gpu_tables):
    ttt = gpu_tables[2]["time_to_train"]
    r = _row(ttt, "a100", 1, 4)
    assert r["best_method"] == "fl+zero1"
    assert r["training_days"] == pytest.approx(17.57)
    assert r["days_naive"] == pytest.approx(25.0) and r["days_fl"] == pytest.approx(20.0)
    assert r["speedup_vs_naive"] == pytest.approx(25 / 17.57)
    assert (r["methods_ok"], r["methods_oom"], r["methods_unsupported"], r["methods_suspect"]) == (3, 0, 0, 0)
    r = _row(ttt, "h100", 1, 2)  # the suspect 1-day timing is excluded
    assert r["best_method"] == "fl" and r["methods_suspect"] == 1
    assert _row(ttt, "rtx3090", 1, 1)["best_method"] == "fl+ac"
    assert ttt.filter((pl.col("gpu") == "rtx3090") & (pl.col("gpus_per_node") == 4)).is_empty()  # nothing fits


def test_analytic_estimate_beside_each_measurement(gpu_tables):
    ttt = gpu_tables[2]["time_to_train"]
    r = _row(ttt, "a100", 1, 4)
    flops = train_flops_per_sample(CATALOG.models[P].to_dict()) * 1024
    step = flops / (4 * 312e12)  # pythia-1b trains in bf16: the A100's dense bf16 peak
    assert r["analytic_step_time_s"] == pytest.approx(step)
    assert r["analytic_days"] == pytest.approx(143_000 * step / 86400)
    assert r["measured_over_analytic"] == pytest.approx(r["step_time_s"] / step)
    assert r["measured_over_analytic"] == pytest.approx(1 / r["mfu"])
    cpu = _row(ttt, "cpu", 1, 1, "tiny-gptneox")
    assert cpu["analytic_step_time_s"] is None and cpu["mfu"] is None  # the cpu type declares no peak
    cells = gpu_tables[2]["cells"]
    oom = cells.filter((pl.col("gpu") == "a100") & (pl.col("gpus_per_node") == 1) & (pl.col("method") == "naive"))
    assert oom["analytic_days"][0] is not None and oom["measured_over_analytic"][0] is None


def test_feasibility(gpu_tables):
    feas = gpu_tables[2]["feasibility"]
    r = _row(feas, "a100", 1, 1)
    assert (r["naive"], r["fl"], r["fits_naive"], r["fits_fl"], r["fits_any"]) == ("oom", "fits", False, True, True)
    assert r["verdict"] == "free-lunch"
    r = _row(feas, "a100", 1, 4)
    assert r["verdict"] == "naive" and r["fitting_methods"] == "fl, fl+zero1, naive"
    r = _row(feas, "rtx3090", 1, 1)
    assert r["verdict"] == "other method" and r["best_method"] == "fl+ac"
    r = _row(feas, "rtx3090", 1, 4)
    assert r["verdict"] == "out of memory" and not r["fits_any"] and r["best_method"] is None
    r = _row(feas, "h100", 1, 4)
    assert r["naive"] == "not swept" and r["verdict"] == "free-lunch"
    r = _row(feas, "v100", 1, 1)
    assert r["verdict"] == "invalid" and r["naive"] == "invalid" and r["methods_valid"] == 0


def test_costs_table(gpu_tables):
    costs = gpu_tables[2]["costs"]
    r = _row(costs, "a100", 1, 4)
    assert r["hardware_usd"] == 83_500 and round(r["amortised_usd"]) == 804
    assert r["amortisation_years"] == 5 and r["cloud_usd"] is None
    assert "no cloud_usd_per_gpu_hour for a100" in r["cost_note"]
    assert _row(costs, "h100", 1, 4)["hardware_usd"] == 127_500
    assert _row(costs, "rtx3090", 1, 2)["hardware_usd"] == 4_100
    assert _row(costs, "a100", 2, 4)["hardware_usd"] == 167_000
    h200 = _row(costs, "h200", 1, 8)
    assert h200["hardware_usd"] is None and h200["amortised_usd"] is None and not h200["pareto"]
    assert "no price_usd for h200 in" in h200["cost_note"]
    bert = _row(costs, "a100", 1, 1, "bert-24h")  # time-budgeted: no days, hardware still known
    assert bert["training_days"] is None and bert["hardware_usd"] == 20_000 and "no training days" in bert["cost_note"]


def test_pareto_front_on_a_hand_made_set(gpu_tables):
    tables = gpu_tables[2]
    pareto = tables["pareto"].filter(pl.col("model") == P)
    on_front = {tuple(r) for r in pareto.select("gpu", "nodes", "gpus_per_node").rows()}
    assert on_front == FRONT
    assert not on_front & DOMINATED
    assert pareto["training_days"].is_sorted()
    assert set(pareto["cost_kind"].to_list()) == {"hardware"}
    flagged = tables["costs"].filter(pl.col("pareto") & (pl.col("model") == P))
    assert {tuple(r) for r in flagged.select("gpu", "nodes", "gpus_per_node").rows()} == FRONT
    amortised = aggregate.pareto_table(
        aggregate.costs_table(tables["time_to_train"], CATALOG, {"pareto_cost": "amortised"}),
        {"pareto_cost": "amortised"},
    )
    assert set(amortised["cost_kind"].to_list()) == {"amortised"}


def test_corrupt_and_partial_results_are_named_and_skipped(tmp_path):
    good = [cell_result(P, "a100", 1, 1, "fl", "ok", 60.0), cell_result(P, "a100", 1, 2, "fl", "ok", 30.0),
            cell_result(P, "a100", 1, 2, "naive", "oom")]  # fmt: skip
    bad_cells = {
        "empty": ("a100", 1, 4, "fl"),
        "truncated": ("a100", 1, 4, "naive"),
        "list": ("h100", 1, 1, "fl"),
        "wrong type": ("h100", 1, 2, "fl"),
        "partial": ("h100", 1, 4, "fl"),
        "elsewhere": ("h100", 1, 8, "fl"),
        "bad status": ("a6000", 1, 1, "fl"),
        "vanished": ("a6000", 1, 2, "fl"),
    }
    placeholders = [cell_result(P, g, n, k, m, "ok", 10.0) for g, n, k, m in bad_cells.values()]
    plan, paths = write_set(tmp_path, good + placeholders)

    def path_of(key):
        g, n, k, m = bad_cells[key]
        return tmp_path / f"cells/{P}/{g}/{n}x{k}/{m}/result.json"

    path_of("empty").write_text("")
    text = path_of("truncated").read_text()
    path_of("truncated").write_text(text[: len(text) // 2])
    path_of("list").write_text("[1, 2]")
    data = json.loads(path_of("wrong type").read_text())
    path_of("wrong type").write_text(json.dumps({**data, "step_time_s": "fast"}))
    path_of("partial").write_text(json.dumps({k: v for k, v in data.items() if k != "step_time_s"} | {"gpu": "h100",
                                  "gpus_per_node": 4}))  # fmt: skip
    path_of("elsewhere").write_text(json.dumps({**data, "gpus_per_node": 2}))  # a result copied to another cell
    path_of("bad status").write_text(json.dumps({**data, "status": "done", "gpu": "a6000", "gpus_per_node": 1}))
    path_of("vanished").unlink()

    out = aggregate.table_files(str(tmp_path / "tables"))
    tables = aggregate.build_tables(plan, paths, out, str(tmp_path / "aggregate.log"), CATALOG, COSTS)
    problems = tables["problems"]
    assert problems.height == len(bad_cells)
    why = dict(problems.select("path", "problem").rows())
    assert "empty" in why[str(path_of("empty"))]
    assert "not valid JSON" in why[str(path_of("truncated"))]
    assert "not a JSON object" in why[str(path_of("list"))]
    assert "step_time_s" in why[str(path_of("wrong type"))] and "expected float" in why[str(path_of("wrong type"))]
    assert "no step_time_s" in why[str(path_of("partial"))]
    assert "gpus_per_node is 2" in why[str(path_of("elsewhere"))]
    assert "status 'done'" in why[str(path_of("bad status"))]
    assert "missing" in why[str(path_of("vanished"))]
    cells = tables["cells"]
    corrupt = cells.filter(pl.col("status") == "corrupt")
    assert corrupt.height == len(bad_cells)
    assert all(r.startswith("result.json skipped: ") for r in corrupt["reason"].to_list())
    # the valid ones are all there
    ok = cells.filter(pl.col("status").is_in(["ok", "oom"]))
    assert ok.height == len(good)
    assert tables["time_to_train"].height == 2
    log = (tmp_path / "aggregate.log").read_text()
    for key in bad_cells:
        assert f"SKIPPED {path_of(key)}" in log
    assert "problems" in (tmp_path / "tables/problems.md").read_text().lower()
    feas = tables["feasibility"]
    assert _row(feas, "a6000", 1, 1)["verdict"] == "not measured"


def test_tables_from_results_alone(tmp_path):
    """No plan.csv (the CLI's fallback): every result's cell is the plan."""
    _, paths = write_set(tmp_path, gpu_set_results()[:8])
    results, problems = aggregate.read_results(paths)
    tables = aggregate.build_all(aggregate.plan_from_results(results), paths, CATALOG, COSTS)
    assert problems.is_empty() and tables["cells"].height == 8
    assert _row(tables["time_to_train"], "a100", 1, 4)["best_method"] == "fl+zero1"
    assert aggregate.build_all(aggregate.plan_from_results(results), paths)["costs"]["hardware_usd"].null_count() == 4


def test_read_table_keeps_types_of_empty_columns(gpu_tables):
    _, out, tables = gpu_tables
    back = aggregate.read_table(out["time_to_train_csv"])
    assert back.schema == tables["time_to_train"].schema
    costs = aggregate.read_table(out["costs_csv"])
    assert costs.schema["cloud_usd"] == pl.Float64 and costs["cloud_usd"].null_count() == costs.height
    assert costs.schema["pareto"] == pl.Boolean


def test_markdown_formatting():
    """Padded columns, units by column name, yes/no, blanks for nulls, escaped pipes."""
    df = pl.DataFrame({"a": [1.0, None, 83_500.0, 0.000123456], "b": ["x|y", None, "z", "w"], "c": [True, False,
                      None, True], "training_days": [3.24, 0.71, None, 4.4e-8]})  # fmt: skip
    md = aggregate.to_markdown(df)
    lines = md.splitlines()
    assert lines[0] == "| a        | b    | c   | training_days |" and lines[1].startswith("|----------|------|")
    assert lines[2] == "| 1        | x\\|y | yes | 3.2 d         |"
    assert lines[3] == "|          |      | no  | 17 h          |"
    assert lines[4] == "| 83,500   | z    |     |               |"
    assert lines[5] == "| 0.000123 | w    | yes | 3.8 ms        |"
    assert "(2 of 4 rows shown" in aggregate.to_markdown(df, max_rows=2)


def test_plots_and_report(gpu_tables):
    root, out, _ = gpu_tables
    plots = pp_plots.plot_files(str(root / "plots"))
    t0 = time.perf_counter()
    pp_plots.make_plots(out, plots, str(root / "logs/plots.log"), COSTS)
    assert time.perf_counter() - t0 < 30
    for key, path in plots.items():
        with open(path, "rb") as fh:
            data = fh.read(64)
        assert data.startswith(b"\x89PNG") if key.endswith("png") else b"<?xml" in data or b"<svg" in data, key
    document.write_report(out, plots, None, str(root / "report.md"), str(root / "logs/report.log"), COSTS)
    md = (root / "report.md").read_text()
    for section in ("## Time to train", "## Feasibility", "## Costs and the Pareto front", "## Measured vs analytic",
                    "## MFU and step time by method", "## Problems"):  # fmt: skip
        assert section in md, section
    assert "](plots/cost_vs_days.png)" in md and "](tables/time_to_train.csv)" in md
    assert "**pythia-1b**: fastest measured setting 1x8 h200" in md
    assert "cheapest on the Pareto front 1x1 rtx3090" in md


def test_empty_mfu_plot_is_labelled(tmp_path):
    plan, paths = write_set(tmp_path, [cell_result("tiny-gptneox", "cpu", 1, 1, "fl", "ok", 0.01)])
    tables = aggregate.build_all(plan, paths, CATALOG, COSTS)
    plots = pp_plots.plot_files(str(tmp_path / "plots"))
    pp_plots.plot_mfu(tables["cells"], plots)
    pp_plots.plot_cost_days(tables["costs"], plots, "hardware", 5)
    for key in ("mfu_png", "mfu_svg", "cost_days_png", "cost_days_svg"):
        assert (tmp_path / "plots" / plots[key].rsplit("/", 1)[1]).stat().st_size > 0
    assert "no MFU known" in (tmp_path / "plots/mfu_by_method.svg").read_text()
    assert "no setting with a known hardware cost" in (tmp_path / "plots/cost_vs_days.svg").read_text()


def test_a_noisy_timing_fits_but_is_never_the_answer(tmp_path):
    """status `noisy` (spread above benchmark.max_spread twice): the setting fits with it, but the fastest
    method that counts is the quiet one; the count of noisy methods is shown."""
    quiet = cell_result(P, "a100", 1, 1, "fl", days=30.0)
    noisy = {**cell_result(P, "a100", 1, 1, "fl+ac", days=20.0), "status": "noisy", "spread": 2.4,
             "reason": "p90/p10 2.40 above benchmark.max_spread 1.5, twice"}  # fmt: skip
    only_noisy = {**cell_result(P, "a100", 1, 2, "fl", days=10.0), "status": "noisy", "reason": "spread"}
    plan, paths = write_set(tmp_path, [quiet, noisy, only_noisy])
    tables = aggregate.build_all(plan, paths, CATALOG, COSTS)
    ttt, feas = tables["time_to_train"], tables["feasibility"]
    r = _row(ttt, "a100", 1, 1)
    assert r["best_method"] == "fl" and r["training_days"] == pytest.approx(30.0) and r["methods_noisy"] == 1
    assert ttt.filter(pl.col("gpus_per_node") == 2).is_empty()  # a noisy timing alone gives no days
    two = feas.filter(pl.col("gpus_per_node") == 2).row(0, named=True)
    assert two["fits_any"] and two["fl"] == "fits"
    cells = tables["cells"]
    assert cells.filter(pl.col("method") == "fl+ac")["status"].to_list() == ["noisy"]
    assert tables["problems"].height == 0
