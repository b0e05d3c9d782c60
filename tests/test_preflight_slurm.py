"""The preflight on the SLURM testbed (issue 52): one short job per GPU type before its first cell, in the site's
environment. A site whose `python` has no torch, or does not exist, or lacks CUDA for cells that ask for it, is
stopped in under a minute with one message naming the site key, and no cell is submitted; `pretrain-planner
preflight` alone, with the testbed's task plugin set to bind (task/affinity) and a stranger's job on the node, finds
the one core the job was bound to and the other job; a site that gives fewer cores than `cpus_per_gpu` is stopped.
The passed preflight of a sweep that measures (and what its cells record): tests/test_slurm.py."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from .conftest import (
    BIN,
    PROFILE,
    SITE,
    bench,
    last_job_id,
    login_env,
    sacct,
    slurm_conf,
    snakemake,
    wait_for,
    write_config,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SWEEP = {"models": ["tiny-gptneox"], "gpus": ["a100"], "methods": ["naive"], "gpus_per_node": [1]}
STOPPED = "no cell of a100 submitted"


def _config(work: Path, device: str = "cpu", **defaults) -> Path:
    """A one-cell sweep on a100 through a copy of the testbed's site file with `defaults` over its defaults."""
    site = yaml.safe_load(Path(SITE).read_text())
    site["defaults"].update(defaults)
    path = work / "site.yaml"
    path.write_text(yaml.safe_dump(site, sort_keys=False))
    return write_config(work / "c.yaml", sweep=SWEEP, launcher={"kind": "slurm", "site": str(path)},
                        benchmark={**bench(2), "device": device})  # fmt: skip


def _stopped(work: Path, proc: subprocess.CompletedProcess, took: float, since: int) -> str:
    """The sweep was stopped by a100's preflight: within a minute, one message, no cell submitted or measured;
    returns the message."""
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert took < 60, f"the preflight took {took:.0f} s to stop the sweep"
    messages = [ln for ln in proc.stderr.splitlines() if STOPPED in ln]
    assert len(messages) == 1, proc.stderr[-4000:]
    assert not (work / "results/cells").exists()
    assert not [j for j in sacct(since) if j["JobName"].startswith("pp-tiny")], "a cell's job was submitted"
    job = json.loads((work / "results/site/preflight/a100/slurm_job.json").read_text())["job_id"]
    md = (work / "results/site/preflight.md").read_text()
    assert "## a100: stopped" in md and f"job {job})" in md, md
    return messages[0]


@pytest.mark.parametrize("python", ["without torch", "missing"])
def test_a_broken_site_python_is_stopped_before_any_cell(slurm_cluster, tmp_path, python):
    since = last_job_id()
    py = login_env(tmp_path) if python == "without torch" else tmp_path / "no-such-venv/bin/python"
    cfg = _config(tmp_path, python=str(py))
    t0 = time.time()
    proc = snakemake(tmp_path, "cells", "--profile", PROFILE, "--configfile", str(cfg), timeout=300)
    message = _stopped(tmp_path, proc, time.time() - t0, since)
    if python == "without torch":
        assert f"the job's python ({py}) cannot import torch: ModuleNotFoundError" in message, message
    else:
        assert f"did not start the site's python ({py})" in message and "not found" in message, message
    assert f"gpus.a100.python in {tmp_path / 'site.yaml'}" in message or "set gpus.a100.python" in message


def test_cells_that_ask_for_cuda_on_a_cpu_build_are_stopped_not_unsupported(slurm_cluster, tmp_path):
    """benchmark.device auto on a GPU type: the testbed's torch is a CPU build, so no cell could measure; the
    preflight says so and names the keys, where before every cell ended `unsupported`."""
    since = last_job_id()
    cfg = _config(tmp_path, device="auto")
    t0 = time.time()
    proc = snakemake(tmp_path, "cells", "--profile", PROFILE, "--configfile", str(cfg), timeout=300)
    message = _stopped(tmp_path, proc, time.time() - t0, since)
    assert "sees no CUDA device (a CPU-only build)" in message and "benchmark.device: cpu" in message, message


README_COMMAND = ".venv/bin/pretrain-planner preflight --config my-sweep.yaml"  # the README's, run as written


def _preflight(work: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """The README's `pretrain-planner preflight` in `work` (its config as my-sweep.yaml; the repository's SLURM
    profile): its run and a100's record."""
    (work / "my-sweep.yaml").write_text((work / "c.yaml").read_text())
    cmd = [str(BIN / w.removeprefix(".venv/bin/")) if w.startswith(".venv/bin/") else w for w in README_COMMAND.split()]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300)
    folder = work / "results/site/preflight"
    path = folder / "a100.json" if proc.returncode == 0 else folder / "a100.stopped.json"
    return proc, json.loads(path.read_text())


def test_preflight_alone_finds_the_bound_cores_and_a_strangers_job(slurm_cluster, tmp_path):
    """With TaskPlugin=task/affinity the job's one task is bound to its one core, and a job of another user's on
    the node is named (a warning every cell records); with task/none (the testbed's own) a node that claims 4 CPUs
    on a 2-core host gives a job fewer cores than cpus_per_gpu 4: stopped, naming cpus_per_gpu."""
    cfg = _config(tmp_path)
    slurm_conf("TaskPlugin", "task/affinity")
    stranger = None
    try:
        out = subprocess.run(["sbatch", "--parsable", "-p", "a100", "-c", "1", "-J", "stranger", "--wrap", "sleep 300"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        stranger = out.strip().split(";")[0]
        wait_for(lambda: any(j["JobID"] == stranger and j["State"] == "RUNNING" for j in sacct(int(stranger) - 1)),
                 60, "the stranger's job to run")  # fmt: skip
        proc, record = _preflight(tmp_path)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        report = record["report"]
        assert report["cpus"]["usable"] == 1, report["cpus"]
        assert [j["job_id"] for j in report["co_tenants"]["jobs"]] == [stranger]
        assert not any("not bound" in w for w in record["warnings"]), record["warnings"]
        assert any("node node-a100 runs 1 other job(s) beside this one (user(s) root)" in w
                   for w in record["warnings"]), record["warnings"]  # fmt: skip
        assert "## a100: passed" in proc.stdout  # the findings printed
    finally:
        if stranger:
            subprocess.run(["scancel", stranger], capture_output=True)
        slurm_conf("TaskPlugin", "task/none")
    cfg = _config(tmp_path, cpus_per_gpu=4)
    assert cfg.is_file()
    proc, record = _preflight(tmp_path)
    assert proc.returncode == 1
    assert any("may use 2 core(s) (cores 0-1) where each GPU's rank is given 4" in e for e in record["errors"]), record
    assert any("gpus.a100.cpus_per_gpu" in e for e in record["errors"])


def test_a_preflight_job_cancelled_by_someone_is_asked_again_not_blamed_on_the_site(slurm_cluster, tmp_path):
    """A fault that says nothing of the environment (the job cancelled while it waited for its node) is not a
    broken site: the preflight asks again with a new job and passes."""
    cfg = _config(tmp_path)
    (tmp_path / "my-sweep.yaml").write_text(cfg.read_text())
    since = last_job_id()
    blocker = subprocess.run(["sbatch", "--parsable", "-p", "a100", "-c", "4", "-J", "blocker", "--wrap", "sleep 300"],
                             capture_output=True, text=True, check=True).stdout.strip().split(";")[0]  # fmt: skip
    cmd = [str(BIN / "pretrain-planner"), "preflight", "--config", "my-sweep.yaml"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        waiting = lambda: [j for j in sacct(since, "pp-preflight-a100", preflight=True) if j["State"] == "PENDING"]  # noqa: E731
        first = wait_for(waiting, 60, "the preflight job to wait for its node")[0]
        subprocess.run(["scancel", first["JobID"]], check=True)
        wait_for(lambda: len(sacct(since, "pp-preflight-a100", preflight=True)) == 2, 60, "a second preflight job")
    finally:
        subprocess.run(["scancel", blocker], capture_output=True)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    log = (tmp_path / "results/logs/preflight-a100.log").read_text()
    assert f"job {first['JobID']} ended CANCELLED: a fault, not the environment; asking again" in log, log[-3000:]
    record = json.loads((tmp_path / "results/site/preflight/a100.json").read_text())
    assert record["job_id"] != first["JobID"] and not record["errors"]
