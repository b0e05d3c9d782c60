#!/usr/bin/env python
"""How well does the pipeline's short measurement predict a long run? Relative error per cell.

For each model: the pipeline's own measurement (`trainer.run.run_rank`, as a Snakemake cell job runs it:
micro-batch search, warm-up, a few timed whole steps, median), then a sustained run of `--steps` (>= 100)
optimizer steps on a fresh instance with identical settings (the measured micro-batch and accumulation,
same method, same batches), timed as one block between two device synchronisations. Error =
predicted / sustained - 1. Target on GPU: within +-3% for Pythia-160M/410M/1B.

    GPU:   python benchmarks/accuracy.py --out $OUT/accuracy.md
    CPU:   .venv/bin/python benchmarks/accuracy.py --smoke --out /tmp/accuracy.md   (checks the script)

The recipe's global batch is overridden to `--accum` x the micro-batch cap (recorded), so 100 steps fit in
minutes; the prediction and the sustained run use the same override, so the comparison is like for like.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
if str(REPO / "workflow") not in sys.path:
    sys.path.insert(0, str(REPO / "workflow"))

from gpucheck.cells import cleanup  # noqa: E402  (the GPU check's pieces; benchmarks/ is on sys.path)
from gpucheck.sustain import TARGET, sustained  # noqa: E402
from pretrain_planner.planning.catalog import Catalog, load_catalog  # noqa: E402
from pretrain_planner.planning.configtypes import BenchmarkSection, LauncherSection  # noqa: E402
from pretrain_planner.planning.grid import Cell  # noqa: E402
from pretrain_planner.planning.spec import cell_spec  # noqa: E402
from pretrain_planner.tables import markdown  # noqa: E402

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[accuracy {time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def make_spec(model: str, args: argparse.Namespace, catalog: Catalog, folder: Path) -> dict[str, Any]:
    config = {
        "benchmark": {
            "warmup_steps": args.warmup_steps,
            "timed_steps": args.timed_steps,
            "max_micro_batch": args.max_micro_batch,
            "seed": 0,
            **({"max_spread": 50.0} if args.smoke else {}),  # smoke: CPU wiring on a shared machine, not timing
        },
        "launcher": {"kind": "debug", "timeout_min": 30},
    }
    cell = Cell(model, args.gpu_type, 1, 1, args.method)
    typed = BenchmarkSection.given(config["benchmark"]), LauncherSection.given(config["launcher"])
    spec = cell_spec(cell, catalog, *typed, str(folder / "result.json"), str(folder / "steps.jsonl"))
    spec["model"]["recipe"]["global_batch"] = args.accum * args.max_micro_batch
    spec["threads_per_rank"] = args.threads
    if args.smoke:  # bf16 autocast on a CPU is ~5x slower than fp32
        spec["model"]["recipe"]["precision"] = "fp32"
    return spec


def run_model(model: str, args: argparse.Namespace, catalog: Catalog) -> dict[str, Any]:
    from pretrain_planner.trainer.run import run_rank

    folder = Path(args.cells_dir) / model
    spec = make_spec(model, args, catalog, folder)
    rec: dict[str, Any] = {
        "model": model,
        "method": args.method,
        "global_batch": spec["model"]["recipe"]["global_batch"],
    }
    t = time.perf_counter()
    try:
        run_rank(spec)
        result = json.loads(Path(spec["outputs"]["result"]).read_text())
        rec["measure_wall_s"] = time.perf_counter() - t
        rec["result"] = {k: result.get(k) for k in ("status", "reason", "micro_batch", "grad_accum_steps")}
        rec["status"] = result["status"]
        if result["status"] != "ok":
            rec["reason"] = result.get("reason")
            return rec
        rec["predicted"] = {
            k: result[k] for k in ("step_time_s", "step_time_p10_s", "step_time_p90_s", "timed_steps", "warmup_steps")
        }
        rec["attention_kernel"] = (result.get("method_settings") or {}).get("attention_kernel")
        t = time.perf_counter()
        rec["sustained"] = sustained(spec, result["micro_batch"], args.steps, args.warmup_steps)
        rec["sustained_wall_s"] = time.perf_counter() - t
        rec["error"] = result["step_time_s"] / rec["sustained"]["mean_step_s"] - 1
        rec["within_target"] = abs(rec["error"]) <= TARGET
    except Exception as exc:  # noqa: BLE001 - one model's failure must not stop the others
        rec.update(status="error", error_text=f"{type(exc).__name__}: {exc}"[:1000], traceback=traceback.format_exc())
    finally:
        cleanup()
    return rec


def render(meta: dict[str, Any], records: list[dict[str, Any]]) -> str:
    lines = [
        f"# Accuracy of the predicted step time ({meta['mode']})\n",
        f"{meta['date_utc']}, {meta['device']}, torch {meta['torch']}; command `{meta['command']}`\n",
        f"Prediction: the pipeline's measurement (run_rank: search, {meta['warmup_steps']} warm-up + "
        f"{meta['timed_steps']} timed steps, median). Sustained: {meta['steps']} optimizer steps on a fresh "
        f"instance, same micro-batch, accumulation and method, {meta['warmup_steps']} warm-up dropped, timed as one "
        f"block. Global batch = {meta['accum']} x micro-batch cap {meta['max_micro_batch']}. Target: +-{TARGET:.0%}"
        + (" (on GPU; CPU timings on a shared machine are noise)" if meta["mode"].startswith("smoke") else "")
        + ".\n",
    ]
    table = []
    for rec in records:
        p, s, r = rec.get("predicted") or {}, rec.get("sustained") or {}, rec.get("result") or {}
        err = rec.get("error")
        status = rec.get("status")
        if status != "ok":
            status = f"{status}: {rec.get('reason') or rec.get('error_text') or ''}"[:200]
        predicted = f"{p['step_time_s']:.4f} ({p['step_time_p10_s']:.4f}-{p['step_time_p90_s']:.4f})" if p else "–"
        within = "yes" if rec.get("within_target") else ("no" if "within_target" in rec else "–")
        table.append([
            rec["model"],
            rec["method"],
            status,
            f"{r.get('micro_batch', '–')} x {r.get('grad_accum_steps', '–')}",
            predicted,
            f"{s['mean_step_s']:.4f}" if s else "–",
            str(s.get("steps", "–")),
            f"{err:+.2%}" if isinstance(err, float) else "–",
            within,
            rec.get("attention_kernel") or "–",
            f"{rec.get('measure_wall_s', 0):.0f} + {rec.get('sustained_wall_s', 0):.0f}",
        ])  # fmt: skip
    columns = ["model", "method", "status", "micro-batch x accum", "predicted step s (p10-p90)",
               "sustained mean step s", "steps", "error", "within target", "attention kernel",
               "wall s (measure + sustained)"]  # fmt: skip
    lines += [*markdown.plain(columns, table), ""]
    for rec in records:
        if rec.get("traceback"):
            lines.append(f"## {rec['model']}: error\n\n```\n{rec['traceback'][-4000:]}\n```\n")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny-gptneox, few steps: checks the script")
    p.add_argument("--models", default=None, help="comma-separated (default pythia-160m,pythia-410m,pythia-1b)")
    p.add_argument("--method", default="fl")
    p.add_argument("--gpu-type", default=None, help="default h200 (smoke: cpu)")
    p.add_argument("--steps", type=int, default=None, help="sustained optimizer steps (default 100; smoke 6)")
    p.add_argument("--warmup-steps", type=int, default=None, help="default 2 (the pipeline's); smoke 1")
    p.add_argument("--timed-steps", type=int, default=None, help="the measurement's timed steps (default 5)")
    p.add_argument("--max-micro-batch", type=int, default=None, help="micro-batch cap (default 16; smoke 2)")
    p.add_argument("--accum", type=int, default=2, help="global batch = accum x cap (default 2)")
    p.add_argument("--budget-s", type=float, default=600.0, help="skip the remaining models after this")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--out", default=str(REPO / "benchmarks/results/accuracy.md"))
    p.add_argument("--cells-dir", default=os.path.join(tempfile.gettempdir(), "accuracy_cells"))
    p.add_argument("--models-yaml", default=str(REPO / "config/models.yaml"))
    p.add_argument("--gpus-yaml", default=str(REPO / "config/gpus.yaml"))
    args = p.parse_args(argv)
    smoke = args.smoke
    args.models = args.models or ("tiny-gptneox" if smoke else "pythia-160m,pythia-410m,pythia-1b")
    args.gpu_type = args.gpu_type or ("cpu" if smoke else "h200")
    args.steps = args.steps or (6 if smoke else 100)
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else (1 if smoke else 2)
    args.timed_steps = args.timed_steps or (3 if smoke else 5)
    args.max_micro_batch = args.max_micro_batch or (2 if smoke else 16)
    if smoke and args.method == "fl":
        args.method = "naive"  # no CPU compile (~40 s) in a smoke
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("accuracy: no CUDA device visible; use --smoke to check the script on the CPU", file=sys.stderr)
        return 2
    catalog = load_catalog(args.models_yaml, args.gpus_yaml)
    meta = {
        "mode": "smoke (CPU, tiny model)" if args.smoke else "GPU",
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0)
        if torch.cuda.is_available() and not args.smoke
        else platform.processor() or "CPU",
        "torch": torch.__version__,
        "command": " ".join([sys.executable, *sys.argv]),
        **{k: getattr(args, k) for k in ("steps", "warmup_steps", "timed_steps", "accum", "max_micro_batch")},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        if time.perf_counter() - T0 > args.budget_s:
            records.append({"model": model, "method": args.method, "status": "skipped", "reason": "time budget"})
            log(f"SKIP {model}: time budget of {args.budget_s:.0f} s used up")
            continue
        log(f"{model} / {args.method}: measuring, then {args.steps} sustained steps ...")
        rec = run_model(model, args, catalog)
        records.append(rec)
        log(
            f"  -> {rec.get('status')}"
            + (
                f": predicted {rec['predicted']['step_time_s']:.4f} s, sustained "
                f"{rec['sustained']['mean_step_s']:.4f} s, error {rec['error']:+.2%}"
                if "error" in rec
                else f" ({rec.get('reason') or rec.get('error_text')})"
            )
        )
        out.write_text(render(meta, records))
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1, default=str))
    text = render(meta, records)
    out.write_text(text)
    print(text, flush=True)
    bad = [r for r in records if r.get("status") not in ("ok", "skipped", "unsupported")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
