"""The `cpu` stand-in's dense peak is measured on the host (trainer/hostpeak.py), recorded with how it was measured,
and used for MFU, `suspect` and the analytic estimate, where a GPU type has its datasheet figure. A real one-rank
cell on this machine (the in-process launcher), then the tables built from its result."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from pretrain_planner.launch.cell import run_cell
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.grid import Cell
from pretrain_planner.planning.spec import cell_spec
from pretrain_planner.tables import aggregate, views
from pretrain_planner.trainer import hostpeak

from .conftest import REPO, sections

CATALOG = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")


def test_the_probe_measures_a_plausible_rate_and_says_how():
    tflops, how = hostpeak.matmul_tflops("fp32", size=256, reps=3)
    assert 1e-4 < tflops < 50  # one CPU thread: far below a GPU, far above nothing
    assert how.startswith("measured on this host, not a datasheet") and "256x256 fp32 torch.matmul" in how


PROBE = """
import os, sys, torch
os.sched_setaffinity(0, {int(sys.argv[1])}); torch.set_num_threads(1)
from pretrain_planner.trainer import hostpeak
print(hostpeak.matmul_tflops("fp32", size=1024, reps=5)[0])
"""


@pytest.mark.slow  # a busy loop beside the probe, timed: load-sensitive
def test_a_neighbour_on_the_same_core_does_not_lower_the_peak():
    """A busy loop pinned to the probe's core takes it about half the time: each 1024^3 product (tens of ms, longer
    than the scheduler's slice) then takes twice its wall time, but not twice the CPU time it needed, by which the
    probe times it too. Before, the peak read about half and a cell's steps timed while the core was free read as an
    MFU above 100% (`suspect`; seen with the suite on three workers)."""
    core = sorted(os.sched_getaffinity(0))[0]

    def probe() -> float:
        out = subprocess.run([sys.executable, "-c", PROBE, str(core)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return float(out.stdout.split()[-1])

    quiet = probe()
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])
    try:
        shared = max(probe(), probe())  # the best of two, as the probe keeps its best product: other load is noise
    finally:
        hog.kill()
        hog.wait()
    # the old probe read 0.48 of the quiet peak; a loaded CI host has read 0.71 with the fixed one (quiet is not quiet
    # there either: the other workers share the cores)
    assert shared > 0.62 * quiet, (quiet, shared)


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    """tiny-gptneox, naive, one `cpu` rank, measured for real through the trainer's cell entry point."""
    root = tmp_path_factory.mktemp("peak")
    folder = root / "cells/tiny-gptneox/cpu/1x1/naive"
    config = {"benchmark": {"warmup_steps": 1, "timed_steps": 3, "max_micro_batch": 4, "seed": 0, "max_spread": 50},
              "launcher": {"kind": "debug", "timeout_min": 5}}  # fmt: skip
    spec = cell_spec(Cell("tiny-gptneox", "cpu", 1, 1, "naive"), CATALOG, *sections(config),
                     str(folder / "result.json"), str(folder / "steps.jsonl"))  # fmt: skip
    run_cell(spec, str(folder / "cell.log"))
    return root, json.loads((folder / "result.json").read_text())


@pytest.mark.slow  # a training run (a real cell, in-process)
def test_a_cpu_cell_records_the_measured_peak_and_its_mfu(cell):
    _, r = cell
    assert r["status"] == "ok", r.get("reason")
    assert CATALOG.gpus["cpu"].peak_tflops == {}  # no datasheet figure to fall back on
    assert r["peak_tflops"] > 0 and r["peak_source"].startswith("measured on this host, not a datasheet")
    assert "fp32 torch.matmul" in r["peak_source"]
    assert r["mfu"] == pytest.approx(r["flops_per_step"] / (r["step_time_s"] * 1 * r["peak_tflops"] * 1e12))
    assert 0 < r["mfu"] < 1 and r["suspect"] is False  # a real step stays below the host's own matmul rate


@pytest.mark.slow  # a training run (a real cell, in-process)
def test_the_tables_use_it_and_say_it_is_measured(cell):
    root, r = cell
    paths = [str(root / "cells/tiny-gptneox/cpu/1x1/naive/result.json")]
    tables = aggregate.build_all(aggregate.plan_from_results(aggregate.read_results(paths)[0]), paths, CATALOG)
    row = tables["time_to_train"].row(0, named=True)
    assert row["peak_kind"] == "measured" and row["analytic_peak_tflops"] == pytest.approx(r["peak_tflops"])
    assert row["analytic_days"] == pytest.approx(1000 * r["flops_per_step"] / (r["peak_tflops"] * 1e12) / 86400)
    assert row["measured_over_analytic"] == pytest.approx(1 / r["mfu"])
    md = aggregate.markdown_body("time_to_train", tables["time_to_train"])
    assert f"{views.units.percent(r['mfu'])}*" in md and "MEASURED on the host" in md
