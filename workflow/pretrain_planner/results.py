"""A cell's result: its fields, written atomically, read back with a fixed schema.

One place declares every field and its type so writers (rank 0 on a compute node) and readers
(polars on the login node) cannot drift apart; polars' inference from the first rows would silently
drop late keys. Imports no torch.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

STATUSES = ("ok", "noisy", "oom", "unsupported")
RAN = ("ok", "noisy")  # the step ran at its micro-batch (noisy: its timing spread too wide to be trusted)

# field -> type name ("str", "int", "float", "bool", "json" = nested data kept as a JSON string)
RESULT_FIELDS: dict[str, str] = {
    "status": "str",
    "reason": "str",
    "model": "str",
    "gpu": "str",
    "nodes": "int",
    "gpus_per_node": "int",
    "world_size": "int",
    "method": "str",
    "precision": "str",
    "global_batch": "int",
    "micro_batch_size": "int",
    "grad_accum_steps": "int",
    "step_time_s": "float",
    "step_time_p10_s": "float",
    "step_time_p90_s": "float",
    "timed_steps": "int",
    "warmup_steps": "int",
    "tokens_per_s": "float",
    "samples_per_s": "float",
    "flops_per_step": "float",
    "peak_tflops": "float",
    "mfu": "float",
    "suspect": "bool",
    "suspect_reason": "str",
    "spread": "float",  # p90/p10 of the timed steps (the last timing when a noisy cell was timed twice)
    "peak_mem_gib": "float",
    "peak_mem_kind": "str",
    "recipe_steps": "int",
    "training_days": "float",
    "steps_in_budget": "float",
    "final_loss": "float",
    "skipped_steps": "int",  # fp16: optimizer steps the loss scaler skipped (never timed); None without scaling
    "loss_scale": "float",  # fp16: the loss scale of the last timed step
    "method_settings": "json",
    "micro_batch_trials": "json",
    "versions": "json",
    "device_name": "str",
    "hostname": "str",
    "slurm_job_id": "str",
    "slurm_nodelist": "str",
    "submitit_job_id": "str",
    "wall_time_s": "float",
    "started_at": "str",
    "devices": "json",  # where every rank ran: the cores and GPUs it held (hostpool.py), threads, host
    "finished_at": "str",
}


def empty_result(**coords: Any) -> dict[str, Any]:
    """A result with every field present (None where unknown), so files always share one shape."""
    result: dict[str, Any] = dict.fromkeys(RESULT_FIELDS)
    result.update(coords)
    return result


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temporary file in the same folder, fsync, rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_result(path: str | Path, result: dict[str, Any]) -> None:
    unknown = set(result) - set(RESULT_FIELDS)
    if unknown:
        raise ValueError(f"result has undeclared fields {sorted(unknown)}; declare them in RESULT_FIELDS")
    if result.get("status") not in STATUSES:
        raise ValueError(f"result status {result.get('status')!r} is not one of {STATUSES}")
    full = empty_result(**result)
    atomic_write_text(path, json.dumps(full, indent=1, sort_keys=False) + "\n")


def write_steps(path: str | Path, steps: list[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(s) + "\n" for s in steps))


def read_result(path: str | Path) -> dict[str, Any]:
    with open(path) as fh:
        data = json.load(fh)
    return empty_result(**{k: v for k, v in data.items() if k in RESULT_FIELDS})
