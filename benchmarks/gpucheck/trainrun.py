"""P5: the train stage run from an exported plan, without Snakemake or polars. The plan is exported from a measured
cell by the export's own piece (`tables.export.write_plan`, from the cell's result.json and spec.json, as the export
rule writes it from time_to_train), then `python -m pretrain_planner.train plan.json` trains it for a few hundred
steps; its sustained step (train/record.py: warm-up left out, data loading included) against the plan's prediction.
Imports no torch (the train stage runs in its own process)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.planning.catalog import Catalog, ModelSpec
from pretrain_planner.tables.export import MEASURED, write_plan

from .sustain import TARGET


def model_as_measured(catalog: Catalog, spec_model: dict[str, Any], compile_model: bool = True) -> ModelSpec:
    """The catalog's model with the overrides the cell ran (global batch, precision, compile), checked to be
    exactly the spec's model: the plan trains what was measured (a cell left eager, `compile_model` False, exports
    a model that is not compiled)."""
    base = catalog.model(spec_model["name"])
    r = spec_model["recipe"]
    compiled = bool(spec_model["supports_compile"]) and compile_model
    model = dataclasses.replace(
        base,
        supports_compile=compiled,
        recipe=dataclasses.replace(base.recipe, global_batch=r["global_batch"], precision=r["precision"]),
    )
    want = {**spec_model, "supports_compile": compiled}
    if model.to_dict() != want:
        differ = sorted(k for k, v in model.to_dict().items() if want.get(k) != v)
        raise ValueError(f"the cell's model differs from {base.name} beyond its batch, precision and compile: {differ}")
    return model


def export_from_cell(record: dict[str, Any], catalog: Catalog, target: Path) -> dict[str, Any]:
    """Write the plan of a measured cell (its record: result.json and the folder with spec.json) into `target`;
    the export's index fields (a README instead of a plan where the cell's settings differ from the plan's)."""
    result = record["result"]
    spec = json.loads((Path(record["folder"]) / "spec.json").read_text())
    model = model_as_measured(catalog, spec["model"], spec.get("compile_model", True))
    row = {
        "model": result["model"],
        "gpu": result["gpu"],
        "nodes": result["nodes"],
        "gpus_per_node": result["gpus_per_node"],
        "best_method": result["method"],
        **{k: result.get(k) for k in MEASURED},
    }
    target.mkdir(parents=True, exist_ok=True)
    return write_plan(target, model, catalog.gpu(result["gpu"]), row, result.get("method_settings"))


def run_train(
    record: dict[str, Any], catalog: Catalog, part_dir: Path, steps: int, threads: int, deadline: float, python: str
) -> dict[str, Any]:
    """Export the cell's plan and train it for `steps` steps (stopped at `deadline`); the P5 record."""
    rec: dict[str, Any] = {
        "label": f"train stage: {record['label']}",
        "of": record["label"],
        "steps": steps,
        "plan": {"kind": "train"},
    }
    t0 = time.time()
    plan_dir = part_dir / "plan"
    entry = export_from_cell(record, catalog, plan_dir)
    rec["export"] = entry
    if not (plan_dir / layout.PLAN_FILE).is_file():
        rec.update(status="no plan", reason=entry.get("note"))
        return rec
    out = part_dir / "train"
    cmd = [
        python,
        "-m",
        "pretrain_planner.train",
        str(plan_dir / layout.PLAN_FILE),
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--threads",
        str(threads),
        "--log-every",
        "25",
        "--checkpoint-every-min",
        "100000",
    ]
    rec["command"] = " ".join(cmd)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = part_dir / "train_stage.log"
    try:
        with log.open("w") as fh:
            proc = subprocess.run(
                cmd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=max(1.0, deadline - t0),
                start_new_session=True,
            )
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        code = None
    rec["wall_s"] = round(time.time() - t0, 1)
    tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
    if code != 0:
        why = "stopped at the part's deadline" if code is None else f"exit status {code}"
        rec.update(status="timeout" if code is None else "error", reason=f"the train stage: {why}", log_tail=tail)
        return rec
    res = json.loads((out / layout.RESULT).read_text())
    t = res["throughput"]
    ratio = (t.get("ratio") or {}).get("step_time_s")
    rec.update(
        status=res["status"],
        trained_steps=res["steps"],
        throughput=t,
        ratio=ratio,
        within_target=ratio is not None and abs(ratio - 1) <= TARGET,
        settings_differences=res.get("settings_differences"),
        notes=res.get("notes"),
        data=res["data"]["label"],
        method=res["method"],
        micro_batch=res["micro_batch"],
        accum=res["grad_accum_steps"],
    )
    with_ckpt = out / layout.TRAIN_RUN / "checkpoint.pt"
    if with_ckpt.is_file():  # GBs for a real model: not a report
        rec["checkpoint_bytes"] = with_ckpt.stat().st_size
        with_ckpt.unlink()
    return rec
