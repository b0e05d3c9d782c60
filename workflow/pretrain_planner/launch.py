"""Hand a cell to an executor, wait for it, and make sure its result landed. Imports no torch.

Launchers: `local` (submitit LocalExecutor: one process per rank on this host, gloo on CPU),
`debug` (in the driver's own process, one rank: for tests; submitit's DebugExecutor is not used because
it swaps os.environ and opens pdb on failure, which breaks a threaded Snakemake driver), and `slurm`.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

from .catalog import Catalog
from .grid import Cell
from .job import CellJob


def cell_spec(cell: Cell, catalog: Catalog, config: dict[str, Any], result: str, steps: str) -> dict[str, Any]:
    """Everything a cell's job needs, as plain JSON data (the job never reads config files)."""
    return {
        "cell": {
            "model": cell.model,
            "gpu": cell.gpu,
            "nodes": cell.nodes,
            "gpus_per_node": cell.gpus_per_node,
            "method": cell.method,
        },
        "model": catalog.model(cell.model).to_dict(),
        "gpu": catalog.gpu(cell.gpu).to_dict(),
        "benchmark": dict(config["benchmark"]),
        "launcher": dict(config["launcher"]),
        "outputs": {"result": str(Path(result).resolve()), "steps": str(Path(steps).resolve())},
    }


class _Log:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")

    def __call__(self, msg: str) -> None:
        stamp = dt.datetime.now().isoformat(timespec="seconds")
        with self.path.open("a") as fh:
            fh.write(f"[{stamp}] {msg}\n")

    def append_file(self, title: str, path: Path) -> None:
        if path.is_file():
            with self.path.open("a") as fh:
                fh.write(f"----- {title}: {path}\n{path.read_text(errors='replace')}\n")


def _executor(kind: str, folder: Path, spec: dict[str, Any], threads: int):
    import submitit

    world = spec["cell"]["nodes"] * spec["cell"]["gpus_per_node"]
    timeout = spec["launcher"].get("timeout_min", 60)
    if kind == "local":
        ex = submitit.LocalExecutor(folder=folder)
        gpus = 0 if spec["cell"]["gpu"] == "cpu" or spec["benchmark"].get("device") == "cpu" else world
        ex.update_parameters(nodes=1, tasks_per_node=world, timeout_min=timeout, gpus_per_node=gpus)
        return ex
    raise ValueError(f"launcher {kind!r} is not available here (allowed: local, debug)")


def run_cell(spec: dict[str, Any], log_path: str, threads: int = 1) -> dict[str, Any]:
    """Run one cell to completion with the configured launcher; raise if it crashed (Snakemake retries)."""
    kind = spec["launcher"]["kind"]
    world = spec["cell"]["nodes"] * spec["cell"]["gpus_per_node"]
    spec = {**spec, "threads_per_rank": max(1, threads // max(1, world))}
    result_path = Path(spec["outputs"]["result"])
    log = _Log(log_path)
    log(f"cell {json.dumps(spec['cell'])} launcher={kind} threads={threads}")
    if kind == "debug":
        out = CellJob(spec)()
        log(f"finished in-process: status={out.get('status')}")
    else:
        folder = result_path.parent / "submitit"
        shutil.rmtree(folder, ignore_errors=True)  # logs of an earlier attempt of this cell
        job = _executor(kind, folder, spec, threads).submit(CellJob(spec))
        log(f"submitted job {job.job_id} ({kind}); logs in {folder}")
        try:
            outs = job.results()
        except Exception as exc:
            log(f"job {job.job_id} failed: {type(exc).__name__}")
            log.append_file("rank 0 stderr", job.paths.stderr)
            raise RuntimeError(f"cell {spec['cell']} failed in job {job.job_id}; see {log_path}") from exc
        finally:
            log.append_file("rank 0 stdout", job.paths.stdout)
        out = outs[0] if outs else {}
        log(f"job {job.job_id} done: status={out.get('status')}")
    if not result_path.is_file():
        raise RuntimeError(f"cell {spec['cell']} finished but wrote no {result_path}; see {log_path}")
    return out
