"""Shared helpers: run the real Snakemake CLI on temporary sweeps against this repository's Snakefile."""

from __future__ import annotations

import math
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


def snakemake(
    workdir: Path, *args: str, env: dict | None = None, timeout: int = 1200, snakefile: Path = REPO / "Snakefile"
) -> subprocess.CompletedProcess:
    """`snakemake -s <repo>/Snakefile -d <workdir> ...` (or another `snakefile`), output captured."""
    cmd = [str(BIN / "snakemake"), "-s", str(snakefile), "-d", str(workdir), *args]
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=full_env, timeout=timeout)


def budget_workflow(work: Path, budget: dict, launcher: str, steps: int, **train) -> Path:
    """The `budget` target of a Snakefile of our own that includes common.smk and pretrain.smk (not the benchmark
    rules), with `budget` as work/config/budget.yaml and the main config's launcher kind `launcher`; `steps` steps
    on the fake clock (1 s each, training time: exact, where a wall clock would count start-up too), validation
    half-way and at the end, `train` keys over the file's. Returns the results folder."""
    budget["train"].update(budget_hours=steps / 3600, fake_step_s=1.0, clock="train", **train)
    budget["train"]["validation"].update(every=0.5, dense_first=0.0, dense_last=0.0)
    (work / "Snakefile").write_text(
        f'configfile: "main.yaml"\n\n\ninclude: "{REPO}/workflow/rules/common.smk"\n'
        f'include: "{REPO}/workflow/rules/pretrain.smk"\n'
    )
    main = {"catalog": {"models": str(REPO / "config/models.yaml"), "gpus": str(REPO / "config/gpus.yaml")},
            "sweep": {"models": ["tiny-bert"], "gpus": ["cpu"]}, "launcher": {"kind": launcher}}  # fmt: skip
    (work / "main.yaml").write_text(yaml.safe_dump(main))
    (work / "config").mkdir(exist_ok=True)
    (work / "config/budget.yaml").write_text(yaml.safe_dump(budget))
    proc = snakemake(work, "--cores", "2", "--force-use-threads", "budget", timeout=900, snakefile=work / "Snakefile")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return work / "results"


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


@pytest.fixture(scope="session")
def step_s() -> float:
    """Seconds per benchmark step of tiny-gptneox (micro-batch 4 x 4, one thread) measured on this machine, once: a
    test that needs a run to last (to catch it running, to outlast a time limit) asks `steps_lasting(s, step_s)`
    steps, so it lasts as long on a fast CPU as on a slow one."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from multirank import run_ranks

    (rank,) = run_ranks("tests.rank_workers:tiny_step_time", 1, {"model": "tiny-gptneox"}, 300)
    assert rank["returncode"] == 0 and not rank["timed_out"], (rank.get("error"), rank["stderr"][-3000:])
    return float(rank["result"]["step_s"])


def steps_lasting(seconds: float, step_s: float) -> int:
    """Timed steps for a run of about `seconds` at `step_s` per step (a cell's start-up comes on top)."""
    return max(10, math.ceil(seconds / step_s))
