"""Tables from synthetic results (written with results.write_result, no training): the fastest method,
feasibility, costs, the Pareto front, the analytic estimate, unusable files, plots and the report."""

from __future__ import annotations

import json
import time

import polars as pl
import pytest
from pretrain_planner.planning.configtypes import CostsSection
from pretrain_planner.planning.flops import train_flops_per_sample
from pretrain_planner.report import document
from pretrain_planner.report import plots as pp_plots
from pretrain_planner.tables import aggregate, columns

from .conftest import CATALOG, COSTS, INVALID, P, cell_result, gpu_set_results, write_set

FRONT = {("rtx3090", 1, 1), ("rtx3090", 1, 2), ("a100", 1, 1), ("a6000", 1, 4), ("a100", 1, 2), ("a100", 1, 4),
         ("h100", 1, 4), ("h100", 1, 2)}  # fmt: skip
DOMINATED = {("h100", 1, 1), ("a6000", 1, 8), ("a100", 2, 4)}


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
    by_amortised = CostsSection.given({"pareto_cost": "amortised"})
    amortised = aggregate.pareto_table(aggregate.costs_table(tables["time_to_train"], CATALOG, by_amortised),
                                       by_amortised)  # fmt: skip
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


def test_a_benchmark_table_has_the_tables_layout():
    """markdown.plain (the benchmark scripts' reports, their values already written): the layout of every other
    table (padded, pipes escaped), every row and every long text kept in place, a right-aligned column on request."""
    from pretrain_planner.tables import markdown

    long = "ZeRO-1 + offload against ZeRO-2's estimate (the issue's count)"
    lines = markdown.plain(["stage", "wall (s)"], [["a|b", "0.25"], [long, "12.00"]], right={"wall (s)"})
    width = len(long)
    assert lines[0] == f"| {'stage'.ljust(width)} | wall (s) |"
    assert lines[1] == f"|{'-' * (width + 2)}|---------:|"
    escaped = "a\\|b"
    assert lines[2] == f"| {escaped.ljust(width)} | 0.25     |" and lines[3] == f"| {long} | 12.00    |"
    assert markdown.plain(["a", "b"], [["x", "y"]]) == markdown.table(["a", "b"], [["x", "y"]]).splitlines()
    with pytest.raises(ValueError, match="has not 2 values"):
        markdown.plain(["a", "b"], [["x"]])


def test_no_benchmark_script_writes_a_markdown_table_by_hand():
    """Every benchmark report's table goes through tables/markdown.py (`plain`, `table`): a table written by hand
    (its `|---|` rule line in the script) has a layout of its own (benchmarks/predict_crossgpu.py's did)."""
    from .conftest import REPO

    by_hand = [f"{p.name}:{n}" for p in sorted((REPO / "benchmarks").glob("*.py"))
               for n, line in enumerate(p.read_text().splitlines(), 1) if "|---" in line]  # fmt: skip
    assert not by_hand, by_hand


@pytest.mark.slow  # the plots timed against a wall-clock limit: load-sensitive
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


def test_every_table_reads_back_with_the_types_it_was_written_with(gpu_tables):
    """One statement of each column's type (tables/columns.py): cells.csv reads back as cells.parquet holds it
    (a result field has its RESULT_FIELDS type, e.g. skipped_steps an integer, not a float) and every column of every
    table has a declared type, not an inference."""
    _, out, _tables = gpu_tables
    parquet = pl.read_parquet(out["cells_parquet"])
    back = aggregate.read_table(out["cells_csv"])
    differ = {c: (back.schema[c], parquet.schema[c]) for c in back.columns if back.schema[c] != parquet.schema[c]}
    assert not differ, differ
    for name in aggregate.TABLE_NAMES:
        table = aggregate.read_table(out[f"{name}_csv"])
        assert dict(table.schema) == columns.schema(table.columns), name
