"""One job per cell, or one per setting? (issue 53 item 1: "fewer, larger jobs"), measured on the SLURM testbed.

    flock /work/slurm.lock .venv/bin/python benchmarks/job_granularity.py              # runs its own sweep
    .venv/bin/python benchmarks/job_granularity.py --sweep DIR                         # a finished SLURM sweep

The driver submits one job per cell. A job per setting (model x GPU type x layout), measuring the setting's cells
(its methods) in turn in one allocation, would save, for every cell but the first of a setting, that cell's wait in
the queue and its job's launch (the allocation's start to the rank's process group: srun, the interpreter, torch's
import, the process group); it would lose the concurrency of a setting's cells where the cluster has room for
several, isolation between cells (a CUDA error or a hung collective of one cell is its job's end), the per-cell
requeue (a pre-empted job starts its setting over) and Snakemake's per-cell retry. This script measures the first
from a real sweep's accounting and results, per cell:
- queue_s: sacct Start - Submit; job_s: End - Start (the allocation);
- launch_s: the allocation's start until the rank's process group was joined: result.json started_at (the rank's
  record) - Start, plus startup.process_to_rank_s (what a job in turn would not pay again);
and writes, per setting and in all: jobs, allocation-seconds per cell and per setting job (estimated: the cells'
allocations in turn, less the launches and waits saved), the waits saved, and the setting's cells' critical path
(side by side: the longest cell; in turn: their sum). Written to `--out` (benchmarks/results/job_granularity.md).

Without `--sweep` it runs a sweep on the testbed first (as root, under its lock): tiny-gptneox on the a100 and h100
types, 1x1 and 1x2, methods naive, fl, fl+ac: 4 settings of 3 cells.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
from pretrain_planner.tables import markdown  # noqa: E402

BIN = Path(sys.executable).parent
SITE = REPO / "tests/data/site-testbed.yaml"


def _ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=None)


def run_sweep(work: Path) -> Path:
    """The default sweep on the testbed's SLURM (cluster/slurm profile), in `work`."""
    cfg = {
        "sweep": {"models": ["tiny-gptneox"], "gpus": ["a100", "h100"], "nodes": [1], "gpus_per_node": [1, 2],
                  "methods": ["naive", "fl", "fl+ac"]},
        "launcher": {"kind": "slurm", "site": str(SITE)},
        "benchmark": {"warmup_steps": 1, "timed_steps": 3, "max_micro_batch": 4, "device": "cpu", "max_spread": 50},
    }  # fmt: skip
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = [str(BIN / "snakemake"), "cells", "-s", str(REPO / "Snakefile"), "-d", str(work), "--profile",
           str(REPO / "cluster/slurm"), "--configfile", str(work / "config.yaml")]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"the sweep failed: {proc.stderr[-3000:]}")
    return work


def accounting(job_ids: list[str]) -> dict[str, dict[str, str]]:
    """sacct's Submit, Start, End of each job (the allocation)."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", "JobID,Submit,Start,End,State"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    rows = {}
    for ln in out.splitlines():
        jid, submit, start, end, state = ln.split("|")
        rows[jid] = {"submit": submit, "start": start, "end": end, "state": state}
    return rows


def cells_of(sweep: Path) -> list[dict]:
    """Each measured cell of a SLURM sweep: its setting, queue wait, allocation and launch (seconds)."""
    found = []
    for res in sorted((sweep / "results/cells").glob("*/*/*/*/result.json")):
        r = json.loads(res.read_text())
        job = json.loads((res.parent / "slurm_job.json").read_text())
        found.append((res.parent, r, str(job["job_id"])))
    acct = accounting([j for _, _, j in found])
    cells = []
    for folder, r, jid in found:
        a = acct.get(jid)
        if a is None or a["state"] != "COMPLETED" or r.get("status") != "ok" or not r.get("started_at"):
            continue
        start, submit, end = _ts(a["start"]), _ts(a["submit"]), _ts(a["end"])
        rank_start = _ts(r["started_at"])
        to_rank = (r.get("startup") or {}).get("process_to_rank_s") or 0.0
        cells.append({
            "setting": f"{r['model']} {r['gpu']} {r['nodes']}x{r['gpus_per_node']}", "method": r["method"],
            "nodes": r["nodes"], "queue_s": (start - submit).total_seconds(), "job_s": (end - start).total_seconds(),
            "launch_s": max(0.0, (rank_start - start).total_seconds()) + to_rank, "folder": str(folder),
            "gpu": r["gpu"], "submit": submit, "end": end,
        })  # fmt: skip
    return cells


def table(cells: list[dict]) -> tuple[list[str], dict]:
    by: dict[str, list[dict]] = defaultdict(list)
    for c in cells:
        by[c["setting"]].append(c)
    rows = []
    tot = defaultdict(float)
    for setting, cs in sorted(by.items()):
        n, nodes = len(cs), cs[0]["nodes"]  # a setting's cells share its layout
        alloc = sum(c["job_s"] for c in cs) * nodes  # node-seconds
        launches = [c["launch_s"] for c in cs]
        saved_launch = (sum(launches) - max(launches)) * nodes  # in turn: one launch per setting
        waits = sorted(c["queue_s"] for c in cs)
        saved_wait = sum(waits) - waits[0]  # in turn: the setting's job waits once (its shortest cell's wait)
        side, turn = max(c["job_s"] for c in cs), sum(c["job_s"] for c in cs) - saved_launch / nodes
        rows.append([setting, n, f"{statistics.mean(waits):.1f}", f"{alloc / n:.1f}",
                     f"{statistics.mean(c['launch_s'] for c in cs):.1f}", f"{alloc:.0f} / {alloc - saved_launch:.0f}",
                     f"{saved_wait:.0f}", f"{side:.0f} / {turn:.0f}"])  # fmt: skip
        tot[f"turn {cs[0]['gpu']}"] += turn
        for k, v in (("cells", n), ("settings", 1), ("alloc", alloc), ("saved_launch", saved_launch),
                     ("saved_wait", saved_wait), ("launch", sum(c["launch_s"] for c in cs)),
                     ("job", sum(c["job_s"] for c in cs))):  # fmt: skip
            tot[k] += v
    lines = markdown.plain(
        ["setting", "cells", "queue wait per cell (s)", "allocation per cell (s)", "launch per cell (s)",
         "allocation: per cell / per setting (s)", "waits saved (s)", "critical path: side by side / in turn (s)"],
        rows,
    )  # fmt: skip
    return lines, tot


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", type=Path, help="a finished SLURM sweep's folder (default: run one on the testbed)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/job_granularity.md")
    args = ap.parse_args(argv)
    sweep = args.sweep or run_sweep(Path(tempfile.mkdtemp(prefix="pp-granularity-")))
    cells = cells_of(sweep)
    if not cells:
        raise SystemExit(f"{sweep}: no measured SLURM cell (results/cells/*/*/*/*/result.json with slurm_job.json)")
    lines, t = table(cells)
    share = t["launch"] / t["job"]
    makespan = (max(c["end"] for c in cells) - min(c["submit"] for c in cells)).total_seconds()
    in_turn = max(v for k, v in t.items() if k.startswith("turn "))
    text = "\n".join([
        "# One job per cell or one per setting? (benchmarks/job_granularity.py)", "",
        f"{dt.date.today()}, the single-host testbed (cluster/testbed), sweep `{sweep}`: {int(t['cells'])} cells in "
        f"{int(t['settings'])} settings, each cell its own job (what the driver submits).", "",
        *lines, "",
        f"In all: a job's launch (allocation start to the process group joined) is {share:.0%} of the cells' "
        f"allocation time ({t['launch']:.0f} of {t['job']:.0f} s); one job per setting would save "
        f"{t['saved_launch']:.0f} allocation-seconds ({t['saved_launch'] / t['alloc']:.0%}) and {t['saved_wait']:.0f} "
        "s of queue waits summed over cells (waits overlap: the sweep's wall time saves less), and run each "
        "setting's cells in turn: its critical path is their sum instead of the longest.",
        "",
        f"The sweep's wall time, first submission to last end: {makespan:.0f} s measured; with a job per setting, "
        f"at best {in_turn:.0f} s ({1 - in_turn / makespan:.0%} less; each GPU type's settings in turn on its one "
        "node, no wait beyond that: the testbed has one node per GPU type, and a sweep's cells mostly wait for each "
        "other, not for strangers).",
        "",
        "`allocation per setting`: the cells' allocations in turn less every launch but one (an estimate from the "
        "measured parts, not a run of that mode). A per-setting job also loses per-cell isolation (a CUDA error, a "
        "hung collective or an OOM-killed rank ends its setting's other cells), the per-cell requeue (a pre-empted "
        "job restarts its setting) and Snakemake's per-cell retry and re-run.",
    ]) + "\n"  # fmt: skip
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
