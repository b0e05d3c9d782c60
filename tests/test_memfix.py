"""Why a setting does not fit, and the cheapest fix (tables/memfix.py), on synthetic results (no training): the need
at micro-batch 1 by its best source, the fixes in the order of what they cost, measurements over the memory model."""

from __future__ import annotations

import polars as pl
import pytest
from pretrain_planner.planning.memory import GIB
from pretrain_planner.tables import aggregate, memfix

from .conftest import CATALOG, COSTS, cell_result, write_set


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    results = [
        cell_result("pythia-6.9b", "a100", 1, 1, "fl", "oom"),
        cell_result("pythia-6.9b", "a100", 1, 1, "naive", "oom"),
        cell_result("pythia-6.9b", "a100", 1, 8, "fl", "oom"),
        cell_result("pythia-1b", "rtx3090", 1, 1, "fl", "oom"),
        cell_result("pythia-1b", "rtx3090", 1, 2, "fl", "oom"),
        cell_result("pythia-1b", "rtx3090", 1, 2, "fl+ac", "ok", 100.0, mb=1),  # measured: fits at micro-batch 1
        cell_result("pythia-1b", "a100", 1, 2, "fl+ac", "ok", 50.0, mb=1, peak_mem_gib=21.5),
    ]
    plan, paths = write_set(tmp_path_factory.mktemp("memfix"), results)
    return aggregate.build_all(plan, paths, CATALOG, COSTS)


def _row(df: pl.DataFrame, model: str, gpu: str, gpn: int, method: str | None = None) -> dict:
    sel = df.filter((pl.col("model") == model) & (pl.col("gpu") == gpu) & (pl.col("gpus_per_node") == gpn))
    if method:
        sel = sel.filter(pl.col("method") == method)
    return sel.row(0, named=True)


def test_the_memory_model_lower_bound_and_the_cheapest_method(tables):
    """pythia-6.9b on one A100: fp32 weights + Adam's two moments (12 bytes per parameter, what is held before the
    first backward: planning/memory.py's bound) and the activations exceed 80 GiB, so no method without offload fits
    one GPU; offload is the cheapest change that does, a GPU with more memory the next."""
    f = _row(tables["feasibility"], "pythia-6.9b", "a100", 1)
    assert f["verdict"] == "out of memory" and f["need_source"] == "memory model (lower bound)"
    spec = CATALOG.models["pythia-6.9b"]
    assert f["need_gib"] == pytest.approx(memfix.need_bytes(spec, "fl", 1) / GIB) and f["need_gib"] > 80
    assert f["cheapest_fix"].startswith("fl+zero2+off on the same GPUs (memory model: >= ")
    assert f["other_fixes"] == "fl+zero2+off on 1x1 gh200 (96 GiB)"  # the smallest larger GPU type, its cheapest fit
    # on 8 GPUs sharding the optimizer state is enough (the memory model's bound: 66 GiB of 80)
    assert _row(tables["feasibility"], "pythia-6.9b", "a100", 8)["cheapest_fix"].startswith("fl+zero1 on the same")


def test_a_measured_fit_and_a_measured_peak_win_over_the_model(tables):
    cells = tables["cells"]
    # rtx3090 x2: fl ran out of memory, fl+ac ran: the fix is the measured one
    oom = _row(cells, "pythia-1b", "rtx3090", 2, "fl")
    assert oom["cheapest_fix"] == "fl+ac on the same GPUs (measured: it fits)"
    assert oom["need_gib"] == 24 and oom["need_source"] == "out of memory measured on 2 x rtx3090 (24 GiB)"
    # a cell of the same model, method and count ran at micro-batch 1: its peak is the need
    ex = memfix.Explainer(cells, CATALOG)
    need = ex.need("pythia-1b", "fl+ac", 2)
    assert need.gib == 21.5 and need.source == "measured peak on 2 x a100" and need.text() == "22 GiB"
    assert memfix.need_text(24.0, "out of memory measured on 1 x rtx3090") == "> 24 GiB"
    assert memfix.need_text(15.2, "memory model (lower bound)") == ">= 15 GiB"


def test_a_method_measured_out_of_memory_is_never_proposed(tables):
    """fl ran out of memory on one RTX 3090: no fix proposes fl on an RTX 3090 at any count (an unsharded method's
    memory per GPU does not shrink with more GPUs), though the memory model alone would let it fit."""
    ex = memfix.Explainer(tables["cells"], CATALOG)
    fixes = ex.fixes("pythia-1b", "rtx3090", 1, 1, ["fl"])
    assert fixes[0].startswith("fl+ac on the same GPUs") and not any(f.startswith("fl on") and "rtx3090" in f
                                                                      for f in fixes)  # fmt: skip
    spec = CATALOG.models["pythia-1b"]
    assert memfix.need_bytes(spec, "fl", 1) < 24 * GIB  # the lower bound alone would have said it fits


def test_nothing_is_said_where_everything_fits(tables):
    f = _row(tables["feasibility"], "pythia-1b", "rtx3090", 2)
    assert f["verdict"] == "other method" and f["cheapest_fix"] is None
