"""The closed loop on CPU: does a real train run sustain the step time the benchmark predicted for its setting?

One benchmark sweep of a tiny model (the pipeline itself, `snakemake ... results/optimal`: the benchmark cell
measures, the export writes plan.json), then several train runs of that plan (`python -m pretrain_planner.train`,
the same threads per rank as the cell), each compared with plan.json's `measured.step_time_s`: the sustained step
time after warm-up over the whole run, and the ratio train / prediction. Writes
benchmarks/results/train_vs_prediction.md (date, machine, versions, the ratios).

    .venv/bin/python benchmarks/train_vs_prediction.py [--model tiny-gptneox] [--runs 3] [--steps 40]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
from pretrain_planner.tables import markdown  # noqa: E402

BIN = Path(sys.executable).parent


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), platform.machine())
    except OSError:
        return platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny-gptneox")
    ap.add_argument("--method", default="naive")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/train_vs_prediction.md"))
    args = ap.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "workflow")}
    work = Path(tempfile.mkdtemp(prefix="train-vs-pred-"))
    cfg = {"sweep": {"models": [args.model], "gpus": ["cpu"], "methods": [args.method]},
           "launcher": {"kind": "local", "timeout_min": 20}}  # fmt: skip
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    t0 = time.time()
    proc = subprocess.run([str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(work), "--configfile",
                           str(work / "c.yaml"), "-c1", "results/optimal"], capture_output=True, text=True, env=env,
                          cwd=work)  # fmt: skip
    if proc.returncode:
        print(proc.stderr[-4000:], file=sys.stderr)
        return 1
    bench_s = time.time() - t0
    plan_path = work / f"results/optimal/{args.model}/cpu/1x1/plan.json"
    plan = json.loads(plan_path.read_text())
    predicted = plan["measured"]["step_time_s"]
    cell = json.loads((work / f"results/cells/{args.model}/cpu/1x1/{plan['method']}/result.json").read_text())
    threads = cell["devices"]["threads_per_rank"] or 1
    runs = []
    for r in range(args.runs):
        out = work / f"train{r}"
        t1 = time.time()
        p = subprocess.run([sys.executable, "-m", "pretrain_planner.train", str(plan_path), "--out", str(out),
                            "--steps", str(args.steps), "--threads", str(threads)], capture_output=True, text=True,
                           env=env, cwd=work)  # fmt: skip
        if p.returncode:
            print(p.stderr[-4000:], file=sys.stderr)
            return 1
        res = json.loads((out / "result.json").read_text())
        t = res["throughput"]
        runs.append({"run": r + 1, "steps_timed": t["steps_timed"], "sustained_s": t["step_time_s"],
                     "median_s": t["step_time_median_s"], "ratio": t["ratio"]["step_time_s"],
                     "wall_s": time.time() - t1})  # fmt: skip
        print(runs[-1], flush=True)
    ratios = [r["ratio"] for r in runs]
    versions = {k: metadata.version(k) for k in ("torch", "transformers", "snakemake")}
    lines = [
        "# Train run vs the benchmark's prediction (CPU, tiny model)",
        "",
        f"Date: {dt.datetime.now().isoformat(timespec='seconds')}. Machine: {_cpu()}, {os.cpu_count()} cores "
        f"(shared with other work while this ran). Python {platform.python_version()}, "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + ".",
        "",
        f"Setting: {args.model} on 1x1 `cpu`, method {plan['method']}, micro-batch "
        f"{plan['measured']['micro_batch']} x {plan['measured']['grad_accum_steps']} accumulation, "
        f"{threads} thread(s) per rank. The prediction is the benchmark cell's median step "
        f"({cell.get('timed_steps')} timed steps after {cell.get('warmup_steps')} warm-up; plan.json "
        f"`measured.step_time_s`) = **{predicted:.4g} s** (the sweep up to the export took {bench_s:.0f} s). "
        f"Each train run: `python -m pretrain_planner.train plan.json --steps {args.steps}` on a generated corpus "
        "(tokenised, packed); sustained = the mean step over the run after its 2 warm-up steps (data loading "
        "included, which the benchmark's pre-made batches leave out).",
        "",
        *markdown.plain(
            ["run", "timed steps", "sustained step (s)", "median step (s)", "ratio sustained / prediction", "wall (s)"],
            [
                [
                    r["run"],
                    r["steps_timed"],
                    f"{r['sustained_s']:.4g}",
                    f"{r['median_s']:.4g}",
                    f"{r['ratio']:.3f}",
                    f"{r['wall_s']:.0f}",
                ]
                for r in runs
            ],
        ),
    ]
    lines += ["", f"Ratio over the runs: mean {statistics.mean(ratios):.3f}, min {min(ratios):.3f}, "
              f"max {max(ratios):.3f} (1.0 = the prediction held; above 1 = slower than predicted)."]  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
