"""Snakemake's own HTML report (`snakemake --report report.html`) after a real one-cell sweep shows every
table and plot with its caption, built offline from the assets Snakemake ships; and the captions in
workflow/report/ are the paragraphs results/report.md has (one text, two documents)."""

from __future__ import annotations

import json
import re

import pytest
from docutils.core import publish_parts
from pretrain_planner.report import document
from pretrain_planner.report.calendar_plot import CALENDAR_PLOTS
from pretrain_planner.report.loss_plot import LOSS_PLOTS
from pretrain_planner.report.plots import PLOTS
from pretrain_planner.report.study_plots import STUDY_PLOTS
from pretrain_planner.tables.aggregate import TABLE_NAMES
from pretrain_planner.tables.study import STUDY_TABLES

from .conftest import plain_text as _plain
from .conftest import snakemake, write_config

CAPTIONED = [*TABLE_NAMES, *(stem for stem, _ in PLOTS.values()), *STUDY_TABLES, "whatif",
             *(stem for stem, _ in STUDY_PLOTS.values()), "study_views", "study_reading", "calendar",
             "calendar_timeline", *(stem for stem, _ in LOSS_PLOTS.values())]  # fmt: skip


@pytest.mark.parametrize("stem", [*CAPTIONED, "workflow"])
def test_every_caption_is_plain_paragraphs(stem):
    """Each caption renders as reStructuredText to paragraphs only (no stray list, heading, quote or warning)
    and has nothing Jinja would take as a template (Snakemake renders captions with Jinja first)."""
    text = document.caption_file(stem).read_text()
    assert "{{" not in text and "{%" not in text and "{#" not in text
    parts = publish_parts(text, writer="html", settings_overrides={"report_level": 1, "halt_level": 5})
    body = parts["body"]
    assert body.count("<p>") == len(document.paragraphs(stem)) >= 1, body
    assert not re.search(r"<(?!/?(p|strong|em|span|tt|code)\b)[a-z]", body), body  # nothing but inline markup
    assert "system-message" not in body


def test_outputs_marked_for_the_report_are_captioned():
    tables = {f"{n}_{e}": f"t/{n}.{e}" for n in TABLE_NAMES for e in ("csv", "md")} | {"cells_parquet": "x"}
    plots = {f"{k}_{e}": f"p/{s}.{e}" for k, (s, _) in PLOTS.items() for e in ("png", "svg")}
    captioned = {k: document.caption_of(k) for k in {**tables, **plots}}
    assert {k for k, c in captioned.items() if c} == {f"{n}_csv" for n in TABLE_NAMES} | {f"{k}_png" for k in PLOTS}
    for caption in filter(None, captioned.values()):
        assert caption.endswith(".rst") and document.CAPTIONS.joinpath(caption).is_file()


def _embedded(page: str, name: str) -> dict:
    """A JSON object the report's page assigns to a JavaScript variable (`var results = {...}`)."""
    found = re.search(rf"^\s*var {name} = (\{{.*\}});?\s*$", page, re.M)
    assert found, f"no `var {name}` in the report"
    return json.loads(found.group(1))


def _embedded_text(page: str, name: str) -> str:
    found = re.search(rf"var {name} = (\".*?(?<!\\)\");", page, re.S)
    assert found, f"no `var {name}` in the report"
    return json.loads(found.group(1))


@pytest.mark.slow
def test_html_report_after_a_sweep(tmp_path):
    cfg = write_config(
        tmp_path / "sweep.yaml",
        sweep={"models": ["tiny-gptneox"], "gpus": ["cpu"], "nodes": [1], "gpus_per_node": [1], "methods": ["naive"]},
        launcher={"kind": "debug"},
        benchmark={"warmup_steps": 1, "timed_steps": 2, "max_micro_batch": 4, "max_spread": 50},
    )
    run = snakemake(tmp_path, "--cores", "2", "--configfile", str(cfg), timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    made = snakemake(tmp_path, "--cores", "1", "--configfile", str(cfg), "--report", "report.html", timeout=300)
    log = made.stdout + made.stderr
    assert made.returncode == 0, log[-4000:]
    assert "downloading" not in log.lower()  # the report's JavaScript and styles ship with Snakemake: offline
    page = (tmp_path / "report.html").read_text()
    results, categories = _embedded(page, "results"), _embedded(page, "categories")
    tables = {f"results/tables/{n}.csv": n for n in [*TABLE_NAMES, "calendar"]}
    plots = {f"results/plots/{stem}.png": stem for stem, _ in {**PLOTS, **CALENDAR_PLOTS, **LOSS_PLOTS}.values()}
    study = {f"results/tables/study/{n}.csv": n for n in STUDY_TABLES} | {"results/tables/whatif.csv": "whatif"}
    study |= {f"results/plots/study/{stem}.png": stem for stem, _ in STUDY_PLOTS.values()}
    assert set(results) == set(tables) | set(plots) | set(study)
    assert sorted(categories) == ["Plots", "Study views", "Tables"]
    assert {p for sub in categories["Plots"].values() for p in sub} == set(plots)
    assert {p for sub in categories["Study views"].values() for p in sub} == set(study)
    md = (tmp_path / "results/report.md").read_text()
    for path, stem in {**tables, **plots, **study}.items():
        entry = results[path]
        assert entry["mime_type"] == ("text/csv" if path.endswith(".csv") else "image/png"), path
        assert entry["data_uri"].startswith(f"data:{entry['mime_type']}"), path  # the file itself is embedded
        # the caption is the file's paragraphs, the same that report.md prints
        assert _plain(entry["caption"]) == _plain(" ".join(document.paragraphs(stem))), path
        first = document.paragraphs(stem)[0]
        assert first in md or stem == "problems", (stem, first)  # report.md has no problems paragraph without any
    assert _plain(" ".join(document.paragraphs("workflow"))) in _plain(_embedded_text(page, "workflow_desc"))
    assert document.paragraphs("workflow")[0] in md
