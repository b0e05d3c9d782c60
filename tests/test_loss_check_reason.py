"""Why a method is `not checked` (issue 56): a sweep without naive has no reference, so it plans no check job, and
`best`, loss_check.md and report.md say that reason instead of guessing "mode off, or only the pick is checked".
No torch, no training, no Snakemake: the planning object, the tables and the CLI in-process."""

from __future__ import annotations

import copy
from dataclasses import replace

import yaml
from pretrain_planner import cli
from pretrain_planner.facade.pipeline import load
from pretrain_planner.planning import losscheck as lc
from pretrain_planner.report import document
from pretrain_planner.tables import aggregate

from .conftest import CATALOG, COSTS, REPO, P, cell_result, write_set

DEMO = yaml.safe_load((REPO / "config/config.yaml").read_text())


def demo(methods: list[str]) -> dict:
    config = copy.deepcopy(DEMO)
    config["sweep"]["methods"] = methods
    return config


def test_no_check_is_planned_without_naive_and_the_plan_says_why():
    """The demo with naive plans one check per setting; without naive, none, and the dry run says why."""
    with_naive = load(demo(["naive", "fl", "fl+ac"]), REPO)
    assert len(with_naive.loss_check_folders()) == len(with_naive.setting_methods()) > 0
    without = load(demo(["fl", "fl+ac"]), REPO)
    assert without.loss_check_folders() == [] and without.loss_check_files() == []
    (line,) = without.loss_check_lines()
    assert lc.NO_REFERENCE in line and "off" not in line


def test_why_unchecked_names_the_real_reason():
    conf = lc.settings()
    assert lc.why_unchecked("fl", None, conf, ["fl", "fl+ac"]) == lc.NO_REFERENCE
    off = replace(conf, mode="off")
    assert lc.why_unchecked("fl", None, off, ["naive", "fl"]) == "benchmark.loss_check.mode is off"
    note = "naive did not train at this setting (oom): no reference"
    assert lc.why_unchecked("fl", {"runs": [], "note": note}, conf, ["naive", "fl"]) == note


def test_tables_report_and_best_say_naive_was_not_swept(tmp_path, capsys):
    """A sweep of fl and fl+ac only: loss_check.md is not header-only, report.md and `best` name the reason."""
    cells = [cell_result(P, "a100", 1, 4, m, "ok", d) for m, d in (("fl", 20.0), ("fl+ac", 22.0))]
    plan, paths = write_set(tmp_path, cells)
    files = aggregate.table_files(str(tmp_path / "tables"))
    tables = aggregate.build_tables(plan, paths, files, str(tmp_path / "log"), CATALOG, COSTS, loss_checks=[],
                                    loss_check=lc.settings())  # fmt: skip
    (line,) = tables["loss_check"].iter_rows(named=True)
    assert (line["role"], line["loss"], line["note"]) == (aggregate.UNCHECKED, lc.NOT_CHECKED, lc.NO_REFERENCE)
    assert lc.NO_REFERENCE in (tmp_path / "tables/loss_check.md").read_text()
    said = "".join(document._loss_check(document.Links(files, {}, tmp_path)))
    assert lc.NO_REFERENCE in said and "every pick is naive" not in said
    assert cli.main(["best", "--model", P, "--gpu", "a100", "--count", "4", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"loss check: not checked ({lc.NO_REFERENCE})" in out and "only each setting's pick" not in out
