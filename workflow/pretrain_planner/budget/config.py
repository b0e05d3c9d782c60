"""Load and check config/budget.yaml; resolve its paths and the model. Imports no torch."""

from __future__ import annotations

import datetime
import glob
import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from ..catalog import load_models
from ..pipeline import resolve
from ..schema import ConfigError, load_yaml, validate

# Jobs of one Snakemake process (--force-use-threads) share torch's global RNG and thread settings: the
# budget stage's torch jobs take turns, so that each is deterministic given its seed.
TORCH_LOCK = threading.RLock()

# GLUE task -> the folder name of the standard download
TASK_DIRS = {
    "cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B",
    "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI",
}  # fmt: skip


def load(path: str | Path, basedir: str | Path = ".") -> dict[str, Any]:
    """The validated budget config (defaults filled), with corpus files, GLUE dir and model resolved."""
    path = resolve(str(path), basedir)
    if not Path(path).is_file():
        raise ConfigError(f"{path}: budget config not found")
    cfg = validate(load_yaml(path), "budget", path)
    files: list[str] = []
    for pattern in cfg["corpus"]["files"]:
        p = str(resolve(pattern, basedir))
        hits = sorted(glob.glob(p)) if any(c in p for c in "*?[") else ([p] if Path(p).is_file() else [])
        if not hits:
            raise ConfigError(f"{path}: corpus.files: {pattern!r} matches no file")
        files.extend(hits)
    cfg["corpus"]["files"] = files
    if cfg["tokenizer"]["path"]:
        cfg["tokenizer"]["path"] = str(resolve(cfg["tokenizer"]["path"], basedir))
    cfg["glue"]["data_dir"] = str(resolve(cfg["glue"]["data_dir"], basedir))
    cfg["model"] = _model(cfg, path, basedir)
    tr = cfg["train"]
    if tr["global_batch"] % tr["micro_batch"]:
        raise ConfigError(
            f"{path}: train.global_batch {tr['global_batch']} is not a multiple of "
            f"train.micro_batch {tr['micro_batch']}"
        )
    cfg["source"] = str(path)
    return cfg


def load_or_exit(path: str | Path, basedir: str | Path = ".") -> dict[str, Any]:
    try:
        return load(path, basedir)
    except ConfigError as exc:
        raise SystemExit(f"pretrain-planner: budget configuration error\n{exc}") from None


def _model(cfg: dict[str, Any], source: Path, basedir: str | Path) -> dict[str, Any]:
    m = cfg["model"]
    if isinstance(m, str):
        catalog = load_models(resolve(cfg["catalog_models"], basedir))
        if m not in catalog:
            raise ConfigError(f"{source}: model: no model {m!r} in {cfg['catalog_models']}")
        spec = catalog[m]
        if spec.task != "masked_lm":
            raise ConfigError(f"{source}: model: {m!r} is not a masked LM (family {spec.family})")
        return {"name": spec.name, "family": spec.family, "arch": dict(spec.arch)}
    return {"name": m.get("name", "custom"), "family": m["family"], "arch": dict(m["arch"])}


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-able values (what a stage's outputs depend on)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class FileLog:
    """Timestamped lines appended to a rule's log file (plain appends: no logging-module global state, which
    libraries loaded later may rewire)."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def info(self, msg: str, *args: Any) -> None:
        if self.path is None:
            return
        stamp = datetime.datetime.now().isoformat(sep=" ", timespec="milliseconds")
        with self.path.open("a") as fh:
            fh.write(f"{stamp} {msg % args if args else msg}\n")


def file_logger(name: str, log_path: str | Path | None) -> FileLog:
    """The log of one stage (`name` is for the reader of this code only)."""
    return FileLog(log_path)
