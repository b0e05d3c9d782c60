"""Is the device a job got the GPU type its cells are measured as? A partition mapped to `a100` (80 GB in the
catalog) that hands out A100 40 GB nodes would measure, and predict, the wrong GPU: its micro-batches fit in half
the memory and every figure is credited to a type it is not. Checked on what the driver of the device reports
(torch's device name and total memory), so it is tested on recorded properties without a GPU. Imports no torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pretrain_planner.planning.catalog import GpuSpec

GIB = 1024**3
# how far a device's total memory may be from its catalog type's: the driver reports a little less than the
# datasheet (an 80 GB A100: 79.2 GiB; an 80 GB H100: 79.6 GiB), while a wrong type is off by a third or more
MEMORY_TOLERANCE = 0.15


def wants_cuda(gpu_type: str, device: str | None) -> bool:
    """Whether a job of `gpu_type` runs on CUDA: every GPU type does, unless the config's benchmark.device says cpu
    (the `cpu` stand-in never): what a rank selects (trainer/rank.py) and what the preflight checks the site has."""
    return gpu_type != "cpu" and device != "cpu"


def model_token(gpu: GpuSpec) -> str:
    """The part of a GPU type's key that its device name carries: `a100` of `a100-40gb-pcie`, `rtx3090`."""
    return re.sub(r"[^a-z0-9]", "", gpu.name.split("-")[0].lower())


def names(gpu: GpuSpec, device_name: str) -> bool:
    """Whether `device_name` names `gpu`'s model as a whole word: `rtx3090` in "NVIDIA GeForce RTX 3090", `a100`
    in "NVIDIA A100-SXM4-40GB"; not `a10` in an A100's, `l40` in an L40S's, `h200` in a GH200's."""
    parts = re.findall(r"[a-z]+|\d+", model_token(gpu))
    pattern = r"(?<![a-z0-9])" + r"[\s_-]?".join(parts) + r"(?![a-z0-9])"
    return bool(parts) and re.search(pattern, device_name.lower()) is not None


def device_mismatch(gpu: GpuSpec, device_name: str, total_bytes: int, catalog: Iterable[GpuSpec] = ()) -> str | None:
    """Why a device reported as `device_name` with `total_bytes` of memory is not `gpu` (None: it is), naming the
    catalog types it could be (`catalog`) and the two ways out."""
    found_gib = total_bytes / GIB
    problems = []
    if not names(gpu, device_name):
        problems.append(f"its name does not name {gpu.name!r}")
    if gpu.memory_gib and abs(found_gib - gpu.memory_gib) > MEMORY_TOLERANCE * gpu.memory_gib:
        problems.append(f"it has {found_gib:.1f} GiB where {gpu.name} has {gpu.memory_gib:g} GiB")
    if not problems:
        return None
    could = [
        g.name
        for g in catalog
        if g.name != gpu.name
        and names(g, device_name)
        and g.memory_gib
        and abs(found_gib - g.memory_gib) <= MEMORY_TOLERANCE * g.memory_gib
    ]
    fix = f"measure these nodes as {' or '.join(could)}" if could else "add its type to config/gpus.yaml"
    return (
        f"the job got {device_name} ({found_gib:.1f} GiB), not GPU type {gpu.name} ({gpu.label}, "
        f"{gpu.memory_gib:g} GiB): {'; '.join(problems)}. Map {gpu.name} to a partition (or constraint) of its own "
        f"in the site file, or {fix}"
    )


def detect_type(catalog: Iterable[GpuSpec], device_name: str, total_bytes: int) -> str | None:
    """The catalog's GPU type a device is (None: none fits): of the types its name and memory match, the one whose
    memory is nearest (an 80 GB A100 is `a100`, a 40 GB one `a100-40gb`), then the shortest key (the SXM entry
    over a variant's)."""
    fits = [g for g in catalog if g.memory_gib and device_mismatch(g, device_name, total_bytes) is None]
    if not fits:
        return None
    gib = total_bytes / GIB
    return min(fits, key=lambda g: (abs(gib - (g.memory_gib or 0)), len(g.name), g.name)).name
