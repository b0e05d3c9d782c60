"""The SLURM site file: which partition, GPU request, account ... each GPU type gets. Imports no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pretrain_planner.schema import ConfigError, load_yaml, validate


def load_site(
    path: str | Path, gpu_types: list[str], source: str = "config", key: str = "sweep.gpus"
) -> dict[str, Any]:
    """Validate the site file and resolve every GPU type of the sweep to its full settings."""
    data = validate(load_yaml(path), "site", path)
    defaults = data["defaults"]  # the schema filled every key a GPU type may leave out
    missing = [g for g in gpu_types if g not in data["gpus"]]
    if missing:
        raise ConfigError(
            f"{path}: gpus: no entry for GPU type(s) {', '.join(map(repr, missing))} used in {source} {key}; "
            f"mapped: {', '.join(data['gpus']) or 'none'}. Add e.g.\n  gpus:\n    {missing[0]}: "
            f"{{partition: <partition>, gres_type: {missing[0]}}}"
        )
    return {
        "poll_max_s": data["poll_max_s"],
        "gpus": {g: {**defaults, **(data["gpus"][g] or {})} for g in gpu_types},
        "path": str(path),
    }


def gpu_settings(site: dict[str, Any], gpu: str) -> dict[str, Any]:
    """What a job on `gpu` gets from the site (`load_site`'s): its GPU type's settings, the controller's poll limit,
    the GPU type and the site file (a job's `slurm`)."""
    return {**site["gpus"][gpu], "poll_max_s": site["poll_max_s"], "gpu_type": gpu, "site": site.get("path")}


def sbatch_parameters(settings: dict[str, Any], nodes: int, gpus_per_node: int, job_name: str) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for one cell: one task per GPU, the GPU request of the site."""
    params: dict[str, Any] = {
        "job_name": job_name,
        "nodes": nodes,
        "ntasks_per_node": gpus_per_node,
        "cpus_per_task": settings["cpus_per_gpu"],
        "time": settings["time_limit_min"],
        "signal_delay_s": settings["signal_delay_s"],
    }
    for key in ("partition", "constraint", "account", "qos"):
        if settings.get(key):
            params[key] = settings[key]
    typed = f"{settings['gres_type']}:{gpus_per_node}" if settings.get("gres_type") else str(gpus_per_node)
    if settings["gpu_request"] == "gres":
        params["gres"] = f"gpu:{typed}"
    elif settings["gpu_request"] == "gpus-per-node":
        params["gpus_per_node"] = typed
    if settings.get("mem_per_gpu_gb"):
        params["mem"] = f"{int(settings['mem_per_gpu_gb'] * gpus_per_node)}G"
    extra = dict(settings.get("extra_sbatch") or {})
    if settings.get("reservation"):
        extra["reservation"] = settings["reservation"]
    if extra:
        params["additional_parameters"] = extra
    if settings.get("setup"):
        params["setup"] = list(settings["setup"])
    # one task failing ends the step: its peers would otherwise wait in a collective until the time limit
    params["srun_args"] = ["--kill-on-bad-exit=1"]
    return params
