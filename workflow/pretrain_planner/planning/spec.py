"""Everything a cell's job needs, as plain JSON data: the job never reads config files. Imports no torch."""

from __future__ import annotations

from typing import Any

from pretrain_planner.planning.catalog import Catalog
from pretrain_planner.planning.grid import Cell
from pretrain_planner.planning.site import gpu_settings
from pretrain_planner.schema import section


def cell_spec(
    cell: Cell,
    catalog: Catalog,
    config: dict[str, Any],
    result: str,
    steps: str,
    site: dict[str, Any] | None = None,
    benchmark: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything a cell's job needs, as plain JSON data (the job never reads config files). `benchmark`: the
    config's benchmark section with its defaults, when the caller has it (a plan asks it for every cell)."""
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
        "benchmark": benchmark if benchmark is not None else section("config", "benchmark", config["benchmark"]),
        "launcher": {k: v for k, v in config["launcher"].items() if k != "site"},
        "outputs": {"result": str(result), "steps": str(steps)},
    }
    if config["launcher"]["kind"] == "slurm" and site:
        spec["slurm"] = gpu_settings(site, cell.gpu)
    return spec
