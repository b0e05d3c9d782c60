"""Hybrid sharding (issue 37): `hsdp` is full sharding among a node's GPUs, one replica per node. Its validity (2 or
more nodes of 2 or more GPUs), its memory (a node's GPUs divide the states), its settings (the 2-D mesh the trainer
builds) and its export (what the Hugging Face Trainer cannot express). The run itself is on the SLURM testbed's two
nodes (tests/test_slurm.py)."""

from __future__ import annotations

import pytest
from pretrain_planner.planning import grid, methods
from pretrain_planner.planning.memory import model_states
from pretrain_planner.planning.runspec import RunSpec
from pretrain_planner.planning.settings import resolve
from pretrain_planner.tables import export

from .conftest import CATALOG

MODEL, GPU = CATALOG.models["pythia-1b"], CATALOG.gpus["a100"]


@pytest.mark.parametrize(("nodes", "gpn", "valid"), [(1, 8, False), (2, 1, False), (2, 2, True), (4, 8, True)])
def test_hybrid_sharding_needs_several_nodes_of_several_gpus(nodes, gpn, valid):
    cell = grid.Cell("pythia-1b", "a100", nodes, gpn, "fl+hsdp")
    why = grid.invalid_reason(cell, MODEL, GPU, "slurm", CATALOG)
    assert (why is None) == valid, why
    if not valid:
        assert "hsdp shards among a node's GPUs and replicates across nodes" in why
        assert f"here {nodes} x {gpn}" in why


def test_a_nodes_gpus_divide_its_states_not_every_gpu():
    """On 4 nodes x 2 GPUs a rank holds what fsdp-full holds on 2 GPUs (its node's), more than on 8; with the node
    count unknown the bound divides by every rank (still a lower bound)."""
    p = 1e9
    hsdp = model_states("hsdp", False, p, 8, "bf16", nodes=4)
    assert hsdp == model_states("fsdp-full", False, p, 2, "bf16")
    assert hsdp.peak > model_states("fsdp-full", False, p, 8, "bf16").peak
    assert model_states("hsdp", False, p, 8, "bf16") == model_states("fsdp-full", False, p, 8, "bf16")
    assert methods.parse("fl+hsdp").sharding == "hsdp" and methods.SHARDING_LEVEL["hsdp"] == 3


def test_the_settings_carry_the_mesh_and_the_export_says_what_the_trainer_cannot():
    spec = RunSpec(MODEL, GPU, methods.parse("fl+hsdp"), 8, nodes=2)
    s = resolve(spec, 4, 8)
    assert s.parallel == "fsdp2" and s.fsdp_policy["reshard_after_forward"] is True
    assert s.fsdp_policy["mesh"] == {"replicate": 2, "shard": 4}
    assert resolve(RunSpec(MODEL, GPU, methods.parse("fl+fsdp-full"), 8, nodes=2), 4, 8).fsdp_policy["mesh"] is None
    row = {"nodes": 2, "gpus_per_node": 4, "best_method": "fl+hsdp", "micro_batch": 4, "grad_accum_steps": 8}
    settings = export.settings_for(MODEL, GPU, row)
    assert settings["fsdp_policy"]["mesh"] == {"replicate": 2, "shard": 4}
    parts = {n["part"]: n["reason"] for n in export.not_expressible(MODEL, settings)}
    assert "ParallelismConfig(dp_replicate_size=2, dp_shard_size=4)" in parts["hsdp"]
