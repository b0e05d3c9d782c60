"""What the what-if says to a reader (issue 36): whatif.md leads with the question asked (the swept models and those
the config names, each setting ranked by days, in one table that fits a terminal), whatif.csv keeps every row and
column, the plot draws the swept models first, a prediction that leaves your cells out or falls back to the physics
bound says truly why, and report.md states the measured error of this run's fit while the captions type none.

The default sweep's results are built as the pipeline leaves them (tests/demo_results.py: cells on the `cpu`
stand-in, the what-if from the shipped public evidence); no Snakemake, no training."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from pretrain_planner.planning.configtypes import CostsSection, StudySection, SweepSection, WhatifSection
from pretrain_planner.planning.crossgpu import STAND_IN_RATIO, Kind
from pretrain_planner.planning.flops import param_count
from pretrain_planner.report import study_plots
from pretrain_planner.schema import ConfigError
from pretrain_planner.tables import whatif
from pretrain_planner.tables.predictor import Predictor, empty_cells
from pretrain_planner.tables.study import read_study_table

from .conftest import CATALOG, REPO
from .demo_results import build_demo_results, demo_config, md_cells, md_tables

WIDTH = 120


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, dict[str, str], dict]:
    root = tmp_path_factory.mktemp("whatif-demo") / "results"
    tables, _plots, config = build_demo_results(root)
    return root, tables, config


@pytest.fixture(scope="module")
def predictor(demo) -> Predictor:
    _root, tables, config = demo
    return Predictor(pl.read_parquet(tables["cells_parquet"]), CATALOG, config["benchmark"]["suspect_mfu"],
                     CostsSection.of(config["costs"]))  # fmt: skip


def _section(md: str, heading: str) -> str:
    """The text under a `### heading` up to the next heading."""
    start = md.index(heading)
    ends = [i for i in (md.find("\n##", start + len(heading)),) if i > 0]
    return md[start : ends[0] if ends else len(md)]


# ------------------------------------------------------------------------------------------------ whatif.md


def test_whatif_md_leads_with_the_swept_models_ranked_by_days(demo):
    """The first sections are the sweep's models, in the config's order, each in one table (never cut into blocks of
    columns, every line within 120 characters), its rows the CSV's of that model with days, ranked by them; then the
    other models; no numbered notes (the old file had 42, repeating the same reasons); hundreds of lines, not 2,015."""
    root, tables, config = demo
    md = (root / "tables/whatif.md").read_text()
    swept = config["sweep"]["models"]
    headings = re.findall(r"^### (\S+) \((.+)\)$", md, flags=re.M)
    assert [m for m, _why in headings[: len(swept)]] == swept and all(w == "swept" for _m, w in headings[: len(swept)])
    assert md.index("## Other catalog models the evidence reaches") > md.index(f"### {swept[-1]} ")
    assert len(md.splitlines()) < 400 and not re.search(r"^- \[\d+\] ", md, flags=re.M)
    assert all(len(line) <= WIDTH for line in md.splitlines()), max(md.splitlines(), key=len)
    csv = read_study_table(tables["whatif_csv"])
    for model in swept:
        (table,) = md_tables(_section(md, f"### {model} "))  # one table: not cut into blocks repeating the keys
        header, rows = md_cells(table[0]), [md_cells(line) for line in table[2:]]
        assert header[:3] == ["GPU", "GPUs", "days (band)"] or header[:4] == ["GPU", "GPUs", "method", "days (band)"]
        mine = csv.filter((pl.col("model") == model) & pl.col("days_optimistic").is_not_null())
        assert [(r[0], r[1]) for r in rows] == [(r["gpu"], f"{r['nodes']}x{r['gpus_per_node']}")
                                                for r in mine.iter_rows(named=True)]  # fmt: skip
        days = [r["days_central"] or r["days_optimistic"] for r in mine.iter_rows(named=True)
                if r["status"] == "bound only"]  # fmt: skip
        assert days == sorted(days) and len(days) == mine.height  # the demo's tiny models: bounds only, ranked


def test_whatif_md_says_each_reason_once_per_model(demo):
    """A swept model measured only on the `cpu` stand-in: why its cells are not used and why it is a bound only are
    said once under its heading, not in each of its rows; other models' fastest settings follow, one row each."""
    root, tables, config = demo
    md = (root / "tables/whatif.md").read_text()
    model = config["sweep"]["models"][0]
    section = " ".join(_section(md, f"### {model} ").split())
    assert section.count(f"Your cells of {model} on cpu are not used") == 1
    assert "no matmul rate and no memory bandwidth in config/gpus.yaml" in section
    assert section.count(f"within {STAND_IN_RATIO:g}x of its size (nearest: ") == 1
    others = _section(md, "## Other catalog models the evidence reaches")
    (table,) = md_tables(others)
    names = [md_cells(line)[0] for line in table[2:]]
    assert len(names) == len(set(names)) >= 5 and not set(names) & set(config["sweep"]["models"])
    assert "whatif.csv" in md.splitlines()[-1] or "whatif.csv" in " ".join(md.splitlines()[-3:])


def _counts(config: dict) -> list[tuple[int, int]]:
    return whatif.counts_of(SweepSection.of(config["sweep"]), StudySection.of(config["study"]))


def test_the_models_the_config_names_lead_beside_the_swept(tmp_path, demo):
    """`whatif.models` (config) adds catalog models to the lead: each setting of pythia-1b, ranked by its central
    days, right after the swept models; the CSV keeps the same rows and columns as without it."""
    _root, tables, config = demo
    out = whatif.table_files(str(tmp_path / "tables"))
    table = whatif.build_whatif(tables["cells_parquet"], out, str(tmp_path / "whatif.log"), CATALOG,
                                config["sweep"]["models"], _counts(config), config["benchmark"]["suspect_mfu"],
                                config["costs"], named=["pythia-1b"])  # fmt: skip
    md = Path(out["whatif_md"]).read_text()
    headings = re.findall(r"^### (\S+) \((.+)\)$", md, flags=re.M)
    assert headings[len(config["sweep"]["models"])] == ("pythia-1b", "named in whatif.models")
    (lines,) = md_tables(_section(md, "### pythia-1b "))
    assert md_cells(lines[0])[:4] == ["GPU", "GPUs", "method", "days (band)"] and len(lines) - 2 >= 30
    rows = table.filter((pl.col("model") == "pythia-1b") & (pl.col("status") == "predicted"))
    assert rows["days_central"].to_list() == sorted(rows["days_central"].to_list())
    assert "1x8" in md_cells(lines[2])[1]  # the fastest first: eight GPUs
    base = read_study_table(tables["whatif_csv"])
    assert table.columns == base.columns
    key = ["model", "gpu", "nodes", "gpus_per_node"]
    assert table.select(key).sort(key).equals(base.select(key).sort(key))


def test_whatif_models_are_checked_against_the_catalog():
    """The config's new `whatif` section: a schema default (no models) and an unknown name refused at parse time."""
    assert WhatifSection.of({"models": []}).named_in(CATALOG) == []
    assert WhatifSection.of({"models": ["pythia-1b"]}).named_in(CATALOG) == ["pythia-1b"]
    with pytest.raises(ConfigError, match="whatif.models"):
        WhatifSection.of({"models": ["pythia-1bb"]}).named_in(CATALOG)
    from pretrain_planner.facade.pipeline import load

    config = {**demo_config(), "whatif": {"models": ["pythia-1b"]}}
    pipe = load(config, REPO, "config/config.yaml")
    assert pipe.config["whatif"] == {"models": ["pythia-1b"]} and pipe.whatif == WhatifSection(("pythia-1b",))
    with pytest.raises(ConfigError, match=r"whatif.models: \['pythia-1bb'\] not in"):  # at parse time (the dry run)
        load({**demo_config(), "whatif": {"models": ["pythia-1bb"]}}, REPO, "config/config.yaml")


# ------------------------------------------------------------------------------------------------ whatif.csv


def test_whatif_csv_keeps_every_row_and_column_in_the_reading_order(demo, predictor):
    """Every (model, GPU type with a peak, count) of the table, every column, as complete as before; its rows in the
    order the .md and the plot read: the swept models' settings first, each model's ranked by days."""
    _root, tables, config = demo
    csv = read_study_table(tables["whatif_csv"])
    assert csv.columns == list(whatif.COLUMNS)
    models = [*config["sweep"]["models"], *whatif.evidence_models(predictor)]
    full = whatif.whatif_table(predictor, models, _counts(config))
    key = ["model", "gpu", "nodes", "gpus_per_node"]
    assert csv.height == full.height and csv.select(key).sort(key).equals(full.select(key).sort(key))
    swept = config["sweep"]["models"]
    lead = csv.head(sum(csv["model"].is_in(swept)))
    assert lead["model"].unique(maintain_order=True).to_list() == swept
    for model in swept:
        rows = lead.filter(pl.col("model") == model)
        days = [r["days_central"] or r["days_optimistic"] for r in rows.iter_rows(named=True)]
        assert days == sorted(days)


# ------------------------------------------------------------------------------------------------ the plot


def test_the_plot_draws_the_swept_models_first_ranked_by_days(demo):
    """It drew the first 150 of 559 bars by name (pythia-1.4b first), none of them the sweep's."""
    _root, tables, config = demo
    w = read_study_table(tables["whatif_csv"])
    fig = study_plots.figure_whatif(w)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    swept = config["sweep"]["models"]
    assert labels[0].startswith(swept[0] + " ") and any(x.startswith(swept[1] + " ") for x in labels)
    first = [x for x in labels if x.startswith(swept[0] + " ")]
    assert labels[: len(first)] == first  # the first swept model's bars lead, together
    widths = [p.get_width() for p in ax.patches[: len(first)]]
    assert widths == sorted(widths)  # ranked by days
    assert "swept" in ax.get_title() and "of" in ax.get_title()


# ------------------------------------------------------------------------------------------------ why


def test_a_prediction_says_why_your_cpu_cells_are_not_used(predictor):
    """The cross-GPU model cannot move a step from the `cpu` stand-in (no matmul rate or memory bandwidth in the
    catalog): `predict` and the what-if say so where such cells exist, and only there."""
    p = predictor.predict("tiny-gptneox", "h100", 1, 1)
    assert p.status == "bound only"
    assert ("your cells of tiny-gptneox on cpu are not used: cpu has no matmul rate and no memory bandwidth in "
            f"{CATALOG.gpus_path}, which the cross-GPU model moves a step by") in p.note  # fmt: skip
    assert "your cells" not in predictor.predict("pythia-1b", "h100", 1, 4).note


def test_a_bound_only_says_how_far_the_nearest_measured_model_is():
    """pythia-14m was 'no evidence of its kind' while pythia-31m of its family has some: its nearest measured model
    is beyond STAND_IN_RATIO in size, and the reason says which and how far, in `predict` and in `fit`."""
    fresh = Predictor(empty_cells(), CATALOG)
    p = fresh.predict("pythia-14m", "h100", 1, 1)
    ratio = param_count(CATALOG.model("pythia-160m").to_dict()) / param_count(CATALOG.model("pythia-14m").to_dict())
    assert ratio > STAND_IN_RATIO and p.status == "bound only"
    said = f"within {STAND_IN_RATIO:g}x of its size (nearest: pythia-160m, {ratio:.0f}x larger)"
    assert said in p.why and p.why.endswith("no pessimistic end")
    fit = whatif.fit_table(fresh, "h100", 1, 1, 1.0, ["pythia-14m", "mamba-2.8b"])
    why = dict(fit.select("model", "why").rows())
    assert said in why["pythia-14m"] and "no evidence of its kind" not in why["pythia-14m"]
    assert "nearest" not in why["mamba-2.8b"] and "its family (mamba)" in why["mamba-2.8b"]  # nothing of its kind


# ------------------------------------------------------------------------------------------------ the figures


def test_report_md_states_the_measured_error_of_this_runs_fit(demo, predictor):
    """report.md's what-if section states the fitted model's out-of-sample errors, from this run's fit (read back
    from whatif.md), not figures typed into a caption."""
    root, _tables, _config = demo
    cal = predictor.model.calibration
    unseen, seen = cal.of(Kind("same", False)), cal.of(Kind("same", True))
    report = " ".join((root / "report.md").read_text().split())
    section = report[report.index("## What-if") :]
    for e in (unseen, seen):
        assert f"{e.mean_abs:.1%} mean ({e.max_abs:.0%} worst, {e.n} runs)" in section
    assert whatif.read_error_sentence(root / "tables/whatif.md") in section


def test_the_what_if_captions_type_no_percentage():
    """The captions are read for every sweep: a figure typed there goes stale when the benchmark reruns (whatif.rst
    said 10.7% / 7.4% when the benchmark said 12.4% / 7.8%)."""
    captions = sorted((REPO / "workflow/report").glob("whatif*.rst"))
    assert [p.name for p in captions] == ["whatif.rst", "whatif_plot.rst"]
    for path in captions:
        typed = re.findall(r"\d+(?:\.\d+)?\s*(?:%|percent)", path.read_text())
        assert not typed, (path.name, typed)


def test_costs_are_summarised_once(demo):
    """'no price_usd for X' was a numbered note per GPU type; now one line names the GPU types without a price."""
    root, _tables, _config = demo
    md = (root / "tables/whatif.md").read_text()
    assert md.count("no price_usd") == 1 and not re.search(r"^- \[\d+\] ", md, flags=re.M)
