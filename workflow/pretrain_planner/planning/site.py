"""The SLURM site file: which partition, GPU request, account ... each GPU type gets, and what its partition allows
(nodes per job, GPUs per node), checked at plan time. Imports no torch."""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pretrain_planner.planning.calendar import max_time_hours
from pretrain_planner.planning.configtypes import SiteFile, require
from pretrain_planner.planning.grid import PlannedCell
from pretrain_planner.schema import ConfigError, default, load_yaml, validate

# what a partition allows, per GPU type (site file, else the scheduler): nodes per job, GPUs per node, a job's hours
LIMITS = ("max_nodes", "gpus_per_node", "max_time_h")
# the site file's top-level keys for how the driver uses the scheduler (how often it asks, how many jobs it keeps
# queued): not part of any job's settings, so that changing them re-runs nothing (a cell's settings are its
# Snakemake params and its identity); the launcher reads them from the site file when it needs them
DRIVER_KEYS = ("poll_max_s", "max_queued_jobs")


def read_site(path: str | Path) -> SiteFile:
    """The site file validated and typed, every GPU type it maps with its full settings (the schema filled the
    defaults every key a GPU type may leave out): what the CLI's predictions read (the network of
    `inter_node_gbit_s`)."""
    data = validate(load_yaml(path), "site", path)
    return SiteFile(
        path=str(path), defaults=data["defaults"],
        gpus={g: {**data["defaults"], **(v or {})} for g, v in data["gpus"].items()},
        ask_scheduler=data["ask_scheduler"], poll_max_s=data["poll_max_s"], max_queued_jobs=data["max_queued_jobs"],
    )  # fmt: skip


def load_site(path: str | Path, gpu_types: list[str], source: str = "config", key: str = "sweep.gpus") -> SiteFile:
    """Validate the site file and resolve every GPU type of the sweep to its full settings."""
    return for_gpus(read_site(path), gpu_types, source, key)


def for_gpus(site: SiteFile, gpu_types: list[str], source: str = "config", key: str = "sweep.gpus") -> SiteFile:
    """`read_site`'s site narrowed to the GPU types a sweep uses; one it does not map is an error naming the file."""
    require(site, SiteFile, "planning.site.for_gpus")
    missing = [g for g in gpu_types if g not in site.gpus]
    if missing:
        raise ConfigError(
            f"{site.path}: gpus: no entry for GPU type(s) {', '.join(map(repr, missing))} used in {source} {key}; "
            f"mapped: {', '.join(site.gpus) or 'none'}. Add e.g.\n  gpus:\n    {missing[0]}: "
            f"{{partition: <partition>, gres_type: {missing[0]}}}"
        )
    return replace(site, gpus={g: site.gpus[g] for g in gpu_types})


Runner = Callable[[list[str]], str]  # a command's stdout (the scheduler's CLI), or OSError / CalledProcessError


def _run(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout


def partition_limits(partition: str | None, gres_type: str | None, gpu_request: str, run: Runner = _run) -> dict:
    """What a partition allows a job, asked of the scheduler (no job submitted): `max_nodes` (its MaxNodes, else the
    nodes it has), `gpus_per_node` (the most GPUs of `gres_type` one of its nodes has; None for a request without
    GPUs) and `how` (the commands and the values read). The default partition where `partition` is None."""
    out = run(["scontrol", "show", "partition", "-o", *([partition] if partition else [])])
    lines = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if "PartitionName=" in line]
    found = [f for f in lines if (f.get("PartitionName") == partition if partition else f.get("Default") == "YES")]
    if not found:
        raise ConfigError(f"scontrol show partition: no partition {partition or '(the default)'}")
    f = found[0]
    name = f["PartitionName"]
    total = int(f["TotalNodes"]) if f.get("TotalNodes", "").isdigit() else None
    most = int(f["MaxNodes"]) if f.get("MaxNodes", "").isdigit() else None
    max_nodes = min(x for x in (total, most) if x is not None) if (total or most) else None
    max_time = max_time_hours(f["MaxTime"]) if f.get("MaxTime") else None
    how = (f"scontrol show partition {name}: MaxNodes={f.get('MaxNodes')}, TotalNodes={f.get('TotalNodes')}, "
           f"MaxTime={f.get('MaxTime')}")  # fmt: skip
    gpus = None
    if gpu_request != "none":
        counts = []
        for node_gres in run(["sinfo", "-h", "-N", "-p", name, "-o", "%G"]).split():
            n = 0
            for kind, count in re.findall(r"gpu(?::([^:(,]+))?:(\d+)", node_gres):
                if not gres_type or kind == gres_type:
                    n += int(count)
            counts.append(n)
        gpus = max(counts, default=0)
        how += f"; sinfo -N -p {name} -o %G: at most {gpus} gpu{':' + gres_type if gres_type else ''} per node"
    return {"max_nodes": max_nodes, "gpus_per_node": gpus, "max_time_h": max_time, "how": how, "partition": name}


def resolve_limits(site: SiteFile, run: Runner = _run) -> SiteFile:
    """The site with each GPU type's limits known where they can be (`limits` and `limits_how` added to its
    settings): the site file's values, and with `ask_scheduler` those it leaves null from the scheduler (one
    question per partition)."""
    require(site, SiteFile, "planning.site.resolve_limits")
    asked: dict[tuple, dict] = {}
    resolved: dict[str, dict[str, Any]] = {}
    for gpu, settings in site.gpus.items():
        limits = {k: settings.get(k) for k in LIMITS}
        how = {k: f"{site.path}: gpus.{gpu}.{k}" for k in LIMITS if limits[k] is not None}
        if site.ask_scheduler and any(v is None for v in limits.values()):
            key = (settings.get("partition"), settings.get("gres_type"), settings["gpu_request"])
            if key not in asked:
                try:
                    asked[key] = partition_limits(*key, run=run)
                except (OSError, subprocess.SubprocessError) as exc:
                    raise ConfigError(
                        f"{site.path}: ask_scheduler: true, but the scheduler could not be asked for partition "
                        f"{key[0] or '(default)'}'s limits ({exc}); set gpus.{gpu}.max_nodes, gpus_per_node and "
                        "max_time_h in the site file, or ask_scheduler: false"
                    ) from exc
            for k in LIMITS:
                if limits[k] is None and asked[key][k] is not None:
                    limits[k], how[k] = asked[key][k], asked[key]["how"]
        resolved[gpu] = {**settings, "limits": limits, "limits_how": how}
    return replace(site, gpus=resolved)


def limit_reason(settings: dict[str, Any], nodes: int, gpus_per_node: int) -> str | None:
    """Why a cell of `nodes` x `gpus_per_node` cannot run on its partition (resolve_limits' values), else None."""
    limits, how = settings.get("limits") or {}, settings.get("limits_how") or {}
    part = settings.get("partition") or "(the default partition)"
    if limits.get("max_nodes") is not None and nodes > limits["max_nodes"]:
        return (f"partition {part} allows at most {limits['max_nodes']} node(s) per job ({how['max_nodes']}); the "
                f"cell asks {nodes}")  # fmt: skip
    if limits.get("gpus_per_node") is not None and gpus_per_node > limits["gpus_per_node"]:
        return (f"a node of partition {part} has at most {limits['gpus_per_node']} GPU(s) of this type "
                f"({how['gpus_per_node']}); the cell asks {gpus_per_node} per node")  # fmt: skip
    asks = settings.get("time_limit_min")
    if limits.get("max_time_h") is not None and asks and asks > limits["max_time_h"] * 60:
        return (f"partition {part} runs a job at most {limits['max_time_h'] * 60:g} min ({how['max_time_h']}); the "
                f"cell asks {asks} min (time_limit_min): it would wait in the queue for ever")  # fmt: skip
    return None


def within_limits(planned: list[PlannedCell], site: SiteFile) -> list[PlannedCell]:
    """The plan with each valid cell that its partition cannot hold made invalid, with the limit and its source
    (`site`: resolve_limits')."""
    require(site, SiteFile, "planning.site.within_limits")
    out = []
    for p in planned:
        why = limit_reason(site.gpus[p.cell.gpu], p.cell.nodes, p.cell.gpus_per_node) if p.valid else None
        out.append(replace(p, reason=why) if why else p)
    return out


def gpu_settings(site: SiteFile, gpu: str) -> dict[str, Any]:
    """What a job on `gpu` gets from the site (`load_site`'s): its GPU type's settings, the GPU type and the site
    file (a job's `slurm`: JSON, at the job's boundary)."""
    require(site, SiteFile, "planning.site.gpu_settings")
    return {**site.gpus[gpu], "gpu_type": gpu, "site": site.path}


def driver_settings(path: str | Path | None) -> dict[str, Any]:
    """The site file's driver keys (DRIVER_KEYS), read when the launcher asks: an edit (a higher max_queued_jobs)
    applies to the running driver. The schema's defaults without a site file, or one that cannot be read now."""
    defaults = {k: default("site", k) for k in DRIVER_KEYS}
    if not path:
        return defaults
    try:
        return _driver_settings(str(path), os.stat(path).st_mtime_ns)
    except (OSError, ConfigError):
        return defaults


@functools.lru_cache(maxsize=16)
def _driver_settings(path: str, _mtime_ns: int) -> dict[str, Any]:
    site = read_site(path)
    return {k: getattr(site, k) for k in DRIVER_KEYS}


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
    if "no-requeue" not in extra and "no_requeue" not in extra:
        # every job relies on requeue (submitit requeues it on the time-limit warning and on preemption): asked, so
        # that a site whose JobRequeue=0 makes jobs not requeueable by default requeues these
        extra.setdefault("requeue", True)
    if settings.get("reservation"):
        extra["reservation"] = settings["reservation"]
    if extra:
        params["additional_parameters"] = extra
    lines = job_lines(settings)
    if lines:
        params["setup"] = lines
    # one task failing ends the step: its peers would otherwise wait in a collective until the time limit
    # and each task its CPUs: srun does not take --cpus-per-task from the allocation in SLURM 22.05-23.02 (one CPU
    # per task, every rank's threads on one core where tasks are bound)
    params["srun_args"] = ["--kill-on-bad-exit=1", f"--cpus-per-task={settings['cpus_per_gpu']}",
                           *(settings.get("srun_args") or [])]  # fmt: skip
    return params


# How a rank starts on the site's compute nodes, in one place for every job (benchmark cells, the budget and train
# stages) and the exported launch.sh: the login node that plans may have no torch at all, while the compute nodes
# run a CUDA build from a module, a virtual environment or a container.


def job_lines(settings: dict[str, Any]) -> list[str]:
    """The shell lines a job runs before its ranks start, in order: `module load` of the site's `modules`, `export`
    of its `env` (values quoted: a config value never becomes shell), then its own `setup` lines (verbatim: they
    are shell by design, e.g. `source ~/venvs/pp/bin/activate`)."""
    lines = [f"module load {shlex.quote(m)}" for m in settings.get("modules") or []]
    for name, value in (settings.get("env") or {}).items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        lines.append(f"export {name}={shlex.quote(text)}")
    return lines + list(settings.get("setup") or [])


def rank_python(settings: dict[str, Any], default: str) -> str:
    """The command a rank's interpreter is started with (shell words): the site's `python` (else `default`, the
    driver's own), behind the site's `container` prefix where it has one (`apptainer exec --nv IMAGE`)."""
    python = shell_path(settings.get("python") or default)
    container = (settings.get("container") or "").strip()
    return f"{container} {python}" if container else python


def shell_path(path: str) -> str:
    """`path` as one shell word, its `~/` the job's home (a site file's `~/venvs/pp/bin/python`): quoted, so
    nothing else in it is shell."""
    return f'"$HOME"/{shlex.quote(path[2:])}' if path.startswith("~/") else shlex.quote(path)
