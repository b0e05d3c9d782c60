"""A cell's result: its fields, written atomically, read back with a fixed schema.

One place declares every field and its type so writers (rank 0 on a compute node) and readers
(polars on the login node) cannot drift apart; polars' inference from the first rows would silently
drop late keys. Imports no torch.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pretrain_planner import layout

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
    "micro_batch": "int",
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
    "peak_source": "str",  # where peak_tflops comes from: the datasheet (GPUs) or a matmul measured on the host (CPUs)
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
    "interpreter": "json",  # the Python that ran the cell and its container (launch/probe.interpreter)
    "device_name": "str",
    "hostname": "str",
    "slurm_job_id": "str",
    "slurm_nodelist": "str",
    "submitit_job_id": "str",
    "wall_time_s": "float",
    "started_at": "str",
    "devices": "json",  # where every rank ran: the cores and GPUs it held (hostpool.py), threads, host, SLURM node
    "step_split": "json",  # a multi-rank step's collectives vs compute and the ranks' layout (trainer/collectives.py)
    # what one restart of the setting costs before it trains: process start -> rank up, model build, method wrapping,
    # data, compile, their total_s and the rule they were taken by (trainer/startup.py); None: an older result
    "startup": "json",
    # the GPU type's preflight before the cell (SLURM, launch/preflight.py): environment, node, cores, its warnings
    "preflight": "json",
    "finished_at": "str",
}


def throughput_text(row: dict[str, Any]) -> str | None:
    """ "12,345 tokens/s" (text), else "12.3 samples/s" (images), else None: how a measurement's speed is shown."""
    if row.get("tokens_per_s") is not None:
        return f"{row['tokens_per_s']:,.0f} tokens/s"
    if row.get("samples_per_s") is not None:
        return f"{row['samples_per_s']:,.1f} samples/s"
    return None


def gpu_hours(wall_time_s: Any, world_size: Any) -> Any:
    """GPU-hours a measurement spent: its wall time x its GPUs (numbers, or polars expressions alike)."""
    return wall_time_s * world_size / 3600


def empty_result(**coords: Any) -> dict[str, Any]:
    """A result with every field present (None where unknown), so files always share one shape."""
    result: dict[str, Any] = dict.fromkeys(RESULT_FIELDS)
    result.update(coords)
    return result


# Checks a process runs before each write of the results (the driver's: that it still owns the results folder,
# see launch/driver.py); empty in a rank's process.
WRITE_CHECKS: list[Callable[[Path], None]] = []


def before_write(path: str | Path) -> None:
    for check in list(WRITE_CHECKS):
        check(Path(path))


class DiskFull(OSError):
    """No space (or quota) left where a result is written: says which path and how much space is left."""


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def disk_full(path: str | Path, exc: OSError) -> OSError:
    """`exc` as a DiskFull naming the path, its file system's free space and mount point, when it is a full
    disk or quota (ENOSPC, EDQUOT); any other error unchanged."""
    if isinstance(exc, DiskFull) or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return exc
    where = Path(path).absolute()
    mount = where
    while not mount.exists() or (not os.path.ismount(mount) and mount != mount.parent):
        mount = mount.parent
    try:
        usage = shutil.disk_usage(mount)
        space = f"{_size(usage.free)} free of {_size(usage.total)} on {mount}"
    except OSError:
        space = f"free space on {mount} unknown"
    kind = "disk quota exceeded" if exc.errno == errno.EDQUOT else "no space left on device"
    return DiskFull(exc.errno, f"{kind} writing {where} ({space}). Free some space there (or set `results:` to "
                               "another folder) and run the same command again: finished results are kept")  # fmt: skip


def atomic_write(path: str | Path, write: Callable[[Path], Any], guarded: bool = True) -> None:
    """`write(tmp)` writes a temporary file in the same folder, which is then renamed to `path`: readers never
    see half a file, and a full disk leaves the old file (or none) and raises DiskFull naming the path."""
    path = Path(path)
    if guarded:
        before_write(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    except OSError as exc:
        raise disk_full(path, exc) from exc
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise disk_full(path, exc) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str, guarded: bool = True) -> None:
    """Write to a temporary file in the same folder, fsync, rename: readers never see half a file."""

    def write(tmp: Path) -> None:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    atomic_write(path, write, guarded)


def read_json(path: str | Path) -> Any:
    """A JSON file written by `atomic_write_text`, or None where it is missing or unreadable (a reader that must
    tell the two apart reads the file itself)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def atomic_savefig(fig: Any, path: str | Path, dpi: int = 100) -> None:
    """A matplotlib figure in the format of the path's suffix (png, svg), written to a temporary name and renamed:
    a reader never sees half a file."""
    ext = Path(path).suffix.lstrip(".")
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=ext))


def write_result(path: str | Path, result: dict[str, Any]) -> None:
    unknown = set(result) - set(RESULT_FIELDS)
    if unknown:
        raise ValueError(f"result has undeclared fields {sorted(unknown)}; declare them in RESULT_FIELDS")
    if result.get("status") not in STATUSES:
        raise ValueError(f"result status {result.get('status')!r} is not one of {STATUSES}")
    full = empty_result(**result)
    atomic_write_text(path, json.dumps(full, indent=1, sort_keys=False) + "\n")


# The keys an earlier version wrote for a quantity that has one name now: read, never written.
LEGACY_KEYS = {"micro_batch_size": "micro_batch"}


def with_current_keys(record: dict[str, Any]) -> dict[str, Any]:
    """A result, plan `measured` section or table row with its legacy keys under their current names (a record of
    an earlier version reads as a new one; a current key wins where both are present)."""
    out = dict(record)
    for old, new in LEGACY_KEYS.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    return out


_LEGACY = frozenset(LEGACY_KEYS)


def write_steps(path: str | Path, steps: list[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(s) + "\n" for s in steps))


def read_result(path: str | Path) -> dict[str, Any]:
    with open(path) as fh:
        data = with_current_keys(json.load(fh))
    return empty_result(**{k: v for k, v in data.items() if k in RESULT_FIELDS})


# ------------------------------------------------------------------------ reading a result back, checked

JSON_FIELDS = [k for k, kind in RESULT_FIELDS.items() if kind == "json"]


COORDS = {"model": "str", "gpu": "str", "nodes": "int", "gpus_per_node": "int", "method": "str"}


# what a result of each status must carry to be usable
REQUIRED = {"ok": ("micro_batch", "grad_accum_steps", "step_time_s"), "oom": (), "unsupported": ()}
REQUIRED["noisy"] = REQUIRED["ok"]


_EXACT = {"float": float, "int": int, "bool": bool, "str": str}


_NAMES = list(RESULT_FIELDS)


_SCALARS = [(name, kind, _EXACT[kind]) for name, kind in RESULT_FIELDS.items() if kind != "json"]


_ENCODE = json.JSONEncoder(sort_keys=True).encode  # one encoder: json.dumps(sort_keys=...) builds one per call


def _check_value(name: str, kind: str, value: Any) -> tuple[Any, str | None]:
    """The value in the declared type, or a problem."""
    if value is None:
        return None, None
    if kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), None
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value, None
        if isinstance(value, float) and value.is_integer():
            return int(value), None
    elif kind == "bool":
        if isinstance(value, bool):
            return value, None
    elif kind == "str" and isinstance(value, str):
        return value, None
    return None, f"{name} is {json.dumps(value)[:40]} ({type(value).__name__}), expected {kind}"


def parse_result(path: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """(row, None) for a usable result file; (None, problem) for one that is not. Fast path first: this
    runs once per cell (10,000 files in well under a second)."""
    path = str(path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None, "result.json is missing"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read result.json: {type(exc).__name__}: {exc}"
    if not text.strip():
        return None, "result.json is empty (an interrupted write?)"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): truncated or corrupt"
    if not isinstance(data, dict):
        return None, f"not a JSON object but a {type(data).__name__}"
    if not _LEGACY.isdisjoint(data):
        data = with_current_keys(data)
    get = data.get
    row: dict[str, Any] = {name: get(name) for name in _NAMES}
    problems = []
    for name, kind, exact in _SCALARS:
        value = row[name]
        if value is not None and type(value) is not exact:
            row[name], problem = _check_value(name, kind, value)
            if problem:
                problems.append(problem)
    for name in JSON_FIELDS:
        if row[name] is not None:
            row[name] = _ENCODE(row[name])
    status = row["status"]
    if status not in STATUSES:
        problems.append(f"status {status!r} is not one of {', '.join(STATUSES)}")
    else:
        missing = [k for k in REQUIRED[status] if row[k] is None]
        if missing:
            problems.append(f"status {status} but no {', '.join(missing)} (a partial result)")
        if status in RAN and row["step_time_s"] is not None and not row["step_time_s"] > 0:
            problems.append(f"step_time_s {row['step_time_s']} is not positive")
    cell = layout.cell_coords(path)
    for key in COORDS:
        if cell is not None:
            expected = cell[key]
            if row[key] is None:
                row[key] = expected
            elif row[key] != expected:
                problems.append(f"{key} is {row[key]!r} but the file lies in the folder of {key} {expected!r}")
        elif row[key] is None:
            problems.append(f"no {key}")
    if problems:
        return None, "; ".join(problems)
    if row["world_size"] is None:
        row["world_size"] = row["nodes"] * row["gpus_per_node"]
    return row, None


def coords_of(path: str) -> dict[str, Any]:
    return layout.cell_coords(str(path)) or dict.fromkeys(COORDS)
