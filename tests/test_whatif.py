"""The what-if predictor (tables/whatif.py) on synthetic results built from known hardware constants: a measured GPU
type left out is predicted within the band; GPU types whose MFUs disagree widen it; what cannot fit says so."""

from __future__ import annotations

import polars as pl
import pytest
from pretrain_planner.planning.flops import param_count, train_flops_per_sample
from pretrain_planner.tables.whatif import Predictor, whatif_table

from .test_aggregate import CATALOG

MODEL = "pythia-1b"
EFFICIENCY = 0.01  # every synthetic all-reduce runs at 1% of the datasheet bandwidth: communication matters


def truth(gpu: str, world: int, mfu: float) -> float:
    """The synthetic hardware: compute at `mfu` of the dense peak, plus a ring all-reduce of the fp32 gradients."""
    spec, g = CATALOG.model(MODEL), CATALOG.gpu(gpu)
    flops = train_flops_per_sample(spec.to_dict()) * spec.recipe.global_batch
    comm = 2 * 4 * param_count(spec.to_dict()) * (world - 1) / world / (g.interconnect_gb_s / 2 * 1e9 * EFFICIENCY)
    return flops / (world * g.peak_for("bf16") * 1e12 * mfu) + comm


def cells(mfus: dict[str, float], worlds=(1, 4), model: str = MODEL) -> pl.DataFrame:
    spec = CATALOG.model(model)
    flops = train_flops_per_sample(spec.to_dict()) * spec.recipe.global_batch
    rows = []
    for gpu, m in mfus.items():
        for w in worlds:
            step = truth(gpu, w, m)
            rows.append({"model": model, "gpu": gpu, "nodes": 1, "gpus_per_node": w, "world_size": w, "method": "fl",
                         "status": "ok", "suspect": False, "valid": True, "step_time_s": step,
                         "mfu": flops / (step * w * CATALOG.gpu(gpu).peak_for("bf16") * 1e12),
                         "training_days": spec.recipe.steps * step / 86400})  # fmt: skip
    return pl.DataFrame(rows)


def test_held_out_gpu_type_lies_in_the_band():
    """a100 and a6000 measured (MFU 0.45 / 0.40); h100 (true MFU 0.42) left out and predicted."""
    predicted = Predictor(cells({"a100": 0.45, "a6000": 0.40, "h100": 0.42}), CATALOG).predict(MODEL, "h100", 1, 4)
    true_days = CATALOG.model(MODEL).recipe.steps * truth("h100", 4, 0.42) / 86400
    assert predicted.status == "predicted" and predicted.method == "fl"
    assert predicted.measured_days == pytest.approx(true_days)  # shown beside, never used
    assert predicted.days_optimistic < true_days < predicted.days_pessimistic
    assert predicted.days_central == pytest.approx(true_days, rel=0.10)  # communication scaled by the interconnect


def test_disagreeing_gpu_types_widen_the_band():
    """Without public evidence to fit the weighting of near GPU types, both measured types count alike."""
    agree = Predictor(cells({"a100": 0.45, "a6000": 0.44}), CATALOG, public=None).predict(MODEL, "h100", 1, 4)
    disagree = Predictor(cells({"a100": 0.45, "a6000": 0.25}), CATALOG, public=None).predict(MODEL, "h100", 1, 4)
    width = lambda p: p.days_pessimistic / p.days_optimistic  # noqa: E731
    assert width(disagree) > 1.3 * width(agree)
    assert agree.days_optimistic < agree.days_pessimistic  # one GPU type's worth of evidence is still a band


def test_what_cannot_fit_says_so():
    """Pythia-12B's fp32 model states (16 bytes x 12B parameters) cannot fit one 24 GiB RTX 3090 with `fl`."""
    p = Predictor(cells({"a100": 0.45}), CATALOG).predict("pythia-12b", "rtx3090", 1, 1)
    assert p.status == "does not fit" and "memory model" in p.why
    assert p.days_central is None


def test_nothing_measured_with_a_peak_gives_the_physics_bound_only():
    """Nothing measured anywhere (no cell on a GPU type with a peak and no public evidence): the bound only."""
    cpu = cells({"a100": 0.45}).with_columns(pl.lit("cpu").alias("gpu"), pl.lit(None, pl.Float64).alias("mfu"))
    p = Predictor(cpu, CATALOG, public=None).predict(MODEL, "h100", 1, 4)
    assert p.status == "bound only" and p.days_pessimistic is None and p.days_optimistic > 0


def test_whatif_table_covers_every_gpu_type_with_a_peak():
    table = whatif_table(Predictor(cells({"a100": 0.45, "a6000": 0.4}), CATALOG), [MODEL], [(1, 1), (1, 4)])
    with_peak = [g for g, s in CATALOG.gpus.items() if s.peak_tflops]
    assert sorted(set(table["gpu"].to_list())) == sorted(with_peak)
    assert table.height == 2 * len(with_peak)
    assert table.filter(pl.col("gpu") == "v100")["status"].unique().to_list() == ["invalid"]  # no bf16


def test_cli_predict_prints_a_labelled_band(tmp_path, capsys):
    from pretrain_planner.cli import main

    (tmp_path / "tables").mkdir()
    cells({"a100": 0.45, "a6000": 0.40}).write_parquet(tmp_path / "tables" / "cells.parquet")
    assert main(["predict", "--model", MODEL, "--gpu", "h100", "--count", "4", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PREDICTION (not a measurement)") and "(optimistic)" in out and "(pessimistic)" in out
    assert "assumes fl" in out and "amortised" in out
