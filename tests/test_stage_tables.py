"""Issue 41: the budget and train stages' tables (glue, summary, sweep, throughput) go through the one formatting
rule (tables.markdown: padded columns, units by column name) and the csv module (a value holding a comma reads back
whole with csv.DictReader, not shifted into the next columns)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from pretrain_planner.budget import glue_report, summary, sweep
from pretrain_planner.tables import markdown
from pretrain_planner.train import record

from .test_study_output import _cells as _split  # a table line's cells
from .test_study_output import _tables as _blocks  # the Markdown tables of a text: runs of lines that start with '|'

COMMA = "early stop: validation loss 9.1, above 8"  # a text with a comma, as a stop reason or a note may hold


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert all(None not in r and None not in r.values() for r in rows), rows  # no field too many, none too few
    return rows


def _assert_tables_of_the_rule(md: str, n: int) -> None:
    """At least `n` table blocks, each as tables.markdown writes one: a header, a dashed line as wide, rows padded to
    the same width (a hand-written `| a | b |` line is as long as its values)."""
    blocks = _blocks(md)
    assert len(blocks) >= n, md
    for block in blocks:
        assert len({len(line) for line in block}) == 1, "\n".join(block)
        assert re.fullmatch(r"\|(-+\|)+", block[1]), block[1]


def _cells(md: str, key: str) -> dict[str, str]:
    """Column -> cell text of the row whose first cell is `key`, over every block of a cut table."""
    out: dict[str, str] = {}
    for block in _blocks(md):
        head = _split(block[0])
        for line in block[2:]:
            cells = _split(line)
            if cells[0] == key:
                out.update(zip(head, cells, strict=True))
    return out


def test_glue_table_quotes_a_comma_and_writes_markdown_by_the_rule(tmp_path):
    files = []
    for task, init, metrics in [("mnli", "pretrained", {"acc": 0.61, "acc_mm": 0.6}),
                                ("rte", "mnli, best seed of the best setting", {"acc": 0.55}),
                                ("mrpc", "mnli", {"acc": 0.7123, "f1": 0.81234})]:  # fmt: skip
        f = tmp_path / f"{task}.json"
        f.write_text(json.dumps({"task": task, "init": init, "setting": {"lr": 5e-5, "batch": 32, "epochs": 2.5},
                                 "seeds": [0, 1], "train_rows": 392_702, **metrics, "select": "final"}))  # fmt: skip
        files.append(str(f))
    glue_report.glue_table(files, tmp_path / "glue.csv", tmp_path / "glue.md")
    rows = {r["task"]: r for r in _read_csv(tmp_path / "glue.csv")}
    assert list(next(iter(rows.values()))) == glue_report.TABLE_COLUMNS
    assert rows["rte"]["init"] == "mnli, best seed of the best setting" and rows["rte"]["select"] == "final"
    assert rows["rte"]["published_24h_test"] == "57.7" and rows["mrpc"]["f1"] == "0.81234"  # every digit
    md = (tmp_path / "glue.md").read_text()
    _assert_tables_of_the_rule(md, 1)
    mrpc = _cells(md, "mrpc")
    # metrics x100 in 3 digits, a float setting as it is (not x100), thousands separated
    assert (mrpc["acc"], mrpc["f1"], mrpc["score"], mrpc["epochs"]) == ("71.2", "81.2", "81.2", "2.5")
    assert mrpc["published_24h_test"] == "87.5" and mrpc["train_rows"] == "392,702"
    assert "(No value in any row, so not shown: dev_rows, mcc, pearson, spearman.)" in md
    assert "Average score over 4 entries (dev)" in md


def _result(stop_reason: str) -> dict:
    return {"reference": summary.reference_comparison(120, 960, 6.0), "budget_s": 6.0, "clock": "wall",
            "steps": 120, "global_batch": 8, "sequences": 960, "wall_s": 6.4, "train_s": 5.9,
            "stop_reason": stop_reason, "val_loss": 7.123456, "checkpoint_every_s": None, "checkpoints": 1,
            "checkpoint_s": 0.25}  # fmt: skip


def test_pretraining_summary_quotes_a_comma_and_writes_markdown_by_the_rule(tmp_path):
    summary.write_summary(_result(COMMA), tmp_path)
    rows = _read_csv(tmp_path / "summary.csv")
    assert [r["run"] for r in rows] == ["this run", "reference at its pace over 6 s", "reference, 24 h"]
    assert rows[0]["stop_reason"] == COMMA and rows[0]["val_loss"] == "7.123456" and rows[2]["steps"] == "23000"
    md = (tmp_path / "summary.md").read_text()
    _assert_tables_of_the_rule(md, 1)
    assert _cells(md, "reference, 24 h")["sequences"] == "95,000,000" and _cells(md, "this run")["val_loss"] == "7.12"
    assert "sequences = steps x global batch" in md and "Checkpoints: none during the run" in md


def test_sweep_table_quotes_a_comma_and_writes_markdown_by_the_rule(tmp_path):
    values = {"gb16, seq32": {"global_batch": 16, "seq_len": 32}, "gb32-seq32": {"global_batch": 32, "seq_len": 32}}
    results, glues = [], []
    for i, v in enumerate(values.values()):
        res = tmp_path / f"result{i}.json"
        curve = [{"elapsed_s": 3.0, "val_loss": 9.0}, {"elapsed_s": 6.0, "val_loss": 8.25 - i}]
        res.write_text(json.dumps({"stop_reason": COMMA if i == 0 else "budget", "steps": 6, **v,
                                   "sequences": 6 * v["global_batch"], "tokens": 6 * v["global_batch"] * 32,
                                   "loss_last": 8.5 - i, "val_loss": 8.25 - i, "clock": "wall",
                                   "validation": curve}))  # fmt: skip
        g = tmp_path / f"glue{i}.csv"
        g.write_text(f"task,acc,score\nrte,0.{5 + i},0.{5 + i}\n")
        results.append(str(res))
        glues.append(str(g))
    sweep.sweep_table(values, results, glues, tmp_path / "sweep.csv", tmp_path / "sweep.md", tmp_path / "sweep.png")
    rows = _read_csv(tmp_path / "sweep.csv")
    assert [r["recipe"] for r in rows] == list(values) and rows[0]["stop_reason"] == COMMA
    assert [r["global_batch"] for r in rows] == ["16", "32"] and [r["glue_avg"] for r in rows] == ["50.0", "60.0"]
    md = (tmp_path / "sweep.md").read_text()
    _assert_tables_of_the_rule(md, 1)
    assert _cells(md, "gb32-seq32")["glue_avg"] == "60" and _cells(md, "gb32-seq32")["val_loss"] == "7.25"
    assert "Lowest validation loss at the budget's end: gb32-seq32 (7.25)." in md
    assert f"Stopped before the budget's end: gb16, seq32 ({COMMA})." in md


def test_throughput_record_writes_its_tables_by_the_rule(tmp_path):
    steps = [{"step": 1, "step_time_s": 9.0, "warmup": True}, {"step": 2, "step_time_s": 0.5},
             {"step": 3, "step_time_s": 0.7}]  # fmt: skip
    result = {"model": "tiny-gptneox", "nodes": 1, "gpus_per_node": 1, "gpu": "cpu", "method": "naive",
              "micro_batch": 4, "grad_accum_steps": 4, "world_size": 1, "data": {"label": "generated, corpus"},
              "throughput": record.sustained(steps, 16, 128, {"step_time_s": 0.5}),
              "startup": {"total_s": 12.5, "compile_s": 3.25}, "checkpoint": {"write_s": 0.5, "bytes": 123_456_789},
              "starts": [{"step": 0}]}  # fmt: skip
    csv_path, md_path = record.write_tables(tmp_path, result)
    rows = _read_csv(csv_path)
    assert [r["quantity"] for r in rows][:3] == ["step_time_s", "samples_per_s", "tokens_per_s"]
    assert rows[0]["ratio"] == "1.2" and rows[0]["meaning"] == record.MEANING["step_time_s"]
    md = md_path.read_text()
    _assert_tables_of_the_rule(md, 2)  # the run against its prediction, and what a restart costs
    assert _cells(md, "step_time_s")["ratio (train / prediction)"] == "1.2"
    assert _cells(md, "checkpoint_bytes")["train"] == "123,456,789"
    assert record.MEANING["step_time_s"] in md  # a long text: a numbered note under its table
    assert markdown.csv_text(["a", "b"], [["x, y", None]]) == 'a,b\n"x, y",\n'
