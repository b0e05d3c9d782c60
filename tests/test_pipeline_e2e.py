"""End to end on CPU: the default sweep's grid and prices (config/config.yaml) through the real Snakemake CLI, the
local submitit launcher, 1- and 2-rank gloo cells; then what a newcomer reads of it: every plot shows data, and
Snakemake's HTML report opened in headless Chromium shows every figure and caption without a console error. The sweep
runs in the folder tests/test_search_e2e.py's adaptive runs left (tests/conftest.py `default_sweep`): their probes are
its naive and fl cells, measured once for both modules."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from .conftest import BIN, DEMO, DEMO_BENCH, REPO, TIMED, snakemake
from .readme_text import readme_command

pytestmark = pytest.mark.slow

MODELS = DEMO["sweep"]["models"]  # tiny-gptneox, tiny-bert
RANKS = DEMO["sweep"]["gpus_per_node"]  # 1, 2
METHODS = DEMO["sweep"]["methods"]  # naive, fl, fl+ac


@pytest.fixture(scope="module")
def sweep(default_sweep):
    """The default sweep (its grid, its loss check and its costs section, the cpu stand-in's nominal price), with
    fewer timed steps and a wide spread limit (the wiring is the subject, not the timings): (folder, config, run)."""
    # the README's first command, `.venv/bin/snakemake --profile cluster/local`, on this config
    assert readme_command("bash envs/setup.sh && .venv/bin/snakemake --profile cluster/local")
    assert DEMO_BENCH["timed_steps"] == TIMED and DEMO_BENCH["loss_check"] == DEMO["benchmark"]["loss_check"]
    return default_sweep


def _cell_dirs(work):
    return [work / "results/cells" / m / "cpu" / f"1x{r}" / meth for m in MODELS for r in RANKS for meth in METHODS]


def test_every_output_exists(sweep):
    work, _, _ = sweep
    for rel in [
        "plan.csv",
        "tables/cells.parquet",
        "tables/cells.csv",
        "tables/time_to_train.csv",
        "tables/time_to_train.md",
        "plots/days_to_train.png",
        "plots/step_time_by_method.png",
    ]:
        assert (work / "results" / rel).stat().st_size > 0, rel
    for d in _cell_dirs(work):
        for name in ("result.json", "steps.jsonl", "cell.log"):
            assert (d / name).is_file(), d / name


def test_ok_cells_are_measured(sweep):
    work, _, _ = sweep
    for d in _cell_dirs(work):
        result = json.loads((d / "result.json").read_text())
        assert result["status"] == "ok", result
        assert result["step_time_s"] > 0
        assert result["step_time_p10_s"] <= result["step_time_s"] <= result["step_time_p90_s"]
        assert result["timed_steps"] == TIMED
        lines = (d / "steps.jsonl").read_text().splitlines()
        assert len(lines) == TIMED
        assert all(json.loads(ln)["time_s"] > 0 for ln in lines)
        world = result["world_size"]
        # per-rank batch 16 / world, micro-batch capped at 4: accumulation makes up the rest
        assert result["micro_batch"] == 4
        assert result["grad_accum_steps"] == 16 // world // 4
        settings = result["method_settings"]
        assert settings["parallel"] == ("ddp" if world == 2 else "single")
        free_lunch = result["method"].startswith("fl")
        assert settings["attn_implementation"] == ("sdpa" if free_lunch else "eager")
        assert settings["compile"] == free_lunch
        assert result["training_days"] == pytest.approx(1000 * result["step_time_s"] / 86400)
        assert result["versions"]["torch"]


def test_table_picks_the_fastest_method(sweep):
    work, _, _ = sweep
    cells = pl.read_parquet(work / "results/tables/cells.parquet")
    ttt = pl.read_csv(work / "results/tables/time_to_train.csv")
    assert ttt.height == len(MODELS) * len(RANKS)
    for row in ttt.iter_rows(named=True):
        group = cells.filter(
            (pl.col("model") == row["model"])
            & (pl.col("gpus_per_node") == row["gpus_per_node"])
            & (pl.col("status") == "ok")
        )
        fastest = group.sort("step_time_s").row(0, named=True)
        # a method inside the fastest's noise (median at most its p90 step) is a tie: the one with fewest parts wins
        tied = group.filter(pl.col("step_time_s") <= fastest["step_time_p90_s"]).rows(named=True)
        pick = min(tied, key=lambda r: (r["method"].count("+"), r["step_time_s"], r["method"]))
        assert row["best_method"] == pick["method"]
        assert row["step_time_s"] == pytest.approx(pick["step_time_s"])
        assert (row["tie"] is None) == (pick["method"] == fastest["method"])
        naive = group.filter(pl.col("method") == "naive").row(0, named=True)
        assert row["speedup_vs_naive"] == pytest.approx(naive["training_days"] / row["training_days"])
    plan = pl.read_csv(work / "results/plan.csv")
    assert plan.height == len(MODELS) * len(RANKS) * len(METHODS)


def test_every_method_of_the_default_sweep_has_its_loss_verdict(sweep):
    """Issue 39: the demo checks every method against naive (benchmark.loss_check.mode all): each real method of the
    default sweep is `same`, at every setting, in cells.csv, loss_check.md, time_to_train.md and feasibility.md; the
    check's cost is in benchmark_cost.csv; the exported plan carries the verdict and the curves file."""
    work, _, _ = sweep
    assert DEMO["benchmark"]["loss_check"]["mode"] == "all"
    cells = pl.read_csv(work / "results/tables/cells.csv")
    verdicts = {(r["model"], r["gpus_per_node"], r["method"]): r["loss"] for r in cells.iter_rows(named=True)}
    for model in MODELS:
        for ranks in RANKS:
            assert verdicts[(model, ranks, "naive")] == "reference"
            for method in METHODS[1:]:
                assert verdicts[(model, ranks, method)] == "same", (model, ranks, method, verdicts)
    checks = pl.read_csv(work / "results/tables/loss_check.csv")
    assert checks.height == len(MODELS) * len(RANKS) * (len(METHODS) - 1)
    assert (checks["band_runs"] >= 2).all()  # the micro-batch split and the other world size at least
    for table in ("time_to_train", "feasibility"):
        md = (work / f"results/tables/{table}.md").read_text()
        assert "| loss" in md and ("| same" in md or "| reference" in md), md
    cost = pl.read_csv(work / "results/tables/benchmark_cost.csv")
    assert (cost["loss_check_gpu_hours"] > 0).all()
    ttt = pl.read_csv(work / "results/tables/time_to_train.csv")
    r = ttt.row(0, named=True)
    plan = json.loads((work / "results/optimal" / r["model"] / "cpu" / f"1x{r['gpus_per_node']}" / "plan.json")
                      .read_text())  # fmt: skip
    assert plan["loss_check"]["verdict"] == r["loss"] and Path(plan["loss_check"]["curves"]).is_file()
    assert "Does each method train the same model?" in (work / "results/report.md").read_text()


def test_every_plot_of_the_sweep_shows_data(sweep):
    """Issue 27: on the default sweep's real cells no plot is an empty frame (MFU against the host's measured peak,
    costs at the demo's nominal price, checkpointing for the memory-saving views, the what-if's predictions)."""
    from pretrain_planner.planning.configtypes import CostsSection
    from pretrain_planner.report import plots as pp_plots
    from pretrain_planner.report import study_plots
    from pretrain_planner.tables import aggregate, study, whatif

    from .demo_results import empty_panels

    work, _, _ = sweep
    res = work / "results"
    tables = {**aggregate.table_files(str(res / "tables")), **study.table_files(str(res / "tables/study")),
              **whatif.table_files(str(res / "tables"))}  # fmt: skip
    figs = {**pp_plots.figures(tables, CostsSection.given(DEMO["costs"])), **study_plots.figures(tables)}
    empty = {key: panels for key, fig in figs.items() if (panels := empty_panels(fig))}
    assert not empty, f"empty frames: {empty}"
    cells = pl.read_parquet(res / "tables/cells.parquet")
    assert (cells["peak_kind"] == "measured").all() and cells["mfu"].is_not_null().all()


def test_the_html_report_in_a_browser(sweep, tmp_path):
    """Issue 27: `snakemake --report` opened in headless Chromium: every table and plot of the sweep is listed, every
    figure decodes and shows data (coloured marks: an empty frame has none), every entry shows its caption, and the
    page logs no error. Screenshots of each figure stay in this test's folder."""
    from pretrain_planner.report import document
    from pretrain_planner.report.calendar_plot import CALENDAR_PLOTS
    from pretrain_planner.report.loss_plot import LOSS_PLOTS
    from pretrain_planner.report.plots import PLOTS
    from pretrain_planner.report.study_plots import STUDY_PLOTS
    from pretrain_planner.tables.aggregate import TABLE_NAMES
    from pretrain_planner.tables.study import STUDY_TABLES

    from .browser import chromium, read_report
    from .conftest import plain_text as _plain

    if chromium() is None:
        pytest.skip("chromium is not installed: bash envs/setup.sh test installs it (envs/browser.sh)")
    work, cfg, _ = sweep
    made = snakemake(work, "--cores", "1", "--configfile", str(cfg), "--report", "report.html", timeout=300)
    assert made.returncode == 0, (made.stdout + made.stderr)[-4000:]
    shots = tmp_path / "screenshots"
    page = read_report(work / "report.html", shots)
    expected = {f"results/tables/{n}.csv": n for n in TABLE_NAMES} | {"results/tables/whatif.csv": "whatif"}
    expected |= {f"results/tables/study/{n}.csv": n for n in STUDY_TABLES}
    expected |= {f"results/plots/{stem}.png": stem for stem, _ in PLOTS.values()}
    expected |= {f"results/plots/study/{stem}.png": stem for stem, _ in STUDY_PLOTS.values()}
    expected |= {"results/tables/calendar.csv": "calendar"}
    expected |= {f"results/plots/{stem}.png": stem for stem, _ in CALENDAR_PLOTS.values()}
    expected |= {f"results/plots/{stem}.png": stem for stem, _ in LOSS_PLOTS.values()}
    listed = {p for paths in page["categories"].values() for p in paths}
    assert listed == set(expected), (sorted(set(expected) - listed), sorted(listed - set(expected)))
    for path, stem in expected.items():
        caption = page["captions"].get(path) or ""
        assert _plain(document.paragraphs(stem)[0]) in _plain(caption), (path, caption[:300])
        if path.endswith(".png"):
            fig = page["figures"][path]
            assert fig and fig.get("width", 0) > 0 and "broken" not in fig, (path, fig)
            assert fig["coloured"] >= 200, f"{path}: an empty frame ({fig})"
            assert (shots / path.replace("/", "_")).stat().st_size > 0
    assert page["errors"] == [], page["errors"]


def test_rerun_does_nothing(sweep):
    work, cfg, _ = sweep
    proc = snakemake(work, "--profile", str(REPO / "cluster/local"), "--cores", "2", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_cpu_cells_ran_one_at_a_time_each_rank_on_its_own_core(sweep):
    """On a CPU host a cell holds the whole host: no two cells' timed runs overlap, each rank pinned to a core."""
    work, _, _ = sweep
    results = [json.loads((d / "result.json").read_text()) for d in _cell_dirs(work)]
    spans = sorted(r["devices"]["interval"] for r in results)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
    for r in results:
        ranks = r["devices"]["ranks"]
        assert r["devices"]["placement"]["whole_host"] and len(ranks) == r["world_size"]
        assert all(len(x["cpus"]) == 1 and x["threads"] == 1 for x in ranks)
        assert len({x["cpus"][0] for x in ranks}) == r["world_size"]  # 2 cores here: one each


def test_damaged_or_missing_results_are_measured_again(sweep):
    """A garbage result.json, a missing steps.jsonl and a deleted result.json: the next run moves the damaged
    files aside, says so, measures those three cells again and touches no other cell."""
    work, cfg, _ = sweep
    dirs = _cell_dirs(work)
    garbage, no_steps, deleted = dirs[0], dirs[1], dirs[2]
    (garbage / "result.json").write_text('{"status": "ok", "step_ti')
    (no_steps / "steps.jsonl").unlink()
    (deleted / "result.json").unlink()
    untouched = {d: (d / "result.json").stat().st_mtime_ns for d in dirs[3:]}
    check = work / "results/loss_check/tiny-gptneox/cpu/1x1"
    curves = json.loads((check / "curves.json").read_text())
    dry = snakemake(work, "-n", "--profile", str(REPO / "cluster/local"), "--cores", "2", "--configfile", str(cfg))
    assert dry.returncode == 0 and "Nothing to be done" not in dry.stdout + dry.stderr
    assert f"damaged result in results/cells/{garbage.relative_to(work / 'results/cells')}" in dry.stderr
    assert (garbage / "result.json").read_text().startswith('{"status": "ok", "step_ti')  # a dry run moves nothing
    proc = snakemake(work, "--profile", str(REPO / "cluster/local"), "--cores", "2", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for d in (garbage, no_steps):
        (kept,) = (d / "damaged").iterdir()
        assert (kept / "WHY.txt").read_text().strip() and (kept / "result.json").is_file()
        assert "measuring it again" in proc.stderr
    assert (garbage / "damaged").is_dir() and "not valid JSON" in next((garbage / "damaged").iterdir()).joinpath(
        "WHY.txt"
    ).read_text()
    for d in (garbage, no_steps, deleted):
        result = json.loads((d / "result.json").read_text())
        assert result["status"] == "ok" and len((d / "steps.jsonl").read_text().splitlines()) == TIMED
    assert {d: (d / "result.json").stat().st_mtime_ns for d in dirs[3:]} == untouched
    problems = pl.read_csv(work / "results/tables/problems.csv")
    assert problems.height == 0
    # the setting's loss check ran again (its cells changed) and kept every run of the earlier check: the same runs
    # of the same check (the cells measured again chose the same micro-batches), no job
    assert "no job (every run is kept from an earlier check)" in (check / "check.log").read_text()
    again = json.loads((check / "curves.json").read_text())
    assert [(r["name"], r["loss"]) for r in again["runs"]] == [(r["name"], r["loss"]) for r in curves["runs"]]


def test_exported_plans_are_what_ran_and_launch_the_train_stage(sweep, tmp_path):
    """Issue 16: each setting's plan.json holds the settings its fastest cell recorded (one translation), and the
    exported launch.sh runs the shipped train stage on CPU (torchrun, 2 gloo ranks) end to end, with the same
    settings and its throughput beside the prediction."""
    import os
    import subprocess

    from .conftest import assert_recorded_is_exported

    work, _, _ = sweep
    for model in MODELS:
        for ranks in RANKS:
            plan = json.loads((work / f"results/optimal/{model}/cpu/1x{ranks}/plan.json").read_text())
            assert_recorded_is_exported(work, model, plan["method"], ranks)
    folder = work / "results/optimal/tiny-gptneox/cpu/1x2"
    # exactly as its header says, `bash launch.sh`, from a shell without the venv on PATH (a fresh login)
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHON", None)
    out = tmp_path / "train"
    proc = subprocess.run(["bash", str(folder / "launch.sh"), "--steps", "3", "--out", str(out)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["steps"] == 3 and result["world_size"] == 2
    assert result["settings_differences"] == [] and result["data"]["synthetic"] is True
    assert result["throughput"]["ratio"]["step_time_s"] > 0 and (out / "throughput.md").is_file()


def test_the_calendar_of_a_local_sweep_is_compute_and_measured_restarts(sweep):
    """Issue 38, local processes: calendar.md has every setting of time_to_train and its train-stage run (this
    sweep's train.steps x the measured step), each one segment with no queue, its restart the start-up its cell
    measured (never zero); `pretrain-planner when` on one of them says the same, and report.md shows the timeline."""
    import subprocess

    work, _, _ = sweep
    cal = pl.read_csv(work / "results/tables/calendar.csv")
    ttt = pl.read_csv(work / "results/tables/time_to_train.csv")
    assert cal.filter(pl.col("run") == "recipe").height == ttt.filter(pl.col("training_days").is_not_null()).height
    assert cal.filter(pl.col("run") == "train stage").height == ttt.height  # train.steps: 5
    for r in cal.to_dicts():
        assert r["segments"] == 1 and r["first_wait_h"] == 0 and r["wait_basis"].startswith("local processes"), r
        assert r["restart_s"] > 0 and r["restart_basis"].startswith("start-up measured"), r
        assert r["calendar_days"] == pytest.approx(r["compute_days"] + r["restart_loss_h"] / 24), r
    assert cal.group_by("model", "run").agg(pl.col("finishes_first").sum())["finishes_first"].to_list() == [1] * (
        cal.select("model", "run").unique().height)  # fmt: skip
    md = (work / "results/tables/calendar.md").read_text()
    assert "Queue: local processes: no queue" in md and "none (local)" in md
    report = (work / "results/report.md").read_text()
    assert "## When will it finish?" in report and "calendar_timeline.png" in report
    assert (work / "results/plots/calendar_timeline.png").stat().st_size > 10_000
    r = ttt.row(0, named=True)
    proc = subprocess.run([str(BIN / "pretrain-planner"), "when", "--model", r["model"], "--gpu", r["gpu"], "--count",
                           str(r["nodes"] * r["gpus_per_node"])], cwd=work, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "compute: " in proc.stdout and "measured" in proc.stdout and "local processes: no queue" in proc.stdout
    assert "segments: 1 (one job, no time limit)" in proc.stdout and "finish: " in proc.stdout
