"""Everything a cell's job needs, as plain JSON data: the job never reads config files. Imports no torch."""

from __future__ import annotations

from typing import Any

from pretrain_planner.planning.catalog import Catalog
from pretrain_planner.planning.configtypes import BenchmarkSection, LauncherSection, SiteFile, require
from pretrain_planner.planning.grid import Cell
from pretrain_planner.planning.site import gpu_settings


def cell_spec(
    cell: Cell,
    catalog: Catalog,
    benchmark: BenchmarkSection,
    launcher: LauncherSection,
    result: str,
    steps: str,
    site: SiteFile | None = None,
) -> dict[str, Any]:
    """Everything a cell's job needs, as plain JSON data (the job never reads config files): the typed sections
    turned into JSON here, at the job's boundary (the cell rule's params, whose change measures the cell again:
    the benchmark's `cell_options`, no loss check; the launcher's `job_options`, no site file)."""
    require(benchmark, BenchmarkSection, "planning.spec.cell_spec")
    require(launcher, LauncherSection, "planning.spec.cell_spec")
    spec = {
        "cell": {
            "model": cell.model,
            "gpu": cell.gpu,
            "nodes": cell.nodes,
            "gpus_per_node": cell.gpus_per_node,
            "method": cell.method,
        },
        "name": cell.name,
        "model": catalog.model(cell.model).to_dict(),
        "gpu": catalog.gpu(cell.gpu).to_dict(),
        "benchmark": benchmark.cell_options(),
        "launcher": launcher.job_options(),
        "outputs": {"result": str(result), "steps": str(steps)},
    }
    if launcher.kind == "slurm" and site:
        spec["slurm"] = gpu_settings(site, cell.gpu)
    return spec
