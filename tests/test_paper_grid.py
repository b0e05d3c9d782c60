"""config/paper.yaml reproduces the "$100K or 100 Days" grid (Khandelwal et al. 2024) and plans offline in
seconds, without torch: 9 models x 4 GPU types x 1/2/4/8 GPUs x 25 methods = 3,600 cells, of which the
study's validity rules leave 2,952 (the study: "about 2,950 settings benchmarked")."""

from __future__ import annotations

import collections
import time

import pytest

from .conftest import REPO, snakemake

# The study's models (its scripts/plotting/training_time_tables.py), by our catalog names.
STUDY_MODELS = [
    "pythia-160m", "pythia-410m", "pythia-1b", "pythia-2.8b", "pythia-6.9b",
    "roberta-large", "mamba-2.8b", "convnext-xlarge-22k", "vit-large-in21k",
]  # fmt: skip
STUDY_GPUS = ["rtx3090", "a6000", "a100", "h100"]
SHARDINGS = ["zero1", "zero2", "zero3", "fsdp-grad", "fsdp-full"]


def test_the_study_sweep(paper):
    sweep = paper.config["sweep"]
    assert sweep["models"] == STUDY_MODELS
    assert sweep["gpus"] == STUDY_GPUS
    assert (sweep["nodes"], sweep["gpus_per_node"]) == ([1], [1, 2, 4, 8])
    methods = set(sweep["methods"])
    expected = {"naive"} | {
        "+".join(["fl"] + (["ac"] if ac else []) + ([s] if s else []) + (["off"] if off else []))
        for ac in (False, True)
        for s in [None, *SHARDINGS]
        for off in (False, True)
    }
    assert methods == expected and len(sweep["methods"]) == 25
    assert paper.config["launcher"]["kind"] == "slurm"
    assert set(paper.site.gpus) == set(STUDY_GPUS)
    # the CPU default's cap must not leak into the study's micro-batch search
    assert paper.config["benchmark"]["max_micro_batch"] is None


def test_valid_cells_match_the_study(paper):
    planned = paper.planned
    assert len(planned) == 9 * 4 * 4 * 25
    valid = [p for p in planned if p.valid]
    assert len(valid) == 2952  # Khandelwal et al. 2024: "about 2,950 settings benchmarked"
    per_count = collections.Counter(p.cell.gpus_per_node for p in valid)
    # per model and GPU type: 13 methods on 1 GPU, 23 on 2/4/8 GPUs
    assert per_count == {1: 13 * 36, 2: 23 * 36, 4: 23 * 36, 8: 23 * 36}
    reasons = collections.Counter(p.reason.split(" (")[0].split(":")[0] for p in planned if not p.valid)
    assert reasons == {
        "offload needs a sharding method": 2 * 4 * 36,  # fl+off, fl+ac+off at every count
        **{f"{s} shards across GPUs": 2 * 36 for s in SHARDINGS},  # without offload, on 1 GPU
    }
    # every model can checkpoint (ConvNeXt through the builder), as in the study
    assert all(paper.catalog.model(m).supports_checkpointing for m in STUDY_MODELS)


@pytest.mark.slow  # Snakemake's dry run of the study's grid, in a subprocess: not in the everyday subset
def test_paper_dry_run_is_fast_and_imports_no_torch(tmp_path):
    blocker = tmp_path / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('torch was imported while planning')\n")
    t0 = time.perf_counter()
    proc = snakemake(
        tmp_path,
        "-n",
        "--cores",
        "2",
        "--configfile",
        str(REPO / "config/paper.yaml"),
        env={"PYTHONPATH": str(tmp_path / "blocker")},
    )
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pretrain-planner plan: 2952 cells to run, 648 invalid" in proc.stderr
    assert "launcher slurm" in proc.stderr
    assert "benchmark_cell" in proc.stdout
    assert not (tmp_path / "results/cells").exists()
    assert elapsed < 90, elapsed  # seconds, not minutes
