"""Damaged cell results are measured again: found when the workflow is parsed, moved aside, re-run.

Snakemake never re-runs a job whose output exists, however broken; and when a result is missing but the
tables made from it exist, it treats the file like a deleted temporary and does nothing either. The
Snakefile therefore asks for every cell's result and steps file as targets (a missing one is measured), and
`quarantine` moves a damaged pair into the cell's `damaged/<time>/` folder (with why) before the DAG is
built, so that the cell, and only that cell, is measured again. Imports no torch.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

from pretrain_planner import layout
from pretrain_planner.results import parse_result

RESULT, STEPS = layout.RESULT, layout.STEPS


def problem(cell_dir: str | Path) -> str | None:
    """Why a cell's outputs cannot be used, or None (usable, or not measured yet: nothing to repair)."""
    cell_dir = Path(cell_dir)
    result, steps = cell_dir / RESULT, cell_dir / STEPS
    if not result.exists():
        return None  # not measured, or interrupted before its result (steps are written first)
    row, why = parse_result(result)
    if row is None:
        return f"{RESULT}: {why}"
    if not steps.is_file():
        return f"{STEPS} is missing beside a {row['status']} {RESULT}"
    lines = []
    try:
        for i, line in enumerate(steps.read_text(encoding="utf-8").splitlines()):
            if line.strip():
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    return f"{STEPS} line {i + 1} is not a JSON object"
                lines.append(rec)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{STEPS} is unreadable ({type(exc).__name__}: {str(exc)[:120]}): truncated or corrupt"
    timed = row.get("timed_steps")
    if row["status"] in ("ok", "noisy") and timed is not None and len(lines) != timed:
        return f"{STEPS} has {len(lines)} steps but {RESULT} says {timed} were timed (truncated?)"
    return None


def quarantine(cell_dir: str | Path, why: str) -> Path:
    """Move the cell's result and steps into damaged/<time>/ with a note; the cell is measured again."""
    cell_dir = Path(cell_dir)
    dest = cell_dir / "damaged" / dt.datetime.now().strftime("%Y%m%dT%H%M%S.%f")
    dest.mkdir(parents=True, exist_ok=True)
    for name in (RESULT, STEPS):
        if (cell_dir / name).exists():
            shutil.move(str(cell_dir / name), str(dest / name))
    (dest / "WHY.txt").write_text(why + "\n")
    return dest


def repair(results: str | Path, cell_paths: list[str], move: bool) -> list[str]:
    """Messages about each damaged cell among `cell_paths` (folders under `results`); with `move`, each is
    moved aside so that this run measures it again (a dry run only reports)."""
    out = []
    for rel in cell_paths:
        cell_dir = Path(results) / rel
        why = problem(cell_dir)
        if why is None:
            continue
        if move:
            dest = quarantine(cell_dir, why)
            out.append(f"pretrain-planner: damaged result in {cell_dir} ({why}): moved to {dest}; measuring it again")
        else:
            out.append(f"pretrain-planner: damaged result in {cell_dir} ({why}): the next run (not a dry run) "
                       "moves it aside and measures the cell again")  # fmt: skip
    return out
