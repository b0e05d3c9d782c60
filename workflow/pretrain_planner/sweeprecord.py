"""What a results folder was made from: the sweep's config, recorded by the driver when a sweep runs.

The CLI answers about a results folder (`best`, `status`, `predict`, `fit`, `cost`, `train`), so it must read the
config that folder was made from, not the demo's config/config.yaml: a user's sweep without prices would otherwise be
priced at the demo's NOMINAL `cpu` price, and a sweep with its own `results:` folder answered from the demo's folder.
Two small files carry that:

- `{results}/config.json` (layout.SWEEP_CONFIG): the effective config (validated, the schema's defaults in), its hash,
  and each config file Snakemake merged with its path and content hash, the working directory and the command;
  written atomically each time a driver starts to execute (never by a dry run);
- `.pretrain-planner/last-sweep.json` in the driver's working directory (the folder `snakemake` ran in): the results
  folder of the last sweep that ran there, which the CLI follows when it is given neither `--results` nor `--config`.

Imports no torch (the shared vocabulary: the CLI and the Snakefile's facade read it)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.results import atomic_write_text
from pretrain_planner.schema import leaves

POINTER = Path(".pretrain-planner") / "last-sweep.json"  # relative to the driver's working directory
IGNORED = ("results",)  # a config that differs only in where its results go describes the same sweep


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the config written canonically (sorted keys): equal configs, equal hashes."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def _file_hash(path: str | Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def write(
    results: str | Path,
    config: dict[str, Any],
    configfiles: Iterable[str | Path],
    basedir: str | Path,
    workdir: str | Path | None = None,
) -> Path:
    """Record the config of the sweep that is about to run in `results` (and the pointer to it in `workdir`, the
    driver's working directory by default, where relative paths of the config are resolved); returns the record's
    path."""
    workdir = Path(workdir or Path.cwd()).absolute()
    results = Path(results) if Path(results).is_absolute() else workdir / results
    files = [{"path": str(Path(f).absolute()), "sha256": _file_hash(f)} for f in configfiles]
    record = {
        "config": config,
        "sha256": config_hash(config),
        "files": files,
        "workdir": str(workdir),
        "basedir": str(Path(basedir).absolute()),
        "command": " ".join(sys.argv),
        "written_at": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    path = results / layout.SWEEP_CONFIG
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1, default=str) + "\n")
    pointer = workdir / POINTER
    pointer.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(pointer, json.dumps({"results": str(results.absolute()), "record": str(path.absolute()),
                                           "written_at": record["written_at"]}, indent=1) + "\n")  # fmt: skip
    return path


class RecordError(ValueError):
    """A record that exists but cannot be read: named, never silently replaced by the demo's config."""


def read(results: str | Path) -> dict[str, Any] | None:
    """The record of `results`, None where there is none (a folder made before records, or not yet run)."""
    path = Path(results) / layout.SWEEP_CONFIG
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path}: cannot be read ({exc}); rerun the sweep to write it again, or delete it") from exc
    if not isinstance(rec, dict) or not isinstance(rec.get("config"), dict):
        raise RecordError(f"{path}: not a record of a sweep's config (no `config` mapping)")
    rec["path"] = str(path)
    return rec


def last_sweep(cwd: str | Path | None = None) -> Path | None:
    """The results folder of the last sweep run in `cwd` (default: the working directory), if it still has a
    record."""
    pointer = Path(cwd or Path.cwd()) / POINTER
    try:
        results = Path(json.loads(pointer.read_text())["results"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return results if (results / layout.SWEEP_CONFIG).is_file() else None


def differences(a: dict[str, Any], b: dict[str, Any], ignore: Iterable[str] = IGNORED) -> list[str]:
    """The dotted keys whose values differ between two effective configs (`ignore`d keys and those below them
    left out), sorted."""
    fa, fb = leaves(a), leaves(b)
    skip = tuple(ignore)
    keys = {k for k in fa.keys() | fb.keys() if fa.get(k, object()) != fb.get(k, object())}
    keys = {k for k in keys if not any(k == s or k.startswith(f"{s}.") for s in skip)}
    # a section present on one side only shows as the section, not as each of its keys as well
    return sorted(k for k in keys if not any(k.startswith(f"{o}.") for o in keys))


def describe(rec: dict[str, Any]) -> str:
    """'my-sweep.yaml (sha256 1a2b3c4d), recorded 2026-12-03T10:00:00+00:00 in results/config.json'"""
    files = ", ".join(_short(f["path"], rec.get("workdir")) for f in rec.get("files") or []) or "--config values only"
    return f"{files} (sha256 {str(rec.get('sha256', ''))[:8]}), recorded {rec.get('written_at')} in {rec['path']}"


def _short(path: str, workdir: str | None) -> str:
    """A path relative to the sweep's working directory where it lies inside it."""
    if workdir:
        try:
            return os.path.relpath(path, workdir) if Path(path).is_relative_to(workdir) else path
        except ValueError:
            return path
    return path
