"""How repeatable is a CPU cell's timing? Run the demo sweep several times and compare each cell's step time
across the runs (and its p90/p10 within a run), for one or more checkouts of this repository.

    .venv/bin/python benchmarks/spread.py --runs 5 --label after                      # this checkout
    .venv/bin/python benchmarks/spread.py --runs 5 --label before --repo /tmp/old     # e.g. an older commit

Each run is `snakemake --profile cluster/local` on the demo sweep in a fresh folder, with the checkout's own
package first on PYTHONPATH. Figures go to stdout and are appended to benchmarks/results/spread.md.
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
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "workflow"))
from pretrain_planner.tables import markdown  # noqa: E402


def run_sweep(repo: Path, work: Path) -> dict[str, dict]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(repo / "workflow")}
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-s", str(repo / "Snakefile"), "-d", str(work),
           "--profile", str(repo / "cluster/local"), "--cores", "2"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed in {work}:\n{proc.stderr[-3000:]}")
    out = {}
    for p in (work / "results/cells").glob("*/*/*/*/result.json"):
        r = json.loads(p.read_text())
        out[str(p.parent.relative_to(work / "results/cells"))] = r
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=HERE, help="checkout to run (default: this one)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--out", type=Path, default=HERE / "benchmarks/results/spread.md")
    args = ap.parse_args(argv)
    runs, t0 = [], time.time()
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="pp-spread-") as tmp:
            runs.append(run_sweep(args.repo.resolve(), Path(tmp)))
        print(f"run {i + 1}/{args.runs} done ({time.time() - t0:.0f} s)", file=sys.stderr)
    rev = subprocess.run(["git", "-C", str(args.repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()  # fmt: skip
    lines = [
        f"\n## {args.label} ({rev}), {dt.date.today()}, {args.runs} runs of the demo sweep, "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()})\n",
    ]
    table = []
    for cell in sorted(runs[0]):
        steps = [r[cell]["step_time_s"] for r in runs if r.get(cell, {}).get("step_time_s")]
        within = [
            r[cell]["step_time_p90_s"] / r[cell]["step_time_p10_s"] for r in runs if r.get(cell, {}).get("step_time_s")
        ]
        if not steps:
            continue
        table.append([cell, ", ".join(f"{s * 1000:.1f}" for s in steps), f"{max(steps) / min(steps):.2f}",
                      f"{statistics.median(within):.2f}"])  # fmt: skip
    lines += markdown.plain(
        ["cell", "step time per run (ms)", "max/min across runs", "p90/p10 within a run (median)"], table
    )
    for model in sorted({c.split("/")[0] for c in runs[0]}):
        for method in sorted({c.split("/")[-1] for c in runs[0]}):
            one, two = f"{model}/cpu/1x1/{method}", f"{model}/cpu/1x2/{method}"
            ratio = [r[one]["step_time_s"] / r[two]["step_time_s"] for r in runs if one in r and two in r]
            if ratio:
                lines.append(f"\n{model} {method}: 1 rank / 2 ranks step time {statistics.median(ratio):.2f} "
                             f"(median of {len(ratio)}; ideal data-parallel scaling is 2.0)")  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.out.exists():
        args.out.write_text("# Timing spread of CPU cells (benchmarks/spread.py)\n")
    with args.out.open("a") as fh:
        fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
