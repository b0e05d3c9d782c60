"""A process that runs a list of plans in order: `python -m gpucheck.worker JOB.json` (benchmarks/ on the path).

JOB.json: {"plans": [Plan...], "settings": Settings, "rows": rows.jsonl, "models": ..., "gpus": ...}. Before each
plan it appends {"event": "start", "label", "t"} to rows.jsonl, after it {"event": "end", "record"} (flushed), and
writes the record into the cell's folder (record.json): the runner learns of each cell the moment it ends, and
knows which one was running if this process dies or is stopped. A fallback plan runs only if none of the plans
it stands in for ended ok.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _emit(rows: Path, event: dict[str, Any]) -> None:
    with rows.open("a") as fh:
        fh.write(json.dumps(event, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def run_plan(plan, catalog, s) -> dict[str, Any]:
    """One plan's record (a cell, the honesty check or a sustained run), with its checks."""
    from .cells import read_record, run_cell
    from .checks import checks_for
    from .honesty import run_honesty
    from .sustain import run_sustained

    if plan.fallback:
        done = [read_record(s, label) for label in plan.of]
        if any(r and r.get("status") == "ok" for r in done):
            return {
                "label": plan.label,
                "plan": plan.to_json(),
                "status": "not needed",
                "reason": f"a fallback: {', '.join(plan.of)} ended ok",
            }
    if plan.kind == "honesty":
        return run_honesty(plan, catalog, s)
    if plan.kind == "sustained":
        return run_sustained(plan, s)
    rec = run_cell(plan, catalog, s)
    if rec.get("result") is not None or rec["status"] == "error":
        rec["checks"] = checks_for(plan, rec, s.on_gpu, catalog.gpu(s.gpu).to_dict())
    return rec


def main(argv: list[str]) -> int:
    import torch
    from pretrain_planner.planning.catalog import load_catalog

    from .cells import Settings, write_record
    from .plans import Plan

    job = json.loads(Path(argv[0]).read_text())
    s = Settings(**job["settings"])
    torch.set_num_threads(max(1, s.threads))
    catalog = load_catalog(job["models"], job["gpus"])
    rows = Path(job["rows"])
    for raw in job["plans"]:
        plan = Plan.from_json(raw)
        _emit(rows, {"event": "start", "label": plan.label, "t": time.time(), "pid": os.getpid()})
        rec = run_plan(plan, catalog, s)
        rec["pid"] = os.getpid()
        write_record(s, rec)
        _emit(rows, {"event": "end", "label": plan.label, "t": time.time(), "record": rec})
        print(f"[worker {os.getpid()}] {plan.label}: {rec['status']} ({rec.get('cell_wall_s')} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
