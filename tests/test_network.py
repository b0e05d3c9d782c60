"""The what-if on several nodes (issue 37): a step's communication crosses the nodes at the site's network, not at
the GPU link. The step model's arithmetic (a flat collective at the slower of the link and the job's share of a
node's network; hybrid sharding's inside / across split), the catalog's reference-system default and the site file's
value over it, and what a prediction says of where its network figure comes from."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml
from pretrain_planner.planning import stepmodel
from pretrain_planner.planning.catalog import load_catalog
from pretrain_planner.planning.flops import param_count
from pretrain_planner.tables import predictor

from .conftest import CATALOG, REPO

P = 1e9
LINK = 300e9  # A100 NVLink 3 per direction
NET = 25e9  # 200 Gb/s per GPU


def test_a_flat_collective_crosses_nodes_at_the_nodes_network():
    """DDP on 2 x 8 A100: the ring leaves a node once per ring, so the node's 8 x 25 GB/s carry what a rank sends,
    slower than NVLink's 300; on one node the link alone; a network faster than the link does not speed it up."""
    f = stepmodel.of_method("fl", 4, 4, 16)
    volume = stepmodel.sync_bytes(f, P, 16)
    assert stepmodel.comm_seconds(f, P, 2, 8, LINK, NET) == pytest.approx(volume / 200e9)
    assert stepmodel.comm_seconds(f, P, 1, 16, LINK, None) == pytest.approx(volume / LINK)
    assert stepmodel.comm_seconds(f, P, 2, 8, LINK, 1e12) == pytest.approx(volume / LINK)
    # two GPUs of a node share its network as two NICs: a quarter of eight's
    f2 = stepmodel.of_method("fl", 4, 4, 4)
    assert stepmodel.comm_seconds(f2, P, 2, 2, LINK, NET) == pytest.approx(stepmodel.sync_bytes(f2, P, 4) / (2 * NET))


def test_hybrid_sharding_sends_each_nodes_gradients_across_once():
    """hsdp on 2 x 8: the 1.5x full-shard volume over NVLink inside a node, and one all-reduce of the node's gradients
    across the two nodes (2 (n - 1) / n = 1 x the gradient bytes) over the network: on a slow network less than a
    flat fsdp-full, whose 1.5x all cross it."""
    f = stepmodel.of_method("fl+hsdp", 4, 4, 16)
    assert f.hybrid and f.syncs == pytest.approx(1.5)
    inside = 1.5 * stepmodel.allreduce_bytes(P, 8) / LINK
    across = stepmodel.allreduce_bytes(P, 2) / (8 * NET)
    assert stepmodel.comm_seconds(f, P, 2, 8, LINK, NET) == pytest.approx(inside + across)
    flat = stepmodel.of_method("fl+fsdp-full", 4, 4, 16)
    # at the DGX's network about even; at one 200 Gb/s NIC for 8 GPUs (3.125 GB/s per GPU) under half the flat's
    assert stepmodel.comm_seconds(f, P, 2, 8, LINK, NET) < stepmodel.comm_seconds(flat, P, 2, 8, LINK, NET)
    slow = 200 / 8 / 8 * 1e9
    assert stepmodel.comm_seconds(f, P, 2, 8, LINK, slow) < stepmodel.comm_seconds(flat, P, 2, 8, LINK, slow) / 2


def _catalog_with_a100_network(gbit: float | None):
    cat = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    return replace(cat, gpus={**cat.gpus, "a100": replace(cat.gpus["a100"], inter_node_gbit_s=gbit)})


@pytest.mark.slow  # several fits of the cross-GPU model to the public evidence (seconds each)
def test_a_slow_network_costs_days_and_hybrid_sharding_wins_it_back():
    """pythia-1b on 2 x 8 A100 from public evidence: at the DGX A100 default (200 Gb/s per GPU, config/gpus.yaml)
    communication is a few percent of the step; at a university node's 25 Gb/s per GPU (one 200 Gb/s NIC for 8) it
    takes a large share. On 4 x 8, with no gradient accumulation at the memory model's micro-batch, hybrid sharding
    (a node's gradient shards cross the network) is the method chosen there, and beats the flat all-reduce; one
    node's prediction does not read the network at all. (On 2 x 8 a micro-batch of 32, fp32 logits included, leaves
    two micro-batches per step, and hybrid sharding reduces its gradients at each: plain data parallelism wins.)"""
    default = predictor.Predictor(predictor.empty_cells(), CATALOG).predict("pythia-1b", "a100", 2, 8)
    assert CATALOG.gpus["a100"].inter_node_gbit_s == 200
    assert default.status == "predicted" and default.comm_share < 0.05, default
    assert "network 200 Gb/s per GPU to other nodes" in default.note and "reference system" in default.note
    slow_cat = _catalog_with_a100_network(25.0)
    slow = predictor.Predictor(predictor.empty_cells(), slow_cat)
    got = slow.predict("pythia-1b", "a100", 2, 8)
    assert got.days_central > default.days_central and got.comm_share > 2 * default.comm_share, (got, default)
    four = slow.predict("pythia-1b", "a100", 4, 8)
    assert four.method.endswith("hsdp"), four.method
    assert (
        not predictor.Predictor(predictor.empty_cells(), CATALOG)
        .predict("pythia-1b", "a100", 4, 8)
        .method.endswith("hsdp")
    )
    flat = slow._step(CATALOG.model("pythia-1b"), "fl", "a100", 32, four.micro_batch or 1,
                      slow.public_by_model["pythia-1b"], [], 4)  # fmt: skip
    assert flat.seconds[1] > four.days_central * 86400 / CATALOG.model("pythia-1b").recipe.steps
    one = predictor.Predictor(predictor.empty_cells(), slow_cat).predict("pythia-1b", "a100", 1, 8)
    assert one.days_central == pytest.approx(
        predictor.Predictor(predictor.empty_cells(), CATALOG).predict("pythia-1b", "a100", 1, 8).days_central
    )
    assert "network" not in one.note


@pytest.mark.slow  # several fits of the cross-GPU model to the public evidence (seconds each)
def test_an_unknown_network_widens_the_band_and_says_so():
    """A100 with no inter_node_gbit_s: the pessimistic end of 2 x 8 runs its all-reduce at 5 GB/s (Ethernet class),
    the optimistic at the GPU link; the note names the key to set."""
    known = predictor.Predictor(predictor.empty_cells(), CATALOG).predict("pythia-1b", "a100", 2, 8)
    blind = predictor.Predictor(predictor.empty_cells(), _catalog_with_a100_network(None))
    unknown = blind.predict("pythia-1b", "a100", 2, 8)
    assert unknown.days_pessimistic > known.days_pessimistic
    assert unknown.days_optimistic <= known.days_optimistic
    assert "network to other nodes unknown (no inter_node_gbit_s for a100" in unknown.note


@pytest.mark.slow  # several fits of the cross-GPU model to the public evidence (seconds each)
def test_the_site_files_network_wins_over_the_reference_system(tmp_path):
    """A site file's gpus.a100.inter_node_gbit_s reaches the sweep's catalog (the what-if rule's) and the CLI's; a
    GPU type it does not set keeps config/gpus.yaml's default."""
    from pretrain_planner.cli.config import config_catalog
    from pretrain_planner.facade.pipeline import load

    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"gpus": {"a100": {"partition": "gpu", "inter_node_gbit_s": 50},
                                             "h100": {"partition": "h"}, "cpu": {"gpu_request": "none"}}}))  # fmt: skip
    config = {"sweep": {"models": ["tiny-gptneox"], "gpus": ["cpu"], "methods": ["naive"]},
              "launcher": {"kind": "slurm", "site": str(site)}}  # fmt: skip
    pipeline = load(config, REPO)
    for catalog in (pipeline.catalog, config_catalog(pipeline.config)):
        a100 = catalog.gpus["a100"]
        assert a100.inter_node_gbit_s == 50 and str(site) in a100.network_note
        assert catalog.gpus["h100"].inter_node_gbit_s == 400 and catalog.gpus["h100"].network_note is None
    p = predictor.Predictor(predictor.empty_cells(), pipeline.catalog).predict("pythia-1b", "a100", 2, 8)
    assert f"network 50 Gb/s per GPU to other nodes (inter_node_gbit_s from {site}" in p.note
    assert param_count(CATALOG.model("pythia-1b").to_dict())  # the model the prediction moved


def test_a_bad_network_value_names_the_key(tmp_path):
    from pretrain_planner.planning.site import read_site
    from pretrain_planner.schema import ConfigError

    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"gpus": {"a100": {"inter_node_gbit_s": 0}}}))
    with pytest.raises(ConfigError, match="gpus.a100.inter_node_gbit_s"):
        read_site(site)
