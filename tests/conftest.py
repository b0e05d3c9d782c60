"""Shared helpers: run the real Snakemake CLI on temporary sweeps against this repository's Snakefile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# The smallest GPT-NeoX the catalog accepts: shared by the catalog and grid unit tests.
TINY_GPTNEOX_ARCH = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "vocab_size": 64,
    "intermediate_size": 64,
}
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def snakemake(workdir: Path, *args: str, env: dict | None = None, timeout: int = 1200) -> subprocess.CompletedProcess:
    """`snakemake -s <repo>/Snakefile -d <workdir> ...`, output captured."""
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=full_env, timeout=timeout)


def write_config(path: Path, **sections) -> Path:
    path.write_text(yaml.safe_dump(sections, sort_keys=False))
    return path


@pytest.fixture
def repo() -> Path:
    return REPO


def _slurm_healthy() -> bool:
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "UP" in out.stdout


@pytest.fixture(scope="session")
def slurm_cluster():
    """The live single-host SLURM of cluster/testbed: started if it is not running (needs root)."""
    import shutil

    if shutil.which("slurmctld") is None or shutil.which("sbatch") is None:
        pytest.skip("SLURM is not installed: run `bash envs/setup.sh test` (installs cluster/testbed packages)")
    if not _slurm_healthy() and os.geteuid() != 0:
        pytest.skip("the SLURM testbed is down and starting it needs root: bash cluster/testbed/slurm-up.sh")
    # idempotent: a no-op (~0.2 s) on a healthy cluster, a fresh cluster otherwise
    proc = subprocess.run(["bash", str(REPO / "cluster/testbed/slurm-up.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return True
