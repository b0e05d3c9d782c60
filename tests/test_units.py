"""How numbers and Markdown tables are written for a person (tables/units.py, tables/markdown.py): one rounding for
the tables, report.md, the CLI and the plots; tables that fit a 120-column terminal."""

from __future__ import annotations

import polars as pl
import pytest
from pretrain_planner.tables import markdown, units


@pytest.mark.parametrize(("days", "text"), [
    (3.24, "3.2 d"), (17.57, "18 d"), (173.2, "173 d"), (1234.0, "1,234 d"), (0.71, "17 h"), (0.0051, "7.3 min"),
    (0.0006, "52 s"), (4.39e-8, "3.8 ms"), (0.0, "0 s"), (None, "-"), (float("nan"), "-"),
])  # fmt: skip
def test_days(days, text):
    assert units.days(days) == text


def test_other_units():
    assert (units.step(0.05123), units.step(1.234), units.step(12.5)) == ("51.2 ms", "1.23 s", "12.5 s")
    assert (units.percent(0.0312), units.percent(0.41), units.percent(0.00047)) == ("3.1%", "41%", "0.047%")
    assert (units.gib(0.483), units.gib(35.2), units.times(1.33), units.number(9.96)) == ("0.48 GiB", "35 GiB",
                                                                                          "1.3x", "10")  # fmt: skip
    assert units.duration_unit([0.001, 0.005, 0.01]) == (pytest.approx(60 / 86400), "minutes")
    assert units.duration_unit([3.0, 40.0]) == (1.0, "days") and units.duration_unit([]) == (1.0, "days")


def test_long_texts_become_notes_and_blank_columns_are_named():
    reason = "micro-batch 1 does not fit on every rank (out of memory on rank 0, 1: CUDA out of memory)"
    df = pl.DataFrame({"model": ["a", "b", "c"], "reason": [reason, None, reason], "cost_usd": [None, None, None],
                       "training_days": [1.5, 2.0, None]})  # fmt: skip
    md = markdown.to_markdown(df)
    lines = md.splitlines()
    assert lines[0] == "| model | reason | training_days |"  # cost_usd: blank in every row
    assert lines[2] == "| a     | [1]    | 1.5 d         |" and lines[4] == "| c     | [1]    |               |"
    assert f"- [1] {reason}" in md and "not shown: cost_usd" in md


def test_a_wide_table_is_cut_into_blocks_that_repeat_the_keys():
    df = pl.DataFrame({"model": ["pythia-1b"], "gpu": ["a100"], **{f"column_{i:02d}_days": [float(i + 1)]
                                                                    for i in range(12)}})  # fmt: skip
    md = markdown.to_markdown(df, keys=2)
    tables = [b for b in md.split("\n\n") if b.startswith("|")]
    assert len(tables) >= 2 and all(t.startswith("| model     | gpu  |") for t in tables)
    assert max(len(line) for line in md.splitlines()) <= markdown.WIDTH
    assert sum(t.count("_days") for t in tables) == 12  # every column once
