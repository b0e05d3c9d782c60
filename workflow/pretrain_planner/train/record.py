"""The closed loop's record: a train run's sustained throughput beside the benchmark's prediction for the same
setting (plan.json's `measured`), with their ratios; throughput.md and throughput.csv. Imports no torch."""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.results import atomic_write_text

COLUMNS = ["quantity", "train", "prediction", "ratio", "meaning"]


def sustained(
    steps: list[dict[str, Any]], global_batch: int, tokens_per_sample: int | None, measured: dict[str, Any] | None
) -> dict[str, Any]:
    """From a run's step records (steps.jsonl; those marked `warmup` -- the first steps after each start or
    resume -- left out): the sustained step time over the whole run (total time / steps), its median, samples and
    tokens per second; beside the benchmark's `step_time_s`, `samples_per_s`, `tokens_per_s`, and the ratios
    train / prediction (step time above 1: slower than predicted; throughput above 1: faster)."""
    timed = [float(s["step_time_s"]) for s in steps if not s.get("warmup")]
    out: dict[str, Any] = {"steps_total": len(steps), "steps_timed": len(timed)}
    out["warmup_steps"] = len(steps) - len(timed)
    if not timed:
        return {**out, "step_time_s": None, "note": "no step after warm-up: nothing to compare"}
    mean = sum(timed) / len(timed)
    out.update(
        step_time_s=mean,
        step_time_median_s=statistics.median(timed),
        samples_per_s=global_batch / mean,
        tokens_per_s=global_batch * tokens_per_sample / mean if tokens_per_sample else None,
    )
    m = measured or {}
    pred = {k: m.get(k) for k in ("step_time_s", "samples_per_s", "tokens_per_s")}
    out["prediction"] = pred
    out["ratio"] = {k: (out[k] / pred[k] if out.get(k) is not None and pred.get(k) else None) for k in pred}
    return out


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


MEANING = {
    "step_time_s": "seconds per optimizer step (ratio > 1: slower than predicted)",
    "samples_per_s": "samples per second (ratio < 1: slower than predicted)",
    "tokens_per_s": "tokens per second (ratio < 1: slower than predicted)",
}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    t = result["throughput"]
    pred, ratio = t.get("prediction") or {}, t.get("ratio") or {}
    return [
        {"quantity": k, "train": t.get(k), "prediction": pred.get(k), "ratio": ratio.get(k), "meaning": MEANING[k]}
        for k in ("step_time_s", "samples_per_s", "tokens_per_s")
    ]


def write_tables(out_dir: str | Path, result: dict[str, Any]) -> tuple[Path, Path]:
    """throughput.csv and throughput.md in the run's folder."""
    out = Path(out_dir)
    rs = rows(result)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(rs)
    csv_path, md_path = out / layout.THROUGHPUT_CSV, out / layout.THROUGHPUT_MD
    atomic_write_text(csv_path, buf.getvalue())
    t = result["throughput"]
    lines = [
        f"# Train run vs the benchmark's prediction: {result['model']} on {result['nodes']}x{result['gpus_per_node']} "
        f"{result['gpu']}, method {result['method']}",
        "",
        f"Sustained over the whole run after warm-up: {t['steps_timed']} of {t['steps_total']} steps "
        f"({t['warmup_steps']} warm-up steps left out); the prediction is plan.json's `measured` "
        f"(the benchmark cell's median step). Micro-batch {result['micro_batch_size']} x {result['grad_accum_steps']} "
        f"accumulation x {result['world_size']} ranks; data: {result['data']['label']}.",
        "",
        "| quantity | train | prediction | ratio (train / prediction) | meaning |",
        "|---|---|---|---|---|",
    ]
    for r in rs:
        lines.append(f"| {r['quantity']} | {_fmt(r['train'])} | {_fmt(r['prediction'])} | {_fmt(r['ratio'])} | "
                     f"{r['meaning']} |")  # fmt: skip
    for note in result.get("notes") or []:
        lines += ["", f"Note: {note}"]
    atomic_write_text(md_path, "\n".join(lines) + "\n")
    return csv_path, md_path
