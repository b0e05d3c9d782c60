"""A prediction obeys its own memory model (issue 56): `predict` names a method and a micro-batch, and that
micro-batch is never one that planning/memory.py's `predicted_micro_batch` refuses for that method on the target.
The predictor once asked a second estimate (tables/memfix.py's `need_bytes` took the activations with no method, as
if the fused head ran, and left out the fp32 logits of a plain head: 62.6 GiB at micro-batch 64 for pythia-1b), so
`predict --model pythia-1b --gpu h100 --count 8` could name fl+zero1 at micro-batch 64 where the model allows 32.
Checked over the whole catalog (config/models.yaml) x GPU types (config/gpus.yaml) x methods, by calling the
predictor (seconds), and once through the command."""

from __future__ import annotations

import json

import polars as pl
import pytest
from pretrain_planner.planning import memory
from pretrain_planner.planning.flops import train_flops_per_sample
from pretrain_planner.tables.memfix import FIX_METHODS
from pretrain_planner.tables.predictor import PUBLIC_METHODS, Prediction, Predictor, empty_cells

from .conftest import CATALOG

LAYOUTS = ((1, 1), (1, 8), (2, 8))  # (nodes, GPUs per node): one GPU, one node, two nodes (hsdp's case)
# every method a prediction may name: the sweep's defaults, the fused head (no fp32 logits), what public evidence is
# transferred to, and the memory-saving fixes (offload included)
METHODS = tuple(dict.fromkeys(("naive", "naive+ac", "fl", "fl+flce", "fl+ac+flce", *PUBLIC_METHODS, *FIX_METHODS)))
MEASURED_ON = "b200"  # the catalog's GPU type with the most memory: a micro-batch measured there may not fit others
GPUS = [g for g, spec in CATALOG.gpus.items() if spec.memory_gib]  # the memory model needs the GPU's memory


def allowed(p: Prediction) -> int | None:
    """The largest micro-batch the memory model lets p's method fit on p's setting (None: it cannot say)."""
    spec, g = CATALOG.model(p.model), CATALOG.gpu(p.gpu)
    per_rank = spec.recipe.global_batch // p.world_size
    return memory.predicted_micro_batch(spec, p.method, p.world_size, g.memory_gib, per_rank, nodes=p.nodes)


def contradictions(predictor: Predictor, layouts=LAYOUTS) -> list[str]:
    """Every prediction over the catalog x GPU types x `layouts` that names a micro-batch its memory model refuses."""
    out = []
    for model in CATALOG.models:
        for gpu in GPUS:
            for nodes, gpn in layouts:
                p = predictor.predict(model, gpu, nodes, gpn)
                if p.status != "predicted":
                    continue
                top = allowed(p)
                if p.micro_batch is None or p.micro_batch < 1 or (top is not None and p.micro_batch > top):
                    out.append(f"{model} on {nodes}x{gpn} {gpu}: {p.method} at micro-batch {p.micro_batch}, the "
                               f"memory model allows {top}")  # fmt: skip
    return out


def test_a_prediction_from_public_evidence_names_a_micro_batch_its_memory_model_allows():
    """A fresh install (no cells): the method each prediction assumes is at a micro-batch the memory model lets fit."""
    bad = contradictions(Predictor(empty_cells(), CATALOG))
    assert not bad, f"{len(bad)} predictions contradict the memory model, e.g. " + "; ".join(bad[:5])


def _measured(method: str, nodes: int) -> pl.DataFrame:
    """Every catalog model measured with `method` on `nodes` x 8 MEASURED_ON, at the largest micro-batch the memory
    model lets fit there (the whole per-GPU batch where it has no bound)."""
    g, world, rows = CATALOG.gpu(MEASURED_ON), nodes * 8, []
    for model, spec in CATALOG.models.items():
        peak, per_sample = g.peak_for(spec.recipe.precision, tf32=True), train_flops_per_sample(spec.to_dict())
        per_rank = spec.recipe.global_batch // world
        fit = memory.predicted_micro_batch(spec, method, world, g.memory_gib, per_rank, nodes=nodes)
        if not peak or not per_sample or not spec.recipe.steps or not per_rank or fit == 0:
            continue
        step = per_sample * spec.recipe.global_batch / (world * peak * 1e12 * 0.4)
        rows.append({"model": model, "gpu": MEASURED_ON, "nodes": nodes, "gpus_per_node": 8, "world_size": world,
                     "method": method, "status": "ok", "suspect": False, "valid": True, "step_time_s": step,
                     "micro_batch": fit or per_rank, "mfu": 0.4,
                     "training_days": spec.recipe.steps * step / 86400})  # fmt: skip
    return pl.DataFrame(rows)


@pytest.mark.parametrize("method", METHODS)
def test_a_measured_method_is_predicted_at_a_micro_batch_its_memory_model_allows(method):
    """Your cells of `method` at the micro-batch that fits a 192 GiB B200 are moved to every other GPU type: the
    micro-batch assumed there is the measured one only where the memory model lets it fit (hybrid sharding on two
    nodes, where it runs)."""
    nodes = 2 if "hsdp" in method else 1
    bad = contradictions(Predictor(_measured(method, nodes), CATALOG, public=None), layouts=((nodes, 8),))
    assert not bad, f"{len(bad)} predictions contradict the memory model, e.g. " + "; ".join(bad[:5])


def test_predict_names_the_micro_batch_the_memory_model_gives_its_method(capsys):
    """The issue's command, in process: the micro-batch named is the memory model's largest for the method named."""
    from pretrain_planner.cli import main

    argv = ["predict", "--model", "pythia-1b", "--gpu", "h100", "--count", "8", "--results", "/nonexistent", "--json"]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    p = Predictor(empty_cells(), CATALOG).predict("pythia-1b", "h100", 1, 8)
    assert (got["method"], got["micro_batch"]) == (p.method, p.micro_batch)
    assert got["micro_batch"] == allowed(p) and f"at micro-batch {got['micro_batch']};" in got["why"]
