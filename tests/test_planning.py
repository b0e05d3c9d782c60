"""Planning is offline and instant: bad input fails the dry run with a clear message, nothing is
submitted, and a large sweep plans without importing torch."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from .conftest import REPO, snakemake, write_config

SMALL = {"models": ["tiny-gptneox"], "gpus": ["cpu"], "gpus_per_node": [1, 2], "methods": ["naive"]}


def _dry(work, cfg, env=None):
    return snakemake(work, "-n", "--cores", "2", "--configfile", str(cfg), env=env)


def _assert_refused(proc, work, *needles):
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert "configuration error" in out, out[-2000:]
    for needle in needles:
        assert needle in out, (needle, out[-2000:])
    assert not (work / "results/cells").exists()  # nothing was submitted
    assert "Traceback" not in out


@pytest.mark.slow  # Snakemake's dry run in a subprocess
def test_malformed_models_yaml(tmp_path):
    models = yaml.safe_load((REPO / "config/models.yaml").read_text())
    models["models"]["tiny-gptneox"]["recipe"]["global_batch"] = "lots"
    bad = tmp_path / "models.yaml"
    bad.write_text(yaml.safe_dump(models))
    cfg = write_config(tmp_path / "c.yaml", catalog={"models": str(bad)}, sweep=SMALL)
    _assert_refused(_dry(tmp_path, cfg), tmp_path, str(bad), "models.tiny-gptneox.recipe.global_batch", "'lots'")


@pytest.mark.slow  # Snakemake's dry run in a subprocess
def test_broken_yaml_syntax(tmp_path):
    bad = tmp_path / "gpus.yaml"
    bad.write_text("gpus:\n  cpu: {name: x\n")
    cfg = write_config(tmp_path / "c.yaml", catalog={"gpus": str(bad)}, sweep=SMALL)
    _assert_refused(_dry(tmp_path, cfg), tmp_path, str(bad), "not valid YAML")


@pytest.mark.slow  # Snakemake's dry run in a subprocess
def test_unknown_gpu_in_sweep(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", sweep={**SMALL, "gpus": ["cpu", "tpu"]})
    _assert_refused(_dry(tmp_path, cfg), tmp_path, "sweep.gpus[1]", "'tpu'", "gpus.yaml", "a100")


@pytest.mark.slow  # Snakemake's dry run in a subprocess
def test_unknown_config_key_and_bad_value(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", sweep=SMALL, benchmark={"timed_step": 3, "warmup_steps": -1})
    _assert_refused(_dry(tmp_path, cfg), tmp_path, "c.yaml", "benchmark", "'timed_step' was unexpected", "timed_steps")


@pytest.mark.slow  # Snakemake's dry run in a subprocess
def test_non_power_of_two_per_rank_batch(tmp_path):
    models = yaml.safe_load((REPO / "config/models.yaml").read_text())
    models["models"]["tiny-gptneox"]["recipe"]["global_batch"] = 24
    bad = tmp_path / "models.yaml"
    bad.write_text(yaml.safe_dump(models))
    cfg = write_config(tmp_path / "c.yaml", catalog={"models": str(bad)}, sweep=SMALL)
    _assert_refused(_dry(tmp_path, cfg), tmp_path, "tiny-gptneox", "global_batch=24", "not a power of two")


@pytest.mark.slow  # Snakemake's dry run of a large grid, in a subprocess: not in the everyday subset
def test_large_dry_run_is_fast_and_imports_no_torch(tmp_path):
    blocker = tmp_path / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('torch was imported while planning')\n")
    models = [m for m in yaml.safe_load((REPO / "config/models.yaml").read_text())["models"]]
    sweep = {
        "models": models,
        "gpus": ["rtx3090", "a6000", "a100", "h100", "h200", "l40s", "v100"],
        "nodes": [1, 2],
        "gpus_per_node": [1, 2, 4, 8],
        "methods": ["naive", "fl", "fl+ac"],
    }
    cells = len(models) * 7 * 2 * 4 * 3
    assert cells >= 2000
    site = write_config(
        tmp_path / "site.yaml", gpus={g: {"partition": f"p-{g}", "gres_type": g} for g in sweep["gpus"]}
    )
    cfg = write_config(tmp_path / "c.yaml", sweep=sweep, launcher={"kind": "slurm", "site": str(site)})
    t0 = time.perf_counter()
    proc = _dry(tmp_path, cfg, env={"PYTHONPATH": str(tmp_path / "blocker")})
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "benchmark_cell" in proc.stdout
    assert elapsed < 90, elapsed  # seconds, not minutes (about 5 s on 2 cores)


def test_planning_modules_import_no_torch():
    code = (
        "import sys\n"
        "import pretrain_planner.facade.pipeline, pretrain_planner.planning.grid, pretrain_planner.planning.catalog\n"
        "import pretrain_planner.launch.executor, pretrain_planner.launch.cell, pretrain_planner.launch.rankjob\n"
        "import pretrain_planner.tables.aggregate, pretrain_planner.report.plots, pretrain_planner.report.document\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _fake_slurm(tmp_path):
    """sbatch, sacct ... that record being called and fail: planning must not touch SLURM."""
    fake = tmp_path / "fake-slurm"
    fake.mkdir()
    marker = tmp_path / "slurm-was-called"
    for name in ("sbatch", "sacct", "squeue", "scontrol", "sinfo", "srun", "scancel", "salloc"):
        tool = fake / name
        tool.write_text(f"#!/bin/sh\necho {name} >> {marker}\nexit 1\n")
        tool.chmod(0o755)
    return fake, marker


@pytest.mark.slow  # Snakemake's dry run in a subprocess
def test_slurm_dry_run_is_offline(tmp_path):
    """`snakemake -n --profile cluster/slurm` plans with SLURM unreachable and torch unimportable."""
    import os

    fake, marker = _fake_slurm(tmp_path)
    blocker = tmp_path / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('torch was imported while planning')\n")
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "PYTHONPATH": str(tmp_path / "blocker")}
    proc = snakemake(tmp_path, "-n", "--profile", str(REPO / "cluster/slurm"), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not marker.exists(), marker.read_text()
    # the plan summary: cells per partition, GPUs per cell, time limit, GPU-hour upper bound
    assert "launcher slurm" in proc.stderr
    assert "partition (default): 12 cells, 1-2 GPUs per cell, time limit 30 min" in proc.stderr
    assert "at most 9.0 GPU-hours" in proc.stderr


@pytest.mark.slow  # Snakemake's dry run in a subprocess
def test_unmapped_gpu_type_fails_the_slurm_dry_run(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", sweep={**SMALL, "gpus": ["cpu", "v100"]}, launcher={"kind": "slurm"})
    proc = snakemake(tmp_path, "-n", "--cores", "2", "--configfile", str(cfg))
    _assert_refused(proc, tmp_path, "cluster/slurm/site.yaml", "'v100'", "sweep.gpus", "partition")


@pytest.mark.slow  # Snakemake in a subprocess
def test_the_workflow_is_lint_clean():
    """`snakemake --lint` finds nothing: every rule logs, calls one function of the package with short `run:` blocks
    (the aggregate and calendar rules' calls were long enough for its 'long run directive' lint)."""
    out = subprocess.run([str(REPO / ".venv/bin/snakemake"), "--lint", "--profile", "cluster/local"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Lints for" not in out.stdout + out.stderr, (out.stdout + out.stderr)[-4000:]
