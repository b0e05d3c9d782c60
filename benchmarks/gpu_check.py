#!/usr/bin/env python
"""Every method's GPU path, for real, on one NVIDIA GPU: the status sweep of benchmarks/gpu_all.py on its own.

Every method on Pythia-160M, cheapest first (issue 14's two-rank cells skipped with the reason on one GPU), the OOM
probe (Pythia-1B `naive` at micro-batch 128: the search must hit CUDA OOM and back off) and the timing-honesty check;
each group of cells in its own worker process (the risky paths alone), a cap per cell, `--lanes` processes at once
(statuses, not timings, when more than one). The pieces are benchmarks/gpucheck/ (plans, cells, checks, honesty,
runner, report).

    python benchmarks/gpu_check.py --out $OUT/gpu_check.md                      (GPU)
    .venv/bin/python benchmarks/gpu_check.py --smoke --out /tmp/gpu_check.md    (CPU, tiny models: the script)

Writes the Markdown report to --out and every record beside it (.json); exit status 0 if every cell that ran passed
its checks, 1 otherwise, 2 without a GPU (outside --smoke).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "benchmarks", REPO / "workflow"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from gpucheck import plans as P  # noqa: E402
from gpucheck import timeplan  # noqa: E402
from gpucheck.cells import Settings  # noqa: E402
from gpucheck.checks import cross_checks  # noqa: E402
from gpucheck.envinfo import gpu_count, gpu_type  # noqa: E402
from gpucheck.report import SHORT_COLUMNS, cell_table, failed, render_part  # noqa: E402
from gpucheck.runner import Runner  # noqa: E402


def all_plans(smoke: bool) -> list[P.Plan]:
    if smoke:
        return [
            *P.status_plans("tiny-gptneox", 2, smoke=True),
            *P.multi_plans("tiny-gptneox", 4, smoke=True),
            P.Plan("tiny-bert/fl+flce", "tiny-bert", "fl+flce", 2, compile=False),
            P.oom_probe(True),
            P.honesty_plan(True),
        ]
    return [
        *P.status_plans("pythia-160m", P.STATUS_CAP["pythia-160m"], smoke=False),
        *P.multi_plans("pythia-160m", 8, smoke=False),
        P.oom_probe(False),
        P.honesty_plan(False),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny models (GPU type `cpu`): checks the script itself")
    p.add_argument("--out", default=str(REPO / "benchmarks/results/gpu_check.md"), help="the report (.json beside)")
    p.add_argument("--cells-dir", default=os.path.join(tempfile.gettempdir(), "gpu_check_cells"))
    p.add_argument("--cells", default=None, help="comma-separated substrings of the labels to run (default: all)")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop (and skip what is left) after this long")
    p.add_argument("--lanes", type=int, default=None, help="worker processes at once (default 3; smoke 2)")
    p.add_argument("--warmup-steps", type=int, default=1)
    p.add_argument("--timed-steps", type=int, default=3)
    p.add_argument("--accum-factor", type=int, default=2, help="global batch = this x the micro-batch cap")
    p.add_argument("--max-micro-batch", type=int, default=None, help="every cap but the OOM probe's")
    p.add_argument("--gpu-type", default=None, help="GPU type of config/gpus.yaml (default: GPU 0's, else h200)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pretrain_planner.planning.catalog import load_catalog

    if not args.smoke and not gpu_count():
        print("gpu_check: no CUDA device visible (nvidia-smi); --smoke checks the script on a CPU", file=sys.stderr)
        return 2
    t0 = time.time()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lanes = args.lanes or (2 if args.smoke else 3)
    catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    s = Settings(
        smoke=args.smoke,
        gpu="cpu" if args.smoke else args.gpu_type or gpu_type(catalog),
        warmup_steps=args.warmup_steps,
        timed_steps=args.timed_steps,
        accum_factor=args.accum_factor,
        threads=1 if args.smoke else max(1, len(os.sched_getaffinity(0)) // lanes),  # smoke: see gpu_all.py
        cells_dir=args.cells_dir,
        max_micro_batch=args.max_micro_batch,
    )
    plans = all_plans(args.smoke)
    if args.cells:
        wanted = [w.strip() for w in args.cells.split(",") if w.strip()]
        plans = [p for p in plans if any(w in p.label for w in wanted)]
    probes = [p for p in plans if p.expect_failed_trial or p.kind == "honesty"]  # alone: they fill or time the GPU
    sweep = [p for p in plans if p not in probes]
    records: list[dict] = []

    def log(msg: str) -> None:
        print(f"[gpu_check {time.time() - t0:6.1f}s] {msg}", flush=True)

    def on_record(rec: dict) -> None:
        records.append(rec)
        cross_checks(records)
        log(f"{rec['label']}: {rec['status']}" + (f" ({rec.get('reason')})" if rec.get("reason") else ""))
        header = [("command", " ".join(sys.argv)), ("elapsed s", f"{time.time() - t0:.0f} of {args.budget_s:.0f}")]
        out.write_text(render_part(f"GPU check of the trainer ({'smoke' if args.smoke else 'GPU'})", header, records))
        out.with_suffix(".json").write_text(json.dumps({"cells": records}, indent=1, default=str))

    folder = Path(args.cells_dir)
    folder.mkdir(parents=True, exist_ok=True)
    runner = Runner(
        folder,
        s,
        sys.executable,
        str(REPO / "config/models.yaml"),
        str(REPO / "config/gpus.yaml"),
        log,
        on_record,
        {p.label: timeplan.cap_s(p, catalog, s) for p in plans},
    )
    log(
        f"{len(plans)} cells, predicted {timeplan.groups_s(P.status_groups(sweep), catalog, s, lanes):.0f} s for the "
        f"sweep ({lanes} processes at once); report -> {out}"
    )
    deadline = t0 + args.budget_s
    runner.run(P.status_groups(sweep), deadline, lanes)
    if not args.smoke:  # alone on the machine: every core
        runner.settings = replace(s, threads=max(1, len(os.sched_getaffinity(0))))
    runner.run([[p] for p in probes], deadline, 1)
    print(cell_table([r for r in records if (r.get("plan") or {}).get("kind", "cell") == "cell"], SHORT_COLUMNS))
    bad = [r["label"] for r in records if failed(r)]
    log(f"done; report {out}" + (f"; PROBLEMS in {bad}" if bad else "; every cell that ran passed its checks"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
