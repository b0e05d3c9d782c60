"""Issue 40 (1): the adaptive search's time model uses the evidence (shipped, imported and the sweep's own rows) where
the setting has nothing of its own: a method family none of whose cells has a time (its probe ran out of memory) is
ordered by the evidence's seconds per sample for the model on the GPU type, and each round says what that rested on.
Pruning keeps the MFU ceiling (benchmarks/results/search_evidence.md measures why)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pretrain_planner import layout, search
from pretrain_planner.facade.pipeline import load
from pretrain_planner.planning import evidence_exchange as ex
from pretrain_planner.planning.evidence_prior import EvidencePrior
from pretrain_planner.results import write_result
from pretrain_planner.search import Observation
from snakemake.utils import update_config

from .conftest import CATALOG, REPO, cell_result

FOLDER = "pythia-2.8b/a100/1x2"  # both probes out of memory: only memory-saving methods of one family remain


@pytest.fixture(scope="module")
def setting() -> search.Setting:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(config, yaml.safe_load((REPO / "config/paper.yaml").read_text()))
    config["search"] = {"strategy": "adaptive"}
    return load(config, REPO, "config/paper.yaml").settings[FOLDER]


def _probes_oom(st: search.Setting) -> dict[str, Observation]:
    return {m: Observation("oom") for m in st.methods if search.shape(m).is_probe}


class Fixed:
    """Evidence that says one number (a timemodel.Prior, as an input: the search's reading of it is under test)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def seconds_per_sample(self, family: str) -> tuple[float | None, str]:
        return self.seconds, f"{self.seconds} s per sample, said by the test"


def test_an_untimed_family_is_ordered_by_what_the_evidence_says(setting):
    """Slow compute makes checkpointing's extra forward the larger cost, fast compute offload's CPU optimizer: the
    first candidate measured follows the evidence (the old fixed guess could only ever pick one)."""
    seen = _probes_oom(setting)
    fast = search.decide(setting, seen, Fixed(0.2))
    slow = search.decide(setting, seen, Fixed(0.6))
    assert fast.run == ["fl+ac"], fast.run
    assert slow.run and slow.run != fast.run and "+ac" not in slow.run[0], slow.run
    assert fast.order == {"fl": "the evidence: 0.2 s per sample, said by the test"}
    # nothing pruned on it: the evidence orders, the MFU ceiling prunes
    assert fast.pruned == slow.pruned == search.decide(setting, seen).pruned


def test_without_evidence_the_round_says_it_guessed(setting):
    d = search.decide(setting, _probes_oom(setting))
    assert d.run == ["fl+ac"]
    assert d.order["fl"].startswith("50% of the MFU ceiling, a guess (no evidence was given)"), d.order
    faster_than_possible = search.decide(setting, _probes_oom(setting), Fixed(1e-9))
    assert "the MFU ceiling's" in faster_than_possible.order["fl"], faster_than_possible.order


def test_a_timed_family_is_not_ordered_by_the_evidence(setting):
    seen = {**_probes_oom(setting), "fl+ac": Observation("ok", 2, 40.0, 70.0, "cuda_max_allocated", 1.0)}
    assert search.decide(setting, seen, Fixed(1.0)).order == {}


def _own_cell(results: Path, gpu: str, mfu: float) -> dict:
    """pythia-2.8b fl on 1 x `gpu` at `mfu` of its dense peak, written where the sweep writes it."""
    spec = CATALOG.models["pythia-2.8b"]
    probe = cell_result("pythia-2.8b", gpu, 1, 1, "fl", "ok", 1.0)
    step = probe["flops_per_step"] / (mfu * probe["peak_tflops"] * 1e12)
    r = cell_result("pythia-2.8b", gpu, 1, 1, "fl", "ok", step * spec.recipe.steps / 86400, mb=2)
    write_result(layout.cell_file(results, layout.setting_folder("pythia-2.8b", gpu, 1, 1), "fl"), r)
    return r


def test_the_evidence_is_shipped_imported_and_own_rows_each_named(tmp_path):
    shipped = EvidencePrior(CATALOG, "pythia-2.8b", "a100")
    base, why = shipped.seconds_per_sample("fl")
    assert base and "shipped" in why and "r0031" in why and "mean |error|" in why, why  # a stand-in: pythia-1b's rows
    results = tmp_path / "results"
    _own_cell(results, "h100", 0.10)  # the sweep's own cell of the model itself, far slower than the stand-in says
    own = EvidencePrior(CATALOG, "pythia-2.8b", "a100", results)
    slower, why = own.seconds_per_sample("fl")
    assert "1 own" in why and "pythia-2.8b/h100/1x1/fl" in why and "r0031" not in why, why
    assert slower > 2 * base
    # another site's cells, exported and imported into the evidence folder, join the basis
    other = tmp_path / "other"
    row = _own_cell(other, "h200", 0.40)
    rows, _left = ex.export_rows([row], CATALOG, "lab-b", commit="abc", today="2026-12-06")
    (tmp_path / "b.csv").write_text(ex.csv_text(rows))
    folder = tmp_path / "evidence"
    ex.import_files([tmp_path / "b.csv"], CATALOG, folder)
    both, why = EvidencePrior(CATALOG, "pythia-2.8b", "a100", results, folder).seconds_per_sample("fl")
    assert "1 imported + 1 own" in why and "lab-b:" in why, why
    assert base < both < slower


def test_an_unreadable_evidence_folder_leaves_the_guess_and_says_why(setting, tmp_path):
    (tmp_path / ex.IMPORTED_CSV).write_text("not,an,evidence,file\n1,2,3,4\n")
    d = search.decide(setting, _probes_oom(setting), EvidencePrior(CATALOG, "pythia-2.8b", "a100", None, tmp_path))
    assert d.run == ["fl+ac"]
    assert "a guess (the evidence could not be read: " in d.order["fl"] and ex.IMPORTED_CSV in d.order["fl"], d.order


def test_no_evidence_for_a_gpu_type_without_rates():
    value, why = EvidencePrior(CATALOG, "tiny-gptneox", "cpu").seconds_per_sample("fl")
    assert value is None and "cpu has no matmul rate" in why


def test_a_round_records_what_its_order_rested_on(setting, tmp_path):
    results = tmp_path / "results"
    for m in _probes_oom(setting):
        write_result(layout.cell_file(results, FOLDER, m), cell_result("pythia-2.8b", "a100", 1, 2, m, "oom"))
    search_dir = Path(layout.search_dir(results, FOLDER))
    first = search.write_round(setting, 0, {}, str(results), str(search_dir / "round0.json"))
    assert sorted(first["run"]) == ["fl", "naive"] and first["order"] == {}
    prior = EvidencePrior(CATALOG, "pythia-2.8b", "a100", results)
    log = search_dir / "round1.log"
    data = search.write_round(setting, 1, {"previous": str(search_dir / "round0.json")}, str(results),
                              str(search_dir / "round1.json"), str(log), prior)  # fmt: skip
    assert data["run"] and "r0031" in data["order"]["fl"], data["order"]
    assert json.loads((search_dir / "round1.json").read_text())["order"] == data["order"]
    assert "ORDER fl (no measured cell): the evidence: " in log.read_text()
