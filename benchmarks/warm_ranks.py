"""Ranks forked from a warm interpreter, or started fresh? (launcher.warm_ranks, launch/warm.py), measured.

    .venv/bin/python benchmarks/warm_ranks.py            # -> benchmarks/results/warm_ranks.md (appended)

The same local `cells` sweep (tiny-gptneox on the CPU: 1x1 and 1x2, naive, fl and naive+ac: 6 cells, 9 ranks) is run
twice in fresh folders, `launcher.warm_ranks: false` then `true`, one after the other in this process. Per run:
the wall time of the driver, the CPU seconds of it and everything it started (this process's children's rusage:
the driver waits for the warm server, the server for its ranks), and per cell its ranks' recorded start-up
(result.json `startup`: process_to_rank_s, which for a warm rank adds back its server's start and imports, and
model_build_s, which for a fresh rank includes the model classes' imports: the totals should agree) and its
first timed step's loss (the same seed: a warm rank must compute what a fresh one does).
Ratios are of the two runs measured here, on this host, minutes apart.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "workflow"))

from pretrain_planner.tables.markdown import to_markdown  # noqa: E402

SWEEP = {"models": ["tiny-gptneox"], "gpus": ["cpu"], "gpus_per_node": [1, 2], "methods": ["naive", "fl", "naive+ac"]}
BENCH = {"warmup_steps": 1, "timed_steps": 3, "max_micro_batch": 4, "max_spread": 50}


def run(work: Path, warm: bool) -> dict:
    """The sweep in `work` with launcher.warm_ranks = `warm`: wall and CPU seconds, and each cell's result."""
    cfg = {"sweep": SWEEP, "launcher": {"kind": "local", "warm_ranks": warm}, "benchmark": BENCH}
    work.mkdir(parents=True)
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = [str(BIN / "snakemake"), "cells", "-s", str(REPO / "Snakefile"), "-d", str(work), "--profile",
           str(REPO / "cluster/local"), "--cores", "2", "--configfile", str(work / "config.yaml")]  # fmt: skip
    # each run compiles from scratch (torch.compile's disk cache of the first would speed the second)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "workflow"),
           "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"the sweep with warm_ranks={warm} failed:\n{proc.stderr[-4000:]}")
    cells = {}
    for path in sorted((work / "results/cells").glob("*/*/*/*/result.json")):
        r = json.loads(path.read_text())
        key = f"{r['gpus_per_node']}x {r['method']}"
        steps = [json.loads(ln) for ln in (path.parent / "steps.jsonl").read_text().splitlines() if ln.strip()]
        cells[key] = {"process_to_rank_s": r["startup"]["process_to_rank_s"], "clock": r["startup"]["process_start"],
                      "model_build_s": r["startup"]["model_build_s"], "total_s": r["startup"]["total_s"],
                      "loss": steps[0].get("loss") if steps else None, "status": r["status"]}  # fmt: skip
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "cells": cells}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/warm_ranks.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="warm-ranks-") as tmp:
        cold = run(Path(tmp) / "cold", False)
        warm = run(Path(tmp) / "warm", True)
    rows = []
    for key in sorted(cold["cells"]):
        c, w = cold["cells"][key], warm["cells"].get(key, {})
        nan = float("nan")
        rows.append({"cell": key, "to rank, fresh / warm": f"{c['process_to_rank_s']:.1f} / "
                     f"{w.get('process_to_rank_s', nan):.1f}",
                     "model build": f"{c['model_build_s']:.1f} / {w.get('model_build_s', nan):.1f}",
                     "start-up total": f"{c['total_s']:.1f} / {w.get('total_s', nan):.1f}",
                     "warm clock": w.get("clock"), "same first loss": c["loss"] == w.get("loss"),
                     "status": f"{c['status']} / {w.get('status')}"})  # fmt: skip
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    text = (
        f"\n## {dt.datetime.now():%Y-%m-%d %H:%M}, commit {rev.stdout.strip()}, {platform.node()} "
        f"({os.cpu_count()} cores)\n\n"
        f"`benchmarks/warm_ranks.py`: the local `cells` sweep of {len(rows)} cells (tiny-gptneox, cpu, 1x1 and 1x2, "
        f"{', '.join(SWEEP['methods'])}), fresh ranks then warm ranks.\n\n"
        f"- fresh ranks: {cold['wall_s']:.1f} s wall, {cold['cpu_s']:.1f} CPU s\n"
        f"- warm ranks: {warm['wall_s']:.1f} s wall, {warm['cpu_s']:.1f} CPU s\n"
        f"- warm / fresh: wall {warm['wall_s'] / cold['wall_s']:.2f}, CPU {warm['cpu_s'] / cold['cpu_s']:.2f}\n\n"
        + "Per cell, seconds (result.json `startup`), fresh / warm:\n\n"
        + to_markdown(pl.DataFrame(rows))
        + "\n"
    )
    if not args.out.exists():
        args.out.write_text("# Warm ranks: forked from one interpreter that imported once, or started fresh\n")
    with args.out.open("a") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
