"""What the Snakefile needs at parse time: the validated config, the catalog, the plan, per-cell specs.

Everything here is planning: no torch, no scheduler contact, so `snakemake -n` is instant anywhere.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import grid
from .catalog import Catalog, load_catalog
from .launch import cell_spec
from .results import atomic_write_text
from .schema import ConfigError, validate


def resolve(path: str, basedir: str | Path) -> Path:
    """A config path: absolute, else relative to the working directory, else to the Snakefile's folder."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    return Path(basedir) / p


@dataclass
class Pipeline:
    config: dict[str, Any]
    catalog: Catalog
    planned: list[grid.PlannedCell]

    @property
    def results(self) -> str:
        return self.config["results"]

    @property
    def cells(self) -> list[grid.Cell]:
        return [p.cell for p in self.planned if p.valid]

    def cell_files(self, name: str) -> list[str]:
        return [f"{self.results}/{c.path}/{name}" for c in self.cells]

    def threads(self, wildcards: Any) -> int:
        """Cores a cell occupies on the driver's host: one per rank when ranks run here, else 1."""
        if self.config["launcher"]["kind"] in ("local", "debug"):
            return grid.Cell.from_wildcards(wildcards).world_size
        return 1

    def spec(self, wildcards: Any, output: Any) -> dict[str, Any]:
        cell = grid.Cell.from_wildcards(wildcards)
        return cell_spec(cell, self.catalog, self.config, output.result, output.steps)

    def plan_params(self) -> dict[str, Any]:
        """What plan.csv depends on besides the catalog files (a change re-plans)."""
        return {"sweep": self.config["sweep"], "launcher": self.config["launcher"]["kind"]}


def load(config: dict[str, Any], basedir: str | Path, source: str = "config") -> Pipeline:
    """Validate config (defaults filled in place), load the catalog, expand and check the plan."""
    validate(config, "config", source)
    cat = config["catalog"]
    models, gpus = resolve(cat["models"], basedir), resolve(cat["gpus"], basedir)
    catalog = load_catalog(models, gpus)
    planned = grid.expand(config, catalog, source)
    grid.check_plan(planned, source)
    return Pipeline(config, catalog, planned)


def load_or_exit(config: dict[str, Any], basedir: str | Path, source: str = "config") -> Pipeline:
    """`load` for the Snakefile: a config mistake ends the run with the message alone, no traceback."""
    try:
        return load(config, basedir, source)
    except ConfigError as exc:
        raise SystemExit(f"pretrain-planner: configuration error\n{exc}") from None


PLAN_COLUMNS = ["model", "gpu", "nodes", "gpus_per_node", "world_size", "method", "valid", "reason", "per_rank_batch", "path"]


def write_plan(pipeline: Pipeline, out_csv: str) -> None:
    """results/plan.csv: every cell of the sweep, valid or not, with the reason."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=PLAN_COLUMNS)
    writer.writeheader()
    for p in pipeline.planned:
        writer.writerow(p.row())
    atomic_write_text(out_csv, buf.getvalue())
