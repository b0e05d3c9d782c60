"""Cost arithmetic against the "$100K" study's figures (Khandelwal et al. 2024, "Costs"; docs/methods.md quotes
them), and the Pareto front."""

from __future__ import annotations

import math

import pytest
import yaml
from pretrain_planner.planning.catalog import GpuSpec, load_catalog, load_gpus
from pretrain_planner.planning.configtypes import CostsSection
from pretrain_planner.schema import ConfigError, validate
from pretrain_planner.tables import costs, units

from .conftest import REPO

GPUS, BASE = load_gpus(REPO / "config/gpus.yaml")


def _price(gpu: str, count: int, days: float | None = None, nodes: int = 1, years: float = 5.0):
    return costs.price(GPUS.get(gpu), gpu, nodes, count // nodes, days, BASE, years, "config/gpus.yaml")


def test_study_prices():
    # hardware = base machine by GPU count + GPUs x price
    assert _price("a100", 4).hardware_usd == 83_500
    assert _price("h100", 4).hardware_usd == 127_500
    assert _price("rtx3090", 2).hardware_usd == 4_100
    assert _price("a6000", 8).hardware_usd == 10_500 + 8 * 4_800
    assert _price("a100", 1).hardware_usd == 20_000


def test_amortised_experiment_cost():
    # Pythia-1B: 4 x A100 for 17.57 days ~ $804; 4 x H100 for 8 days ~ $559 (five-year amortisation)
    p = _price("a100", 4, days=17.57)
    assert p.amortised_usd == pytest.approx(83_500 * 17.57 / (5 * 365))
    assert round(p.amortised_usd) == 804
    assert round(_price("h100", 4, days=8).amortised_usd) == 559
    assert _price("a100", 4, days=17.57, years=3).amortised_usd == pytest.approx(83_500 * 17.57 / (3 * 365))
    assert p.gpu_hours == pytest.approx(4 * 17.57 * 24)


def test_cloud_cost_when_a_rate_is_given():
    gpu = GpuSpec("x", "X", 80, {"bf16": 1}, True, True, True, price_usd=10_000, cloud_usd_per_gpu_hour=2.5)
    p = costs.price(gpu, "x", 1, 4, 10, BASE)
    assert p.cloud_usd == pytest.approx(2.5 * 4 * 10 * 24)
    assert p.hardware_usd == 7_500 + 40_000
    assert p.notes == []


def test_missing_prices_leave_blank_costs_with_a_reason():
    p = _price("h200", 4, days=10)
    assert p.hardware_usd is None and p.amortised_usd is None and p.cloud_usd is None
    assert "no price_usd for h200 in config/gpus.yaml" in p.note
    assert "no cloud_usd_per_gpu_hour for h200 in config/gpus.yaml" in p.note
    assert p.gpu_hours == pytest.approx(4 * 10 * 24)  # still known
    p = _price("a100", 3, days=10)
    assert p.hardware_usd is None
    assert "no base_machine_usd for 3 GPUs in config/gpus.yaml" in p.note
    p = costs.price(None, "tpu", 1, 4, 1.0, BASE)
    assert p.hardware_usd is None and "GPU type 'tpu' is not in config/gpus.yaml" in p.note
    p = _price("a100", 4, days=None)
    assert p.hardware_usd == 83_500 and p.amortised_usd is None and "no training days" in p.note
    assert _price("a100", 4, days=math.nan).amortised_usd is None


def test_several_nodes_buy_one_base_machine_each():
    p = _price("a100", 8, days=10, nodes=2)
    assert (p.nodes, p.gpus_per_node, p.world_size) == (2, 4, 8)
    assert p.hardware_usd == 2 * 7_500 + 8 * 19_000
    assert p.to_dict()["world_size"] == 8 and p.to_dict()["cost_note"] is not None


def test_pareto_mask_on_known_points():
    #        A        B       C (B beats)  D (A, B beat)  E         F (unknown)  G (= A)
    days = [1.0, 2.0, 3.0, 2.0, 10.0, None, 1.0, 5.0]
    cost = [100.0, 50.0, 60.0, 100.0, 10.0, 5.0, 100.0, math.nan]
    assert costs.pareto_mask(days, cost) == [True, True, False, False, True, False, True, False]
    assert costs.pareto_mask([], []) == []
    assert costs.pareto_mask([3.0], [7.0]) == [True]
    # same days, different cost: only the cheaper one
    assert costs.pareto_mask([2.0, 2.0], [9.0, 8.0]) == [False, True]


def test_pareto_by_group_is_per_model():
    keys = ["m1", "m1", "m2", "m2"]
    # m2's (2, 50) would dominate m1's (3, 60) if models were mixed
    assert costs.pareto_by_group(keys, [1.0, 3.0, 2.0, 4.0], [100.0, 60.0, 50.0, 70.0]) == [True, True, True, False]


def test_the_costs_sections_defaults_and_checks():
    """The typed section (planning/configtypes.CostsSection): the schema's defaults, a given key over them, and the
    schema's checks of a wrong axis or a non-positive amortisation, each naming the key."""
    assert CostsSection.given() == CostsSection(5, "hardware", {})
    assert costs.typed(None, "here") == CostsSection.given()
    assert CostsSection.given({"pareto_cost": "amortised"}).pareto_cost == "amortised"
    with pytest.raises(ConfigError, match="pareto_cost"):
        CostsSection.given({"pareto_cost": "cheapest"})
    with pytest.raises(ConfigError, match="amortisation_years"):
        CostsSection.given({"amortisation_years": 0})


def test_config_schema_costs_block():
    cfg = {"sweep": {"models": ["m"], "gpus": ["g"]}}
    validate(cfg, "config", "c.yaml")
    assert cfg["costs"] == {"amortisation_years": 5, "pareto_cost": "hardware", "prices": {}}
    with pytest.raises(ConfigError, match="costs"):
        validate({"sweep": {"models": ["m"], "gpus": ["g"]}, "costs": {"amortisation_years": -1}}, "config", "c")
    with pytest.raises(ConfigError, match="pareto_cost"):
        validate({"sweep": {"models": ["m"], "gpus": ["g"]}, "costs": {"pareto_cost": "x"}}, "config", "c")


def test_usd_formatting():
    assert units.usd(83_500) == "$83,500"
    assert units.usd(803.9) == "$804"
    assert units.usd(12.345) == "$12.35"
    assert units.usd(0.0004) == "<$0.01" and units.usd(0) == "$0.00"
    assert units.usd(None) == "-" and units.usd(math.nan) == "-"


def test_a_sweeps_own_prices_go_over_the_catalogs_with_their_note(tmp_path):
    """The config's costs.prices (the demo's NOMINAL price for the `cpu` stand-in) price a GPU type that the catalog
    leaves unpriced, every cost made with it says where the price comes from, and a GPU type the catalog does not
    know is named as an error."""
    catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    assert catalog.gpus["cpu"].price_usd is None
    demo = yaml.safe_load((REPO / "config/config.yaml").read_text())["costs"]["prices"]
    priced = catalog.with_prices(demo, "config/config.yaml")
    assert priced.gpus["cpu"].price_usd == demo["cpu"]["price_usd"] and priced.gpus["a100"] == catalog.gpus["a100"]
    p = costs.price(priced.gpus["cpu"], "cpu", 1, 2, 0.5, priced.base_machine_usd)
    assert p.hardware_usd == priced.base_machine_usd[2] + 2 * demo["cpu"]["price_usd"]
    assert "NOMINAL" in p.note and "config/config.yaml" in p.note
    with pytest.raises(ConfigError, match=r"my\.yaml: costs\.prices\.tpu: no GPU type 'tpu'"):
        catalog.with_prices({"tpu": {"price_usd": 1.0}}, "my.yaml")
