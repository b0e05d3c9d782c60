"""The preflight's judgement (planning/preflight.py) on reports as launch/probe.py writes them, recorded from the
environments a site can hand a job: no torch, a CPU build where the cells ask for CUDA, an A100 40 GB node in a
partition mapped to the 80 GB `a100`, more GPUs than asked, fewer cores than `cpus_per_gpu`, cores not bound,
strangers' jobs on the node; the probe itself run here; the digest that decides when it runs again. The preflight
on the SLURM testbed: tests/test_preflight_slurm.py."""

from __future__ import annotations

import os
from dataclasses import replace

from pretrain_planner.launch.probe import probe
from pretrain_planner.planning.preflight import ERROR, WARNING, Expect, digest, findings, markdown

from .conftest import CATALOG

MIB = 1024**2
SITE = "site.yaml"


def expect(gpu: str = "a100", **over) -> Expect:
    base = Expect(gpu_type=gpu, gpu=CATALOG.gpu(gpu).to_dict(), needs_cuda=True, gpus_asked=1, cpus_per_gpu=8,
                  site=SITE, python="~/venvs/pp/bin/python", container=None,
                  catalog=tuple(g.to_dict() for g in CATALOG.gpus.values()))  # fmt: skip
    return replace(base, **over)


def report(**over) -> dict:
    """A healthy report of a job on one A100 80 GB with 8 bound cores, alone on its node."""
    base = {
        "host": "gpu017", "node": "gpu017", "job_id": "4242", "python": "/home/u/venvs/pp/bin/python",
        "prefix": "/home/u/venvs/pp", "python_version": "3.11.9", "container": None,
        "packages": {"torch": "2.5.1", "transformers": "4.46.0", "deepspeed": None, "flash-attn": "2.7.0"},
        "gpus_asked": 1, "cpus": {"usable": 8, "list": list(range(8, 16)), "node": 64},
        "env": {"CUDA_VISIBLE_DEVICES": "0"}, "co_tenants": {"node": "gpu017", "jobs": [], "error": None},
        "torch_error": None, "torch": "2.5.1+cu124", "cuda_build": "12.4", "cuda_available": True,
        "devices": [{"name": "NVIDIA A100-SXM4-80GB", "memory_bytes": 81920 * MIB}], "nccl": "2.21.5",
    }  # fmt: skip
    return {**base, **over}


def levels(found) -> list[str]:
    return [f.level for f in found]


def test_a_healthy_node_passes_without_findings():
    assert findings(report(), expect()) == []


def test_no_torch_is_one_error_naming_the_python_key():
    found = findings(report(torch_error="ModuleNotFoundError: No module named 'torch'", cuda_available=None), expect())
    assert levels(found) == [ERROR]
    assert "cannot import torch: ModuleNotFoundError" in found[0].what
    assert f"gpus.a100.python in {SITE}" in found[0].fix


def test_a_cpu_build_where_cells_ask_for_cuda_is_an_error_not_unsupported_cells():
    found = findings(report(torch="2.5.1+cpu", cuda_build=None, cuda_available=False, devices=[]), expect())
    assert levels(found) == [ERROR]
    assert "sees no CUDA device (a CPU-only build)" in found[0].what and "benchmark.device: auto" in found[0].what
    assert "gpus.a100.python" in found[0].fix and "benchmark.device: cpu" in found[0].fix
    # the testbed's cells that say device: cpu need no CUDA
    assert findings(report(cuda_build=None, cuda_available=False, devices=[]), expect(needs_cuda=False)) == []


def test_an_a100_40gb_node_in_the_a100_partition_is_named_with_both_types():
    found = findings(report(devices=[{"name": "NVIDIA A100-SXM4-40GB", "memory_bytes": 40960 * MIB}]), expect())
    assert levels(found) == [ERROR]
    assert "NVIDIA A100-SXM4-40GB (40.0 GiB), not GPU type a100" in found[0].what and "a100-40gb" in found[0].what
    assert "gpus.a100.partition" in found[0].fix


def test_gpus_visible_must_equal_gpus_asked():
    eight = [{"name": "NVIDIA A100-SXM4-80GB", "memory_bytes": 81920 * MIB}] * 8
    found = findings(report(devices=eight, env={}), expect())
    assert levels(found) == [ERROR] and "asked 1 GPU(s) per node and may use 8" in found[0].what
    assert "ConstrainDevices" in found[0].fix and "exclusive: true" in found[0].fix
    # without CUDA in the cells (a test cluster's fake GPUs), the scheduler's CUDA_VISIBLE_DEVICES is counted
    found = findings(report(cuda_available=False, env={"CUDA_VISIBLE_DEVICES": "0"}),
                     expect(needs_cuda=False, gpus_asked=2))  # fmt: skip
    assert levels(found) == [ERROR]
    assert "asked 2 GPU(s) per node and may use 1 (CUDA_VISIBLE_DEVICES=0)" in found[0].what
    assert "gpus.a100.gpu_request" in found[0].fix


def test_fewer_cores_than_cpus_per_gpu_is_an_error_unbound_cores_a_warning():
    found = findings(report(cpus={"usable": 4, "list": [0, 1, 2, 3], "node": 64}), expect())
    assert levels(found) == [ERROR]
    assert "may use 4 core(s) (cores 0-3) where each GPU's rank is given 8" in found[0].what
    assert "gpus.a100.cpus_per_gpu" in found[0].fix
    found = findings(report(cpus={"usable": 64, "list": list(range(64)), "node": 64}), expect())
    assert levels(found) == [WARNING] and "not bound to its 8 core(s): it may use all 64" in found[0].what


def test_other_jobs_on_the_node_are_a_warning_naming_their_users():
    jobs = [{"job_id": "17", "user": "alice", "name": "x"}, {"job_id": "18", "user": "bob", "name": "y"}]
    found = findings(report(co_tenants={"node": "gpu017", "jobs": jobs, "error": None}), expect())
    assert levels(found) == [WARNING]
    assert "node gpu017 runs 2 other job(s) beside this one (user(s) alice, bob)" in found[0].what


def test_markdown_shows_each_type_passed_or_stopped():
    text = markdown([
        {"gpu_type": "a100", "report": report(), "errors": [], "warnings": ["w1"], "checked_at": "t"},
        {"gpu_type": "h100", "report": None, "errors": ["its job 9 did not start the site's python"],
         "job_error": "its job 9 did not start the site's python", "warnings": []},
    ])  # fmt: skip
    assert "## a100: passed" in text and "| torch | 2.5.1 |" in text and "NVIDIA A100-SXM4-80GB (80.0 GiB)" in text
    assert "- **warning**: w1" in text
    assert "## h100: stopped" in text and "- **error**: its job 9 did not start" in text


def test_the_probe_here_reports_this_environment():
    """The probe run in this process (a CPU build of torch): what the report holds, asked of the real thing."""
    r = probe(gpus_asked=0)
    assert r["torch_error"] is None and r["torch"].startswith("2.") and r["cuda_available"] is False
    assert r["cpus"]["usable"] == len(os.sched_getaffinity(0)) and r["packages"]["transformers"]
    assert ERROR not in levels(findings(r, expect(needs_cuda=False, gpus_asked=0, cpus_per_gpu=1)))
    assert findings(r, expect(needs_cuda=True))[0].what.startswith("torch ")


def test_digest_follows_the_site_entry_and_the_environment(tmp_path):
    """A preflight runs again when its site entry's job keys change, or when the environment changes as seen
    from the driver (a package installed into the venv the site's python belongs to); not for keys it never
    reads (the partition's limits)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").write_text("")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    sp = venv / "lib/python3.11/site-packages"
    sp.mkdir(parents=True)
    e = expect(python=str(venv / "bin/python"))
    settings = {"partition": "gpu", "python": str(venv / "bin/python"), "cpus_per_gpu": 8, "max_nodes": 4}
    first = digest(e, settings, "/usr/bin/python3", "0.1.0")
    assert digest(e, {**settings, "max_nodes": 8}, "/usr/bin/python3", "0.1.0") == first
    assert digest(e, {**settings, "env": {"NCCL_SOCKET_IFNAME": "ib0"}}, "/usr/bin/python3", "0.1.0") != first
    assert digest(replace(e, needs_cuda=False), settings, "/usr/bin/python3", "0.1.0") != first
    os.utime(sp, ns=(1, 1))  # a package installed: the folder changed
    assert digest(e, settings, "/usr/bin/python3", "0.1.0") != first
