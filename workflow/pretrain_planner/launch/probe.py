"""What a compute node's environment gives a job, seen from inside one (the preflight job, launch/preflight.py):
the interpreter and its packages, whether torch imports and sees CUDA, the GPUs and CPU cores the job may use, the
other jobs on the node. Runs under the site's `python` (and `container`), which may lack torch or even be broken:
every question is asked on its own and a failed one is recorded, never raised. Imports torch only inside `probe`.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
from typing import Any

from pretrain_planner.versions import installed_versions

# what a cell's ranks import (a missing optional one is recorded as None, not a problem)
PACKAGES = ("torch", "transformers", "submitit", "pretrain-planner", "deepspeed", "flash-attn", "liger-kernel")
# variables a container runtime sets inside (Apptainer/Singularity; systemd's convention that enroot/pyxis, podman
# and bubblewrap wrappers follow with --setenv container ...)
CONTAINER_VARS = ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "container")
# the job's environment a report keeps: how the network and the devices were set up for it
ENV_PREFIXES = (
    "NCCL_",
    "GLOO_",
    "CUDA_VISIBLE_DEVICES",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
    "SLURM_GPUS_ON_NODE",
    "GPU_DEVICE_ORDINAL",
    "SLURM_CPUS_PER_TASK",
    "OMP_NUM_THREADS",
)


def container() -> str | None:
    """The container this process runs in, as its runtime says (None: none seen)."""
    return next((os.environ[v] for v in CONTAINER_VARS if os.environ.get(v)), None)


def interpreter() -> dict[str, str | None]:
    """The interpreter this process runs (the site's `python`, else the driver's) and the container it runs in: a
    result says which environment measured it."""
    return {"python": sys.executable, "prefix": sys.prefix, "container": container()}


def _run(cmd: list[str]) -> tuple[int, str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 255, f"{type(exc).__name__}: {exc}"
    return out.returncode, out.stdout if out.returncode == 0 else (out.stderr or out.stdout)


def _cuda() -> dict[str, Any]:
    """torch's view: its build's CUDA, whether a device is usable, each visible device's name and memory, NCCL."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken install raises more than ImportError
        return {"torch_error": f"{type(exc).__name__}: {exc}"[:500]}
    out: dict[str, Any] = {"torch_error": None, "torch": torch.__version__, "cuda_build": torch.version.cuda}
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        count = torch.cuda.device_count() if out["cuda_available"] else 0
        out["devices"] = [
            {"name": p.name, "memory_bytes": int(p.total_memory)}
            for p in (torch.cuda.get_device_properties(i) for i in range(count))
        ]
        nccl = torch.cuda.nccl.version() if out["cuda_available"] else None
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else (str(nccl) if nccl else None)
    except Exception as exc:  # noqa: BLE001 - a driver/runtime mismatch surfaces here
        out["cuda_available"], out["devices"] = False, []
        out["cuda_error"] = f"{type(exc).__name__}: {exc}"[:500]
    return out


def _co_tenants(host: str) -> dict[str, Any]:
    """The other jobs running on this node (squeue, as the node's users see it): measured beside them, a step time
    is not this GPU type's alone. `error` when the scheduler could not be asked from the node."""
    node = os.environ.get("SLURMD_NODENAME") or host
    rc, out = _run(["squeue", "-h", "-t", "RUNNING", "-w", node, "-o", "%i|%u|%j"])
    if rc != 0:
        return {"node": node, "jobs": None, "error": " ".join(out.split())[:300]}
    mine = os.environ.get("SLURM_JOB_ID")
    jobs = []
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0] != mine:
            jobs.append({"job_id": parts[0], "user": parts[1], "name": parts[2]})
    return {"node": node, "jobs": jobs, "error": None}


def probe(gpus_asked: int) -> dict[str, Any]:
    """The report of this job's environment (plain JSON data). `gpus_asked`: the GPUs the job asked per node."""
    # SLURM's time-limit warning (USR2) can come right after the start on a partition with a short limit; this job
    # checkpoints nothing and ends in seconds: ignored, it cannot interrupt `import torch` (submitit's handler would
    # raise inside it, and the preflight would blame the environment)
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    host = socket.gethostname()
    affinity = sorted(os.sched_getaffinity(0))
    report: dict[str, Any] = {
        "host": host,
        "node": os.environ.get("SLURMD_NODENAME"),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "python": sys.executable,
        "prefix": sys.prefix,
        "python_version": platform.python_version(),
        "container": container(),
        "packages": installed_versions(PACKAGES),
        "gpus_asked": gpus_asked,
        "cpus": {
            "usable": len(affinity),
            "list": affinity,
            "node": os.cpu_count(),
            "slurm_cpus_per_task": os.environ.get("SLURM_CPUS_PER_TASK"),
        },  # fmt: skip
        "env": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)},
        "co_tenants": _co_tenants(host),
    }
    report.update(_cuda())
    # plain JSON types only: the driver unpickles the report in a login environment that may have no torch, and
    # torch.__version__ is a TorchVersion, whose unpickling imports torch
    return json.loads(json.dumps(report, default=str))
