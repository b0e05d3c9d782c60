"""One plan in this process, through the trainer's own entry point (`trainer.run.run_rank`) with a spec built by
`planning.spec.cell_spec`, as a Snakemake cell job runs it; a two-rank plan as the local launcher starts its ranks
(benchmarks/multirank.py). Each cell's folder holds spec.json, result.json, steps.jsonl and record.json (what the
reports read)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pretrain_planner.planning.catalog import Catalog
from pretrain_planner.planning.configtypes import BenchmarkSection, LauncherSection
from pretrain_planner.planning.grid import Cell, invalid_reason
from pretrain_planner.planning.methods import ZERO_STAGE, parse
from pretrain_planner.planning.spec import cell_spec

from .plans import Plan, slug

FAKE_OOM_ENV = "PRETRAIN_PLANNER_FAKE_OOM_ABOVE"  # trainer.oom.FAKE_OOM_ENV (a test hook)


@dataclass(frozen=True)
class Settings:
    """What every cell of a run shares (the command line's choices)."""

    smoke: bool
    gpu: str  # the GPU type of the catalog (`cpu` in smoke mode)
    warmup_steps: int
    timed_steps: int
    accum_factor: int  # global batch = this x the cap, unless the plan sets it
    threads: int
    cells_dir: str
    max_micro_batch: int | None = None  # overrides every cap but the OOM probe's
    honesty_micro_batch: int | None = None
    visible_gpus: int = 1  # for the time plan (a two-rank cell on one GPU is skipped at once)

    @property
    def on_gpu(self) -> bool:
        return not self.smoke


def folder_of(settings: Settings, label: str) -> Path:
    return Path(settings.cells_dir) / slug(label)


def read_record(settings: Settings, label: str) -> dict[str, Any] | None:
    """The record a cell left (its worker's, or the runner's when the worker died), if any."""
    try:
        return json.loads((folder_of(settings, label) / "record.json").read_text())
    except (OSError, ValueError):
        return None


def write_record(settings: Settings, rec: dict[str, Any]) -> None:
    folder = folder_of(settings, rec["label"])
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "record.json.tmp"
    tmp.write_text(json.dumps(rec, indent=1, default=str))
    tmp.replace(folder / "record.json")


@contextlib.contextmanager
def environ(values: dict[str, str]):
    """Set environment variables for the duration of one cell."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cleanup() -> int | None:
    """Free what a cell left behind; return bytes still allocated on the GPU (a leak shows here)."""
    import torch

    with contextlib.suppress(Exception):
        import torch._dynamo

        # Cells share GPTNeoX's forward code object: without a reset, dynamo's per-code cache would carry
        # guards (and graphs) of earlier models into later cells and could hit its recompile limit.
        torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    return None


@contextlib.contextmanager
def recorded(rec: dict[str, Any]) -> Iterator[None]:
    """Around one cell's work: its wall time and what the GPU still holds after the cleanup go into `rec`; an
    exception becomes status `error` with the traceback (`skipped` for Skip), so the cells after it still run."""
    t0 = time.perf_counter()
    try:
        yield
    except Skip as exc:
        rec.update(status="skipped", reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - one failing cell must not stop the others
        rec.update(status="error", error=f"{type(exc).__name__}: {exc}"[:2000],
                   traceback=traceback.format_exc()[-6000:])  # fmt: skip
    finally:
        rec["cell_wall_s"] = round(time.perf_counter() - t0, 1)
        try:
            rec["gpu_bytes_left_after_cleanup"] = cleanup()
        except Exception as exc:  # noqa: BLE001 - a poisoned CUDA context shows here
            rec["cleanup_error"] = f"{type(exc).__name__}: {exc}"[:500]


def make_spec(plan: Plan, catalog: Catalog, s: Settings, folder: Path) -> tuple[dict, dict]:
    """The cell's spec (planning.spec.cell_spec) with the plan's overrides, and what was overridden."""
    cap = plan.cap if s.max_micro_batch is None or plan.expect_failed_trial else s.max_micro_batch
    config = {
        "benchmark": {
            "warmup_steps": plan.warmup_steps if plan.warmup_steps is not None else s.warmup_steps,
            "timed_steps": plan.timed_steps if plan.timed_steps is not None else s.timed_steps,
            "max_micro_batch": cap,
            "seed": 0,
            **({"max_spread": 50.0} if s.smoke else {}),  # smoke: CPU wiring on a shared machine, not timing
        },
        "launcher": {"kind": "debug" if plan.ranks == 1 else "local", "timeout_min": 20},
    }
    cell = Cell(plan.model, s.gpu, 1, plan.ranks, plan.method)
    typed = BenchmarkSection.given(config["benchmark"]), LauncherSection.given(config["launcher"])
    spec = cell_spec(cell, catalog, *typed, str(folder / "result.json"), str(folder / "steps.jsonl"))
    recipe = spec["model"]["recipe"]
    recipe_gb = recipe["global_batch"]
    gb = plan.global_batch or s.accum_factor * cap * plan.ranks
    recipe["global_batch"] = gb
    spec["threads_per_rank"] = s.threads
    override: dict[str, Any] = {
        "recipe_global_batch": recipe_gb,
        "global_batch": gb,
        "max_micro_batch": cap,
        "warmup_steps": config["benchmark"]["warmup_steps"],
        "timed_steps": config["benchmark"]["timed_steps"],
    }
    if s.smoke and recipe["precision"] != "fp32" and parse(plan.method).sharding not in ZERO_STAGE:
        # bf16 autocast on a CPU is ~5x slower than fp32 (no bf16 matmul units): keep the smoke short.
        # ZeRO cells keep bf16 (DeepSpeed's own bf16 path, fast here); the GPU run checks every precision.
        override["precision"] = f"fp32 (recipe: {recipe['precision']})"
        recipe["precision"] = "fp32"
    if plan.compile is False and spec["model"]["supports_compile"]:
        spec["compile_model"] = False  # the model stays eager; `cstep` still compiles its optimizer step
        override["compile_model"] = False
    elif plan.compile and not spec["model"]["supports_compile"]:
        spec["model"]["supports_compile"] = True
        override["supports_compile"] = True
    return spec, override


def rank_worker(payload: dict[str, Any]) -> dict[str, Any]:
    """One rank of a multi-rank plan (run by benchmarks/multirank.py): the trainer's entry point."""
    from pretrain_planner.trainer.run import run_rank

    out = run_rank(payload["spec"])
    return {"rank": out["rank"]}


class Skip(Exception):
    """The plan cannot run here (too few GPUs): skipped, with the reason."""


def _visible_gpus() -> list[str]:
    import torch

    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        return [d.strip() for d in env.split(",") if d.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def _run_multi(plan: Plan, spec: dict[str, Any], on_gpu: bool, cells_dir: Path) -> None:
    """Run a plan's ranks as separate processes; raise if a rank failed."""
    from multirank import failure, run_ranks

    gpus = _visible_gpus() if on_gpu else []
    if on_gpu and len(gpus) < plan.ranks:
        raise Skip(f"needs {plan.ranks} GPUs, {len(gpus)} visible")

    def extra_env(rank: int) -> dict[str, str]:
        env = {FAKE_OOM_ENV: plan.fake_oom} if plan.fake_oom else {}
        if on_gpu and plan.one_gpu_per_task:
            env["CUDA_VISIBLE_DEVICES"] = gpus[rank]
        return env

    recs = run_ranks(
        "gpucheck.cells:rank_worker", plan.ranks, {"spec": spec}, 300 if on_gpu else 150, extra_env, cells_dir
    )
    why = next(filter(None, map(failure, recs)), None)
    if why:
        raise RuntimeError(why)


def run_cell(plan: Plan, catalog: Catalog, s: Settings) -> dict[str, Any]:
    """Run one cell plan; its record (status, result.json, steps.jsonl, what was overridden, wall time)."""
    from pretrain_planner.trainer.run import run_rank

    rec: dict[str, Any] = {"label": plan.label, "plan": plan.to_json(), "status": None}
    cell = Cell(plan.model, s.gpu, 1, plan.ranks, plan.method)
    reason = invalid_reason(cell, catalog.model(plan.model), catalog.gpu(s.gpu), "debug", catalog)
    folder = folder_of(s, plan.label)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    spec, override = make_spec(plan, catalog, s, folder)
    (folder / "spec.json").write_text(json.dumps(spec, indent=1))
    rec.update(
        override=override,
        spec_cell=spec["cell"],
        supports_compile=spec["model"]["supports_compile"] and spec.get("compile_model", True),  # as the cell ran
        folder=str(folder),
    )
    if reason and not plan.run_invalid:
        rec.update(status="skipped", reason=f"invalid cell: {reason}")
        return rec
    if reason:
        rec["grid_reason"] = f"run anyway (the grid rules it out of sweeps: {reason})"
    fake = {FAKE_OOM_ENV: str(plan.fake_oom_above)} if plan.fake_oom_above is not None else {}
    with recorded(rec):
        if plan.ranks > 1:
            spec = {**spec, "threads_per_rank": max(1, s.threads // plan.ranks)}
            _run_multi(plan, spec, s.on_gpu, Path(s.cells_dir))
        else:
            with environ(fake):
                run_rank(spec)
        result_path, steps_path = Path(spec["outputs"]["result"]), Path(spec["outputs"]["steps"])
        if not result_path.is_file():
            raise RuntimeError(f"run_rank returned but wrote no {result_path}")
        result = json.loads(result_path.read_text())
        lines = steps_path.read_text().splitlines() if steps_path.is_file() else []
        rec.update(status=result["status"], result=result, steps=[json.loads(ln) for ln in lines if ln.strip()])
    return rec
