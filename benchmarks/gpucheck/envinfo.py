"""The machine a run measured on: date, host, GPU, driver, CUDA, Python and library versions, and whether each
optional back-end imports (each tried in a subprocess of its own: a broken install may raise anything or hang).

    python -m gpucheck.envinfo OUT.json      (benchmarks/ on the path; prints the facts, writes them as JSON)
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from pretrain_planner.versions import installed_versions

PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "triton",
    "deepspeed",
    "liger-kernel",
    "flash-attn",
    "pydantic",
    "pydantic-core",
    "jsonschema",
    "submitit",
    "pyyaml",
    "numpy",
    "polars",
    "snakemake",
)
IMPORTS = {"deepspeed": "deepspeed", "liger_kernel": "liger_kernel.transformers", "flash_attn": "flash_attn"}
ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCHINDUCTOR_CACHE_DIR",
    "HF_HUB_OFFLINE",
    "PYTHONPATH",
    "DS_ACCELERATOR",
)


def run(cmd: list[str], timeout: float = 20) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def gpu_count() -> int:
    """GPUs nvidia-smi lists (0 without one), asked without torch (the parent process never imports it)."""
    out = run(["nvidia-smi", "-L"])
    return sum(1 for line in (out or "").splitlines() if line.startswith("GPU "))


def gpu_type(catalog, default: str = "h200") -> str:
    """The catalog's GPU type of GPU 0 (nvidia-smi's name and memory, planning/devices.detect_type), else `default`:
    a check measured as another type than the device it ran on would be refused by every cell."""
    from pretrain_planner.planning.devices import detect_type

    out = run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
    first = (out or "").splitlines()[0] if (out or "").strip() else ""
    name, _, mib = first.rpartition(",")
    if not name.strip() or not mib.strip().isdigit():
        return default
    return detect_type(catalog.gpus.values(), name.strip(), int(mib) * 1024 * 1024) or default


def versions() -> dict[str, str | None]:
    return installed_versions(PACKAGES)


def imports(timeout: float = 120) -> dict[str, str]:
    """'ok' or why not, per optional back-end; each import in its own process (DS_ACCELERATOR as a cell sets it)."""
    out = {}
    for name, module in IMPORTS.items():
        code = f"import {module}"
        try:
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
            lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
            out[name] = "ok" if p.returncode == 0 else f"does not import: {(lines or ['?'])[-1]}"[:400]
        except subprocess.TimeoutExpired:
            out[name] = f"import did not finish within {timeout:.0f} s"
    return out


def facts() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "cpu_count": os.cpu_count(),
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "versions": versions(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "command": os.environ.get("GPU_ALL_COMMAND"),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu_name=torch.cuda.get_device_name(0),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            gpu_capability=f"{props.major}.{props.minor}",
            gpu_count=torch.cuda.device_count(),
        )
    else:
        env["gpu_name"] = None
    smi = run(
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm",
            "--format=csv,noheader",
        ]
    )
    env["nvidia_smi"] = smi
    env["driver"] = smi.splitlines()[0].split(",")[1].strip() if smi else None
    env["imports"] = imports()
    return env


def main(argv: list[str]) -> int:
    env = facts()
    Path(argv[0]).write_text(json.dumps(env, indent=1))
    for k, v in env.items():
        print(f"{k}: {v}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
