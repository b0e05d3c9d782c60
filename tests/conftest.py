"""Shared helpers: run the real Snakemake CLI on temporary sweeps against this repository's Snakefile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
