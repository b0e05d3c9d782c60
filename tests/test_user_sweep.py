"""A user's own sweep, as the user runs it (issue 36): the CLI answers with the config the results were made from, and
every mistake in a config file Snakemake reads ends with one line naming the file (and line), not a traceback.

The sweeps here run Snakemake for real up to their plan (`results/plan.csv`: the driver executes, so it records its
config) and stop there; the cells are written as a cell writes them, so no test trains."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pretrain_planner import layout
from pretrain_planner.results import write_result

from .conftest import REPO, cell_result, snakemake

pytestmark = pytest.mark.slow

EXE = Path(sys.executable).parent / "pretrain-planner"
# the 4-cell sweep of the issue: tiny-gptneox on 2 `cpu` ranks, four methods, no prices of its own
MINE = {"sweep": {"models": ["tiny-gptneox"], "gpus": ["cpu"], "gpus_per_node": [2],
                  "methods": ["naive", "fl", "fl+ac", "fl+zero2"]}}  # fmt: skip


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def plan_and_cells(work: Path, config: dict, results: str = "results") -> Path:
    """`snakemake --profile cluster/local --configfile my-sweep.yaml <results>/plan.csv` in `work`, then the sweep's
    cells as a finished cell leaves them (fl fastest)."""
    (work / "my-sweep.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    proc = snakemake(work, "--profile", str(REPO / "cluster/local"), f"{results}/{layout.PLAN}",
                     "--configfile", "my-sweep.yaml")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    days = {"naive": 0.02, "fl": 0.01, "fl+ac": 0.015, "fl+zero2": 0.012}
    for method in config["sweep"]["methods"]:
        r = cell_result("tiny-gptneox", "cpu", 1, 2, method, days=days[method])
        write_result(work / results / f"cells/tiny-gptneox/cpu/1x2/{method}/result.json", r)
    return work / results


@pytest.fixture(scope="module")
def user_sweep(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("user-sweep")
    plan_and_cells(work, MINE)
    return work


@pytest.fixture(scope="module")
def own_folder(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("own-folder")
    plan_and_cells(work, {**MINE, "results": "runs/mine"}, "runs/mine")
    return work


def test_the_results_record_the_config_they_were_made_from(user_sweep):
    rec = json.loads((user_sweep / "results" / layout.SWEEP_CONFIG).read_text())
    assert rec["config"]["sweep"]["methods"] == MINE["sweep"]["methods"]
    assert not rec["config"]["costs"].get("prices")  # the demo's nominal cpu price is not in it
    assert [Path(f["path"]).name for f in rec["files"]] == ["my-sweep.yaml"] and len(rec["files"][0]["sha256"]) == 64
    pointer = json.loads((user_sweep / ".pretrain-planner/last-sweep.json").read_text())
    assert Path(pointer["results"]) == (user_sweep / "results").resolve()


def test_a_dry_run_records_nothing(tmp_path):
    (tmp_path / "my-sweep.yaml").write_text(yaml.safe_dump(MINE))
    proc = snakemake(tmp_path, "-n", "--profile", str(REPO / "cluster/local"), "--configfile", "my-sweep.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "results" / layout.SWEEP_CONFIG).exists()
    assert not (tmp_path / ".pretrain-planner").exists()


def test_best_prices_the_users_sweep_not_the_demos(user_sweep):
    """The issue's case: after the user's sweep (no prices), `best` quoted the demo's NOMINAL $2,000 for `cpu`."""
    proc = cli("best", "--model", "tiny-gptneox", "--gpu", "cpu", "--count", "2", cwd=user_sweep)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("tiny-gptneox on 1x2 cpu: best method fl,")
    assert "NOMINAL" not in out and "$2,000" not in out
    assert "no price_usd for cpu" in out  # what the user's own costs.md says
    assert "my-sweep.yaml" in out and "config.json" in out  # which config answered
    # the demo's config given by hand disagrees with what these results were made from: an error naming both
    proc = cli("best", "--model", "tiny-gptneox", "--gpu", "cpu", "--config", str(REPO / "config/config.yaml"),
               cwd=user_sweep)  # fmt: skip
    assert proc.returncode == 1
    err = proc.stderr
    assert "config/config.yaml is not the config results was made from" in err and "my-sweep.yaml" in err
    assert "costs.prices" in err and "Traceback" not in err
    # the same config given by hand agrees
    proc = cli("cost", "--gpu", "cpu", "--count", "2", "--days", "1", "--config", "my-sweep.yaml", cwd=user_sweep)
    assert proc.returncode == 0, proc.stderr
    assert "NOMINAL" not in proc.stdout and "no price_usd for cpu" in proc.stdout


def test_a_sweep_with_its_own_results_folder_is_answered_from_it(own_folder, tmp_path):
    """`results: runs/mine`: every command without flags follows the last sweep run in the folder; `--results` reads
    that folder's record from anywhere; a folder with no record says which config it assumed."""
    proc = cli("best", "--model", "tiny-gptneox", "--gpu", "cpu", "--count", "2", cwd=own_folder)
    assert proc.returncode == 0, proc.stderr
    assert "runs/mine/tables" in proc.stdout or "runs/mine/cells" in proc.stdout
    assert "the last sweep run here" in proc.stdout and "NOMINAL" not in proc.stdout
    proc = cli("status", cwd=own_folder)
    assert proc.returncode == 0, proc.stderr
    assert "sweep status of" in proc.stdout and "runs/mine" in proc.stdout.splitlines()[0]
    # from another directory: --results names the folder, its record names the config
    proc = cli("best", "--model", "tiny-gptneox", "--gpu", "cpu", "--results", str(own_folder / "runs/mine"),
               cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "NOMINAL" not in proc.stdout and "my-sweep.yaml" in proc.stdout
    # a folder without a record (made before records): answered with the demo config, and it says so
    bare = tmp_path / "old"
    write_result(bare / "cells/tiny-gptneox/cpu/1x2/fl/result.json",
                 cell_result("tiny-gptneox", "cpu", 1, 2, "fl", days=0.01))  # fmt: skip
    proc = cli("best", "--model", "tiny-gptneox", "--gpu", "cpu", "--results", str(bare), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "has no record of its own" in proc.stdout and "config/config.yaml" in proc.stdout


@pytest.mark.parametrize(
    "name, text, said",
    [
        ("bad.yaml", "sweep:\n  models: [tiny-gptneox\n  gpus: [cpu]\n", "bad.yaml:3:7: not valid YAML"),
        ("tabs.yaml", "sweep:\n\tmodels: [tiny-gptneox]\n", "tabs.yaml:2:1: not valid YAML"),
        ("empty.yaml", "# only a comment\n", "empty.yaml: the file is empty"),
        ("list.yaml", "- tiny-gptneox\n", "list.yaml: the top level is a list"),
        (None, None, "--configfile my-swep.yaml: no such file"),
        ("extra.yaml", "search:\n  strategy: adaptive\n", "extra.yaml: no `sweep:` section (it sets `search:`)"),
    ],
    ids=["yaml-syntax", "tabs", "comment-only", "not-a-mapping", "mistyped-path", "no-sweep"],
)
def test_a_config_mistake_is_one_line_naming_the_file(tmp_path, name, text, said):
    """Snakemake reads --configfile before the Snakefile: a YAML mistake said "Config file is not valid JSON or YAML"
    (no file, no line), an empty file "must be given as JSON or YAML with keys at top level" (no file), a mistyped
    path a 27-line traceback, a file without `sweep:` a raw KeyError traceback from common.smk."""
    if name:
        (tmp_path / name).write_text(text)
    (tmp_path / "my-sweep.yaml").write_text(yaml.safe_dump(MINE))
    proc = snakemake(tmp_path, "-n", "--profile", str(REPO / "cluster/local"), "--configfile", name or "my-swep.yaml")
    assert proc.returncode == 1
    err = proc.stdout + proc.stderr
    assert said in err, err[-3000:]
    assert "Traceback" not in err and 'File "' not in err, err[-3000:]
    if name is None:
        assert "did you mean my-sweep.yaml" in err
    message = [ln for ln in err.splitlines() if said in ln]
    assert len(message) == 1 and len(message[0].replace(str(tmp_path), "")) < 400  # one line a person reads
