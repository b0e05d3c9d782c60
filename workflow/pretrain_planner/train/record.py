"""The closed loop's record: a train run's sustained throughput beside the benchmark's prediction for the same
setting (plan.json's `measured`), with their ratios, and what a restart of the run costs (its start-up and checkpoint
writes and reads); throughput.md and throughput.csv. Imports no torch."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.results import atomic_write_text
from pretrain_planner.tables.markdown import csv_text, table

COLUMNS = ["quantity", "train", "prediction", "ratio", "meaning"]
# COLUMNS as throughput.md heads them
MD_COLUMNS = ["quantity", "train", "prediction", "ratio (train / prediction)", "meaning"]
RESTART_COLUMNS = ["quantity", "train", "meaning"]  # a restart's costs: no prediction beside them


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


MEANING = {
    "step_time_s": "seconds per optimizer step (ratio > 1: slower than predicted)",
    "samples_per_s": "samples per second (ratio < 1: slower than predicted)",
    "tokens_per_s": "tokens per second (ratio < 1: slower than predicted)",
}


RESTART_MEANING = {
    "startup_s": "seconds the last start took before it trained: process start -> ranks up, model build, method "
    "wrapping, data, compile (result.json `startup`)",
    "compile_s": "seconds the last start's first step took over the run's median step (torch.compile's, warm-up)",
    "checkpoint_write_s": "mean seconds per checkpoint write (rank 0: state dicts, torch.save, rename)",
    "checkpoint_read_s": "mean seconds of a resume's checkpoint read (-: never resumed)",
    "checkpoint_bytes": "bytes of the checkpoint on disk after the last write (checkpoint.pt + DeepSpeed shards)",
}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    t = result["throughput"]
    pred, ratio = t.get("prediction") or {}, t.get("ratio") or {}
    return [
        {"quantity": k, "train": t.get(k), "prediction": pred.get(k), "ratio": ratio.get(k), "meaning": MEANING[k]}
        for k in ("step_time_s", "samples_per_s", "tokens_per_s")
    ]


def restart_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """What a restart of the run costs (result.json `startup` and `checkpoint`; none in an older result): no
    prediction beside them."""
    up, ck = result.get("startup") or {}, result.get("checkpoint") or {}
    values = {"startup_s": up.get("total_s"), "compile_s": up.get("compile_s"), "checkpoint_write_s": ck.get("write_s"),
              "checkpoint_read_s": ck.get("read_s"), "checkpoint_bytes": ck.get("bytes")}  # fmt: skip
    if not up and not ck:
        return []
    return [{"quantity": k, "train": v, "prediction": None, "ratio": None, "meaning": RESTART_MEANING[k]}
            for k, v in values.items()]  # fmt: skip


def write_tables(out_dir: str | Path, result: dict[str, Any]) -> tuple[Path, Path]:
    """throughput.csv and throughput.md in the run's folder."""
    out = Path(out_dir)
    rs, restart = rows(result), restart_rows(result)
    csv_path, md_path = out / layout.THROUGHPUT_CSV, out / layout.THROUGHPUT_MD
    atomic_write_text(csv_path, csv_text(COLUMNS, ([r[c] for c in COLUMNS] for r in rs + restart)))
    t = result["throughput"]
    lines = [
        f"# Train run vs the benchmark's prediction: {result['model']} on {result['nodes']}x{result['gpus_per_node']} "
        f"{result['gpu']}, method {result['method']}",
        "",
        f"Sustained over the whole run after warm-up: {t['steps_timed']} of {t['steps_total']} steps "
        f"({t['warmup_steps']} warm-up steps left out); the prediction is plan.json's `measured` "
        f"(the benchmark cell's median step). Micro-batch {result['micro_batch']} x {result['grad_accum_steps']} "
        f"accumulation x {result['world_size']} ranks; data: {result['data']['label']}.",
        "",
        table(MD_COLUMNS, ([r[c] for c in COLUMNS] for r in rs)).rstrip("\n"),
    ]
    if restart:
        ck, starts = result.get("checkpoint") or {}, result.get("starts") or []
        lines += [
            "",
            "## What a restart costs",
            "",
            f"{len(starts)} start(s) of this run (at step {', '.join(str(s.get('step')) for s in starts) or '-'}), "
            f"{ck.get('writes', 0)} checkpoint write(s) ({ck.get('writes_timed', 0)} timed), {ck.get('reads', 0)} "
            "read(s); a job that resumes pays the start-up and the read.",
            "",
            table(RESTART_COLUMNS, ([r[c] for c in RESTART_COLUMNS] for r in restart)).rstrip("\n"),
        ]
    for note in result.get("notes") or []:
        lines += ["", f"Note: {note}"]
    atomic_write_text(md_path, "\n".join(lines) + "\n")
    return csv_path, md_path
