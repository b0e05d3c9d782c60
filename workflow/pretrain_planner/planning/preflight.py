"""The preflight's judgement: what one short job per GPU type found on the site's compute nodes (launch/probe.py's
report) against what the sweep's cells need there (`Expect`), as findings, each naming the site key that fixes it.

A wrong environment found here stops that GPU type's cells before any is measured: a site `python` without torch,
a CPU build where the cells ask for CUDA, fewer or more GPUs than the job asked, a device that is not the catalog's
type, fewer cores than `cpus_per_gpu`. What only makes a measurement less clean (cores not bound to the job, other
jobs on the node) is a warning every cell records. Imports no torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pretrain_planner.planning.catalog import GpuSpec
from pretrain_planner.planning.devices import GIB, device_mismatch

# The site keys a preflight's job depends on: a change to any of them runs the preflight again.
JOB_KEYS = ("partition", "constraint", "gpu_request", "gres_type", "account", "qos", "reservation",
            "cpus_per_gpu", "mem_per_gpu_gb", "extra_sbatch", "setup", "python", "container", "modules", "env",
            "srun_args")  # fmt: skip
ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Expect:
    """What the sweep's cells of one GPU type need from its partition and environment."""

    gpu_type: str
    gpu: dict[str, Any]  # the catalog's GpuSpec (to_dict)
    needs_cuda: bool  # the cells run on CUDA (benchmark.device auto on a GPU type)
    gpus_asked: int  # GPUs the preflight job asks per node (0: a CPU request)
    cpus_per_gpu: int  # cores each rank is given (the site's cpus_per_gpu)
    site: str  # the site file, for the keys a finding names
    python: str | None  # the site's `python` (None: the driver's own)
    container: str | None
    catalog: tuple[dict[str, Any], ...] = ()  # every catalog GPU type, to name what a wrong device could be


@dataclass(frozen=True)
class Finding:
    level: str  # error | warning
    what: str  # what the job found
    fix: str  # the site key (or config key) that changes it

    def line(self) -> str:
        return f"{self.what}; {self.fix}"


def _key(expect: Expect, key: str) -> str:
    return f"gpus.{expect.gpu_type}.{key} in {expect.site}"


def _visible_gpus(report: dict[str, Any], expect: Expect) -> tuple[int | None, str]:
    """How many GPUs the job may use and who says so: torch where the cells run on CUDA, else the scheduler's
    CUDA_VISIBLE_DEVICES (the fake GPUs of a test cluster); None where nothing tells."""
    if expect.needs_cuda and report.get("cuda_available"):
        return len(report.get("devices") or []), "torch.cuda.device_count()"
    visible = (report.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None, "CUDA_VISIBLE_DEVICES unset"
    return len([d for d in visible.split(",") if d.strip()]), f"CUDA_VISIBLE_DEVICES={visible}"


def findings(report: dict[str, Any], expect: Expect) -> list[Finding]:
    """Every problem (error) and caveat (warning) of one preflight report, in the order a user fixes them."""
    out: list[Finding] = []
    env_keys = f"{_key(expect, 'python')} (or container, modules, setup)"
    own_node = f"ask for a node of its own ({_key(expect, 'extra_sbatch')}: {{exclusive: true}})"
    if report.get("torch_error"):
        out.append(Finding(ERROR, f"the job's python ({report.get('python')}) cannot import torch: "
                           f"{report['torch_error']}", f"set {env_keys} to an environment with torch and "
                           "pretrain-planner"))  # fmt: skip
        return out  # nothing below can be asked without torch
    if expect.needs_cuda and not report.get("cuda_available"):
        build = report.get("cuda_build")
        why = report.get("cuda_error") or (f"a CUDA {build} build finds no device" if build else "a CPU-only build")
        out.append(Finding(ERROR, f"torch {report.get('torch')} on {report.get('host')} sees no CUDA device ({why}), "
                           f"and the cells of {expect.gpu_type} run on CUDA (benchmark.device: auto)",
                           f"set {env_keys} to a CUDA build of torch (with the driver's CUDA module loaded), or "
                           "benchmark.device: cpu to test the plumbing without GPUs"))  # fmt: skip
        return out
    visible, how = _visible_gpus(report, expect)
    if expect.gpus_asked and visible is not None and visible != expect.gpus_asked:
        fix = (f"the site does not confine a job to its GPUs (ask its admins for ConstrainDevices), or {own_node}"
               if visible > expect.gpus_asked
               else f"check {_key(expect, 'gpu_request')} and gres_type")  # fmt: skip
        out.append(Finding(ERROR, f"the job asked {expect.gpus_asked} GPU(s) per node and may use {visible} "
                           f"({how})", fix))  # fmt: skip
    if expect.needs_cuda:
        gpu = GpuSpec.from_dict(expect.gpu)
        catalog = [GpuSpec.from_dict(g) for g in expect.catalog]
        for d in report.get("devices") or []:
            why = device_mismatch(gpu, d["name"], d["memory_bytes"], catalog)
            if why:  # it names both types and the two ways out
                out.append(Finding(ERROR, why, f"the site keys: {_key(expect, 'partition')}, constraint"))
                break  # one node's devices are one type
    cpus = report.get("cpus") or {}
    usable = cpus.get("usable")
    if usable is not None and usable < expect.cpus_per_gpu:
        out.append(Finding(ERROR, f"the job's task may use {usable} core(s) (cores {_ranges(cpus.get('list'))}) where "
                           f"each GPU's rank is given {expect.cpus_per_gpu}: its threads would share cores",
                           f"set {_key(expect, 'cpus_per_gpu')} to the cores a node gives one GPU"))  # fmt: skip
    elif usable is not None and cpus.get("node") and usable > expect.cpus_per_gpu and usable >= cpus["node"]:
        out.append(Finding(WARNING, f"the job's task is not bound to its {expect.cpus_per_gpu} core(s): it may use "
                           f"all {usable} of the node's (the site's task plugin does not bind; TaskPlugin "
                           "task/affinity or task/cgroup does), so other jobs' threads may share its cores",
                           f"{own_node}, or read the cells' spread"))  # fmt: skip
    tenants = report.get("co_tenants") or {}
    jobs = tenants.get("jobs")
    if jobs:
        users = sorted({j["user"] for j in jobs})
        out.append(Finding(WARNING, f"node {tenants.get('node')} runs {len(jobs)} other job(s) beside this one "
                           f"(user(s) {', '.join(users)}): a step timed there may be slowed by them",
                           own_node))  # fmt: skip
    return out


def _ranges(cpus: list[int] | None) -> str:
    """[0, 1, 2, 5] as "0-2,5"."""
    if not cpus:
        return "?"
    runs, start, prev = [], cpus[0], cpus[0]
    for c in [*cpus[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        runs.append(f"{start}-{prev}" if prev > start else str(start))
        if c is not None:
            start = prev = c
    return ",".join(runs)


def summary(report: dict[str, Any], found: list[Finding]) -> dict[str, Any]:
    """What every cell measured after this preflight records of it (result.json `preflight`)."""
    return {
        "job_id": report.get("job_id"),
        "node": report.get("node") or report.get("host"),
        "python": report.get("python"),
        "container": report.get("container"),
        "torch": report.get("torch"),
        "cuda": report.get("cuda_build"),
        "nccl": report.get("nccl"),
        "cores_usable": (report.get("cpus") or {}).get("usable"),
        "other_jobs": len((report.get("co_tenants") or {}).get("jobs") or []),
        "warnings": [f.line() for f in found if f.level == WARNING],
    }


def fingerprint(words: list[str]) -> list[list[Any]]:
    """What can be seen from here of the environment the job runs (its interpreter, a container image, a bound
    folder): each path word that exists on this host with its size and change time, and for a virtual environment
    its site-packages folders' (a package installed or upgraded there changes them). A path only the compute nodes
    or the container see leaves nothing: the site key's text stands for it."""
    out: list[list[Any]] = []
    for word in words:
        if not (word.startswith(("/", "~/"))):
            continue
        path = Path(os.path.expanduser(word))
        try:
            st = path.stat()
        except OSError:
            continue
        out.append([word, st.st_size if path.is_file() else None, st.st_mtime_ns])
        root = path.parent.parent if path.is_file() else path
        if (root / "pyvenv.cfg").is_file() or path.is_dir():
            for sp in sorted(root.glob("lib/python*/site-packages")):
                out.append([str(sp), None, sp.stat().st_mtime_ns])
    return out


def digest(expect: Expect, settings: dict[str, Any], driver_python: str, version: str) -> str:
    """The preflight's identity: the site entry's keys its job depends on, what the cells need, the environment as
    seen from here (`fingerprint`) and this package's version. A recorded preflight of another digest is run again."""
    words = shlex.split(settings.get("container") or "") + [os.path.expanduser(settings.get("python") or
                                                                             driver_python)]  # fmt: skip
    data = {
        "site": {k: settings.get(k) for k in JOB_KEYS},
        "expect": {k: v for k, v in asdict(expect).items() if k not in ("catalog", "site")},
        "environment": fingerprint(words),
        "version": version,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def markdown(records: list[dict[str, Any]]) -> str:
    """results/site/preflight.md: one section per GPU type (passed or stopped), what its job found."""
    lines = ["# Preflight: the site's compute nodes as the cells' jobs find them", "",
             "One short job per GPU type before its first cell (launch/preflight.py); an error stops that type's "
             "cells, a warning is recorded in every cell measured after it.", ""]  # fmt: skip
    if not records:
        return "\n".join([*lines, "No preflight has run (the local launcher runs none).", ""])
    for rec in sorted(records, key=lambda r: r["gpu_type"]):
        report = rec.get("report") or {}
        state = "stopped" if rec.get("errors") else "passed"
        lines += [f"## {rec['gpu_type']}: {state} ({rec.get('checked_at', '?')}, job {rec.get('job_id', '?')})", ""]
        pk = report.get("packages") or {}
        rows = [
            ("node", report.get("node") or report.get("host")),
            ("python", f"{report.get('python')} ({report.get('python_version')})" if report else None),
            ("container", report.get("container")),
            ("torch", pk.get("torch")),
            ("CUDA (build) / NCCL", f"{report.get('cuda_build')} / {report.get('nccl')}" if report else None),
            ("transformers / deepspeed / flash-attn",
             " / ".join(str(pk.get(k)) for k in ("transformers", "deepspeed", "flash-attn")) if pk else None),
            ("GPUs asked / CUDA_VISIBLE_DEVICES", f"{report.get('gpus_asked')} / "
             f"{(report.get('env') or {}).get('CUDA_VISIBLE_DEVICES', 'unset (every GPU of the node)')}"
             if report else None),
            ("CUDA devices", (", ".join(
                f"{d['name']} ({d['memory_bytes'] / GIB:.1f} GiB)" for d in report.get("devices") or []) or "none")
             if report else None),
            ("cores usable", f"{(report.get('cpus') or {}).get('usable')} of the node's "
                             f"{(report.get('cpus') or {}).get('node')}" if report else None),
            ("other jobs on the node", len((report.get("co_tenants") or {}).get("jobs") or [])
             if (report.get("co_tenants") or {}).get("jobs") is not None else None),
        ]  # fmt: skip
        if report:  # a job that did not start reported nothing: its error says why
            lines += ["| | |", "|---|---|", *[f"| {k} | {v if v is not None else '-'} |" for k, v in rows], ""]
        for level in (ERROR, WARNING):
            for f in rec.get(f"{level}s") or []:
                lines.append(f"- **{level}**: {f}")
        lines.append("")
    return "\n".join(lines)
