"""The `pretrain-planner` console script on synthetic results folders (subprocesses, as a user runs it)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pretrain_planner import cli
from pretrain_planner.launch.state import write_state
from pretrain_planner.tables import aggregate, status

from .conftest import CATALOG, COSTS, P, cell_result, gpu_set_results, write_set

EXE = Path(sys.executable).parent / "pretrain-planner"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A results folder with tables (as the pipeline leaves it) and one with cell results only."""
    base = tmp_path_factory.mktemp("cli")
    full = base / "full"
    plan, paths = write_set(full, gpu_set_results())
    aggregate.build_tables(plan, paths, aggregate.table_files(str(full / "tables")), str(base / "log"), CATALOG, COSTS)
    (full / f"optimal/{P}/a100/1x4").mkdir(parents=True)
    bare = base / "bare"
    write_set(bare, gpu_set_results())
    (bare / "plan.csv").unlink()
    return base, full, bare


def test_cost(tmp_path):
    proc = run("cost", "--gpu", "a100", "--count", "4", "--days", "17.57", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "$83,500" in out and "$804" in out and "4 x NVIDIA A100" in out
    assert "base machine for 4 GPUs $7,500 + 4 x $19,000" in out
    assert "no cloud_usd_per_gpu_hour for a100" in out
    proc = subprocess.run(
        [sys.executable, "-m", "pretrain_planner", "cost", "--gpu", "h200", "--count", "4", "--days", "3", "--json"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["hardware_usd"] is None and "no price_usd for h200" in data["cost_note"]
    assert data["gpu_hours"] == pytest.approx(4 * 3 * 24)


def test_cost_in_process(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no results/ here: the demo config prices it, whatever sweep ran in the checkout
    assert cli.main(["cost", "--gpu", "h100", "--count", "4", "--days", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hardware_usd"] == 127_500 and round(data["amortised_usd"]) == 559
    assert cli.main(["cost", "--gpu", "rtx3090", "--count", "2", "--json", "--years", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hardware_usd"] == 4_100 and data["amortisation_years"] == 3 and data["amortised_usd"] is None
    assert cli.main(["cost", "--gpu", "a100", "--count", "8", "--nodes", "2", "--days", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hardware_usd"] == 2 * 7_500 + 8 * 19_000
    assert cli.main(["cost", "--gpu", "tpu", "--count", "4"]) == 1
    assert "no GPU type 'tpu'" in capsys.readouterr().err
    assert cli.main(["cost", "--gpu", "a100", "--count", "3", "--nodes", "2"]) == 1
    assert "cannot be spread evenly" in capsys.readouterr().err


def test_best_from_tables(results):
    base, full, _ = results
    proc = run("best", "--model", P, "--gpu", "a100", "--count", "4", "--results", str(full), cwd=base)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith(f"{P} on 1x4 a100: best method fl+zero1, 18 d")  # days with units, the tables' rounding
    assert "micro-batch 4 x 64 accumulation steps" in out and "step 10.6 s" in out
    assert "naive alone 25 d (1.4x)" in out and "hardware $83,500, amortised $804" in out
    assert "other layouts measured: 2x2" not in out and "2x4" not in out  # 2x4 is 8 GPUs
    assert f"plan: {full}/optimal/{P}/a100/1x4/" in out
    assert "time_to_train.csv" in out


def test_best_from_cell_results_alone(results):
    base, _, bare = results
    proc = run("best", "--model", P, "--gpu", "a100", "--count", "8", "--results", str(bare), "--json", cwd=base)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["nodes"], data["gpus_per_node"], data["best_method"]) == (2, 4, "fl+fsdp-full")
    assert data["training_days"] == pytest.approx(9.0) and data["price"]["hardware_usd"] == 167_000
    assert "result files" in data["source"]


def test_best_says_why_nothing_fits_and_the_cheapest_fix(results, capsys):
    """Where every method ran out of memory, `best` names what micro-batch 1 needs against the GPU's memory and the
    cheapest change that fits (tables/memfix.py), from the pipeline's tables and from the cell results alone."""
    _, full, bare = results
    for folder in (full, bare):
        assert cli.main(["best", "--model", P, "--gpu", "rtx3090", "--count", "4", "--results", str(folder)]) == 1
        out = capsys.readouterr().out
        assert out.startswith(f"{P} on 1x4 rtx3090: nothing fits (out of memory)"), out
        assert "needs > 24 GiB per GPU at micro-batch 1" in out and "out of memory measured on 4 x rtx3090" in out
        # 16 bytes a parameter of DDP model states (15.1 GiB) + one sample's checkpointed layer inputs and its plain
        # head's fp32 logits (0.5 GiB): fl+ac's own activations, not a method-less estimate's (issue 56)
        assert "cheapest fix: fl+ac on the same GPUs (memory model: >= 16 GiB of 24 GiB; not measured)" in out
        assert "other fixes: fl on 1x4 a6000 (48 GiB)" in out and "rtx3090 1x1" in out  # the measured settings
    # a setting that fits names the methods that did not, and what fits instead
    assert cli.main(["best", "--model", P, "--gpu", "rtx3090", "--count", "1", "--results", str(full)]) == 0
    out = capsys.readouterr().out
    assert "out of memory here: needs > 24 GiB per GPU at micro-batch 1 with fl" in out
    assert "fix: fl+ac on the same GPUs (measured: it fits)" in out
    # a setting never measured is still an error naming what was
    assert cli.main(["best", "--model", P, "--gpu", "v100", "--count", "4", "--results", str(bare)]) == 1
    assert "no measured setting for pythia-1b on 4 v100" in capsys.readouterr().err


def _status_folder(root: Path) -> Path:
    """One cell of every state: ok, oom, unsupported, corrupt, failed, running (two ways), pending."""
    cells = [cell_result(P, "a100", 1, k, "fl", s, 10.0) for k, s in ((1, "ok"), (2, "oom"), (4, "unsupported"))]
    cells += [cell_result(P, "a100", 1, 8, "fl", "ok", 10.0)]  # will be corrupt
    cells += [cell_result(P, "h100", 1, k, "fl", "ok", 10.0) for k in (1, 2, 4, 8)]  # failed, running x2, pending
    write_set(root, cells, [(P, "v100", 1, 1, "fl", "bf16 is not supported by v100")])
    cell = root / f"cells/{P}"
    (cell / "a100/1x8/fl/result.json").write_text('{"status": "ok", "step_')
    for k in (1, 2, 4, 8):
        (cell / f"h100/1x{k}/fl/result.json").unlink()
    write_state(cell / "h100/1x1/fl", "failed", launcher="slurm", job_id="12", job_ids=["12"], attempt=1,
                error="job 12 did not complete: UncompletedJobError: job 12 (task: 0) with path ...")  # fmt: skip
    (cell / "h100/1x2/fl/submitit").mkdir()
    (cell / "h100/1x4/fl/slurm_job.json").write_text('{"job_id": "13"}')
    return root


def test_status(tmp_path):
    root = _status_folder(tmp_path / "results")
    proc = run("status", "--results", str(root), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = lines[1].split()
    assert header == ["gpu", "cells", *status.STATES, "invalid", "gpu_hours_spent", "gpu_hours_left_max"]
    rows = {ln.split()[0]: ln.split() for ln in lines[2:] if ln and ln.split()[0] in ("a100", "h100", "v100", "total")}
    a100 = dict(zip(header, rows["a100"], strict=True))
    assert (a100["cells"], a100["ok"], a100["oom"], a100["unsupported"], a100["corrupt"]) == ("4", "1", "1", "1", "1")
    # spent: 360 s x world size of the three cells with a result; left: the corrupt cell's bound (8 GPU-hours)
    assert a100["gpu_hours_spent"] == f"{360 * (1 + 2 + 4) / 3600:.2f}" and a100["gpu_hours_left_max"] == "8.00"
    h100 = dict(zip(header, rows["h100"], strict=True))
    assert (h100["failed"], h100["running"], h100["pending"], h100["ok"]) == ("1", "2", "1", "0")
    assert h100["gpu_hours_left_max"] == f"{1 + 2 + 4 + 8:.2f}" and h100["gpu_hours_spent"] == "0.00"
    assert rows["v100"][header.index("invalid")] == "1"
    assert "h100/1x1/fl: failed: job 12 did not complete" in proc.stdout
    assert "a100/1x8/fl: corrupt: not valid JSON" in proc.stdout


def test_status_json_and_log_of_a_vanished_result(tmp_path, capsys):
    root = _status_folder(tmp_path / "results")
    # done, but its result.json is gone
    write_state(root / f"cells/{P}/h100/1x8/fl", "done", launcher="slurm", job_id="14", result_status="ok")
    assert cli.main(["status", "--results", str(root), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_gpu = {r["gpu"]: r for r in data["summary"]}
    assert by_gpu["h100"]["failed"] == 2 and by_gpu["h100"]["pending"] == 0
    states = {c["path"]: (c["state"], c["detail"]) for c in data["cells"]}
    assert states[f"cells/{P}/h100/1x8/fl"] == ("failed", "the job finished but wrote no result.json")


def test_status_without_a_plan_uses_the_config(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(["status", "--results", str(tmp_path / "empty")]) == 0
    out = capsys.readouterr().out
    assert "no " in out and "plan.csv yet" in out and "pending" in out
    # a folder that does not exist (a typo) is named, not answered as a sweep not run yet (issue 56)
    assert cli.main(["status", "--results", str(tmp_path / "nonexistent")]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and f"--results {tmp_path / 'nonexistent'}: no such folder" in captured.err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--count", "4", "--days", "-17"], "argument --days: -17 must be a positive number"),
        (["--count", "-4"], "argument --count: -4 must be a positive integer"),
        (["--count", "0"], "argument --count: 0 must be a positive integer"),
        (["--count", "4", "--nodes", "0"], "argument --nodes: 0 must be a positive integer"),
        (["--count", "4", "--days", "nan"], "argument --days: nan must be a positive number"),
        (["--count", "4", "--years", "0"], "argument --years: 0 must be a positive number"),
        (["--count", "four"], "argument --count: 'four' is not an integer"),
    ],
)
def test_cost_refuses_non_positive_numbers(tmp_path, args, says):
    proc = run("cost", "--gpu", "a100", *args, cwd=tmp_path)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert "$" not in proc.stdout  # no price printed


def test_predict_on_a_fresh_install(tmp_path):
    """Nothing measured and no results folder: a band from the shipped public evidence, its rows and sources named,
    with the model's measured error (issue 23; it said "no results")."""
    proc = run("predict", "--model", "pythia-1b", "--gpu", "h100", "--count", "4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("PREDICTION (not a measurement)") and "from public evidence" in out
    assert "(optimistic)" in out and "(central)" in out and "(pessimistic)" in out
    assert re.search(r"rests on: r\d{4} \(here-h200", out) and "sources: here-h200" in out
    assert "kind of transfer: same model, measured GPU type" in out  # H200 rows to an H100, both in the evidence
    said = r"measured error of that kind \(out of sample\): the same workload .* left out .* mean \|error\|"
    assert re.search(said, out)


@pytest.mark.slow  # the what-if over the whole catalog, three times in subprocesses (seconds each)
def test_fit_answers_the_inverse_question(results):
    """What fits in N days on 4 x A100: the measured setting where there is one (pythia-1b's 17.57 days), else the
    prediction; the tokens each reaches in that time; whether the recipe's run fits."""
    _base, full, _bare = results
    proc = run("fit", "--gpu", "a100", "--count", "4", "--days", "14", "--json", "--results", str(full), cwd=full)
    assert proc.returncode == 0, proc.stderr
    rows = {r["model"]: r for r in json.loads(proc.stdout)["rows"]}
    one_b = rows["pythia-1b"]
    assert one_b["basis"] == "measured" and one_b["fits"] == "no" and one_b["days"] == pytest.approx(17.57)
    tokens = CATALOG.model("pythia-1b").recipe.steps * 1024 * 2048
    assert one_b["tokens_in_time"] == pytest.approx(tokens * 14 / 17.57, rel=1e-3)
    assert rows["pythia-160m"]["basis"] == "public evidence" and rows["pythia-160m"]["fits"] in ("yes", "likely")
    assert rows["mamba-2.8b"]["basis"] == "bound only"
    assert not any(m.startswith("tiny-") for m in rows)
    proc = run("fit", "--gpu", "a100", "--count", "4", "--days", "20", "--results", str(full), cwd=full)
    assert proc.returncode == 0, proc.stderr
    header = next(x for x in proc.stdout.splitlines() if x.startswith("| model "))
    assert [c.strip() for c in header.strip("|").split("|")][:4] == ["model", "fits", "method", "days"]  # headers
    line = next(x for x in proc.stdout.splitlines() if x.startswith("| pythia-1b "))
    assert "| yes " in line and "| measured " in line
    assert max(len(x) for x in proc.stdout.splitlines() if x.startswith("|")) <= 120  # one table, not cut


def test_every_command_says_what_it_does_and_what_each_option_takes(capsys):
    """Issue 36: `--version`; each sub-command's --help opens with a description and every option has a help text;
    a GPU type's name given to --gpus (which takes a file) says which flag takes a name."""
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("pretrain-planner ")
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in subs.items():
        assert sub.description, name
        missing = [a.option_strings for a in sub._actions if not a.help]
        assert not missing, (name, missing)
    assert cli.main(["cost", "--gpus", "a100", "--gpu", "a100", "--count", "2"]) == 1
    err = capsys.readouterr().err
    assert "--gpus takes a catalog file" in err and "use --gpu a100" in err


def test_best_names_the_known_models_for_an_unknown_one(results, capsys):
    _base, full, _bare = results
    assert cli.main(["best", "--model", "pythia-9b", "--gpu", "a100", "--results", str(full)]) == 1
    err = capsys.readouterr().err
    assert "no model 'pythia-9b'" in err and "known: " in err and "pythia-1b" in err


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    """The GPU set's results with each cell's measured start-up (result.json `startup`), tables built."""
    base = tmp_path_factory.mktemp("timed")
    rows = [{**r, "startup": {"total_s": 120.0, "process_start": "proc"}} if r["status"] == "ok" else r
            for r in gpu_set_results()]  # fmt: skip
    plan, paths = write_set(base, rows)
    aggregate.build_tables(plan, paths, aggregate.table_files(str(base / "tables")), str(base / "log"), CATALOG, COSTS)
    return base


@pytest.mark.slow  # the what-if over the whole catalog, three times in subprocesses (seconds each)
def test_fit_by_a_date_puts_each_model_on_the_calendar(timed):
    """Issue 38: `fit --by DATE` ranks what finishes by then: pythia-1b's measured 17.57 days plus its start-up
    (locally: no queue, one job) finishes by a date 30 days out, not by one 10 days out (its compute alone is
    longer: `no`, not `unknown`); the finish is now + compute + the measured start-up."""
    from datetime import datetime, timedelta

    later = (datetime.now() + timedelta(days=30)).date().isoformat()
    proc = run("fit", "--gpu", "a100", "--count", "4", "--by", later, "--json", "--results", str(timed), cwd=timed)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    rows = {r["model"]: r for r in out["rows"]}
    one_b = rows["pythia-1b"]
    assert one_b["basis"] == "measured" and one_b["by"] == "yes" and one_b["compute_days"] == pytest.approx(17.57)
    finish = datetime.fromisoformat(one_b["finish"])
    assert abs((finish - datetime.now() - timedelta(days=17.57, seconds=120)).total_seconds()) < 120
    assert [r["by"] for r in out["rows"]] == sorted((r["by"] for r in out["rows"]),
                                                    key=["yes", "unknown", "no"].index)  # fmt: skip
    soon = (datetime.now() + timedelta(days=10)).date().isoformat()
    proc = run("fit", "--gpu", "a100", "--count", "4", "--by", soon, "--json", "--results", str(timed), cwd=timed)
    assert {r["model"]: r for r in json.loads(proc.stdout)["rows"]}["pythia-1b"]["by"] == "no"
    text = run("fit", "--gpu", "a100", "--count", "4", "--by", later, "--results", str(timed), cwd=timed).stdout
    assert f"What finishes by {later}T00:00 on 1x4 a100" in text and "| pythia-1b " in text


@pytest.mark.parametrize(("by", "says"), [("2020-01-01", "not in the future"), ("1/3/2027", "is not a date")])
def test_fit_by_a_past_or_malformed_date_is_refused(timed, by, says):
    proc = run("fit", "--gpu", "a100", "--count", "4", "--by", by, "--results", str(timed), cwd=timed)
    assert proc.returncode == 1 and says in proc.stderr, proc.stderr
    both = run("fit", "--gpu", "a100", "--count", "4", "--by", "2099-01-01", "--days", "3", cwd=timed)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_when_answers_with_the_measured_setting_or_a_prediction_said_so(timed):
    """`when` on a measured setting: its compute measured, one local job with its measured start-up, a finish; on a
    GPU type not measured: the what-if's PREDICTED days, the restart from the median of the cells measured."""
    proc = run("when", "--model", "pythia-1b", "--gpu", "a100", "--count", "4", "--results", str(timed), cwd=timed)
    assert proc.returncode == 0, proc.stderr
    assert "compute: 18 d - measured (time_to_train)" in proc.stdout, proc.stdout
    assert "segments: 1 (one job, no time limit)" in proc.stdout and "local processes: no queue" in proc.stdout
    assert "start-up measured" in proc.stdout and "finish: 20" in proc.stdout
    other = run("when", "--model", "pythia-1b", "--gpu", "h200", "--count", "4", "--results", str(timed), cwd=timed)
    assert other.returncode == 0, other.stderr
    assert "PREDICTED (not measured)" in other.stdout and "median of the sweep's cells" in other.stdout, other.stdout


@pytest.mark.parametrize("name", ["cost", "best", "predict", "fit", "when", "status", "train", "evidence"])
def test_each_command_is_a_module_that_renders_apart_from_querying(name):
    """Issue 41 (3): each command is a module of the cli package whose rendering (text, JSON) is apart from the
    query that computes the answer; the parser runs the two: a command of one answer through parser.answer, one
    with more to do (best's no-fit, status's watch, evidence's two actions) through its own `run`."""
    import importlib

    from pretrain_planner.cli import parser

    mod = importlib.import_module(f"pretrain_planner.cli.{name}")
    query = {"status": "snapshot", "evidence": "export"}.get(name, "query")
    renders = ("render_exported", "render_imported") if name == "evidence" else ("render_text", "render_json")
    assert all(callable(getattr(mod, f, None)) for f in (query, *renders)), name
    command = next(a for a in cli.build_parser()._actions if a.dest == "command").choices[name]
    func = command.get_default("func")
    if hasattr(mod, "run"):
        assert func is mod.run
    else:
        assert func.__qualname__ == "answer.<locals>.run" and func.__closure__[0].cell_contents is mod
        assert parser.answer(mod).__qualname__ == func.__qualname__


def test_an_answer_is_data_and_its_text_is_written_apart(results, capsys):
    """`best` asked in process: its query returns the pick as data, printing nothing; the text and the JSON
    written from that data are what the command prints."""
    from pretrain_planner.cli import best

    _, full, _ = results
    argv = ["best", "--model", P, "--gpu", "a100", "--count", "4", "--results", str(full)]
    answer = best.query(cli.build_parser().parse_args(argv))
    assert capsys.readouterr().out == ""
    assert (answer.pick["best_method"], answer.pick["nodes"], answer.pick["gpus_per_node"]) == ("fl+zero1", 1, 4)
    assert answer.price.hardware_usd == 83_500 and answer.plan == full / f"optimal/{P}/a100/1x4"
    text = best.render_text(answer)
    assert text.startswith(f"{P} on 1x4 a100: best method fl+zero1, 18 d") and "hardware $83,500" in text
    assert json.loads(best.render_json(answer))["best_method"] == "fl+zero1"
    assert cli.main(argv) == 0 and capsys.readouterr().out == text + "\n"
