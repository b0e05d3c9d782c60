"""A measured cell is an evidence row: cells exported from one site's sweep in the shipped evidence schema
(data/evidence/public_throughput.csv's columns) with their provenance, and imported into another's evidence folder,
where the cross-GPU model (planning/crossgpu.py, through tables/whatif.Predictor) uses them beside the shipped rows.

Why: what limits the cross-GPU model is its evidence, a GPU type's own offset being known only where something
measured it; every user measures exactly that on their own cluster. An exported row carries what makes it checkable
(the package versions, the GPU name as the driver reports it, GPUs per node, nodes, the method's settings, the site's
name, the planner's commit, the date); an import is validated as a whole (columns, units, numbers, the catalog's
GPU types and FLOPs formulas, the GPU's peak) and refused as a whole, naming every row it refuses and why, so a
folder never holds half an import. A row measured twice with the same provenance is kept once.

Imports no torch (the CLI's `evidence` command and the what-if read it)."""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.planning import methods
from pretrain_planner.planning.evidence import (
    PUBLIC_CSV,
    UNITS,
    Evidence,
    catalog_work,
    precision_of,
    public_evidence,
    run_of_row,
)
from pretrain_planner.results import atomic_write_text, parse_result

with open(PUBLIC_CSV, newline="") as _f:
    SHIPPED_COLUMNS: tuple[str, ...] = tuple(next(csv.reader(_f)))
PROVENANCE = ("site", "gpu_name", "gpus_per_node", "interconnect", "method_settings", "versions", "planner_commit",
              "date")  # fmt: skip
COLUMNS = (*SHIPPED_COLUMNS, *PROVENANCE)
REQUIRED = ("row_id", "model", "gpu_type", "gpu_count", "nodes", "precision", "method", "per_gpu_rate",
            "per_gpu_rate_unit", "location", "site")  # fmt: skip
# what makes two rows the same measurement: the workload and setting, and the provenance (the date aside: the same
# cell exported twice is one measurement)
IDENTITY = ("model", "gpu_type", "gpu_count", "nodes", "precision", "method", "global_batch", "micro_batch", "site",
            "gpu_name", "versions", "planner_commit")  # fmt: skip
IMPORTED_CSV = "imported.csv"  # in the evidence folder: every row imported so far
SITE_PREFIX = "site:"  # an exported row's source_id: site:<the site's name>


class EvidenceError(ValueError):
    """An import refused (nothing of it written): each refused row with its file and reason."""


def planner_commit() -> str:
    """The planner checkout's commit, else its version (an installed copy)."""
    from pretrain_planner import __version__

    try:
        out = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        out = None
    return out.stdout.strip() if out and out.returncode == 0 and out.stdout.strip() else f"version {__version__}"


def is_cpu(name: str, gpu: Any) -> bool:
    """The catalog's CPU stand-in (its bf16 support decided on the host, its peak nominal): no GPU's evidence."""
    return name == "cpu" or getattr(gpu, "bf16_host", None) is not None


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _identity(row: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps([str(row.get(k, "")) for k in IDENTITY]).encode()).hexdigest()[:10]


def export_rows(cells: Any, catalog: Any, site: str, commit: str | None = None, today: str | None = None,
                interconnect: str = "") -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:  # fmt: skip
    """The ok cells of a cells table (aggregate.cells_table, or result rows as results.parse_result reads them: not
    suspect, not noisy) as evidence rows, and the cells left out with the reason: (rows, [(cell folder, why)])."""
    if not site or any(c in site for c in ',\n"') or site != site.strip():
        raise EvidenceError(f"the site's name {site!r} must be a non-empty word without commas, quotes or newlines")
    commit = commit or planner_commit()
    today = today or dt.date.today().isoformat()
    rows, left = [], []
    for r in cells.iter_rows(named=True) if hasattr(cells, "iter_rows") else cells:
        folder = f"{r['model']}/{r['gpu']}/{r['nodes']}x{r['gpus_per_node']}/{r['method']}"
        if r.get("status") != "ok":
            continue
        if r.get("suspect"):
            left.append((folder, f"suspect: {r.get('suspect_reason') or 'implausible timing'}"))
            continue
        spec, gpu = catalog.models.get(r["model"]), catalog.gpus.get(r["gpu"])
        if spec is None or gpu is None:
            left.append((folder, "its model or GPU type is not in this catalog"))
            continue
        if is_cpu(r["gpu"], gpu):
            left.append((folder, "measured on CPU ranks: no GPU type's evidence"))
            continue
        world = int(r["world_size"])
        text = spec.is_text
        rate = (r.get("tokens_per_s") if text else r.get("samples_per_s")) or 0.0
        if rate <= 0:
            left.append((folder, "no measured throughput"))
            continue
        unit = "tokens/s/GPU" if text else "samples/s/GPU"
        versions = _json(r.get("versions")) or {}
        settings = _json(r.get("method_settings")) or {}
        row = {
            # one workload and setting on the site's GPU types: the group whose pairs give a GPU type's own offset
            "group_id": f"{SITE_PREFIX}{site}:{r['model']}:{r['nodes']}x{r['gpus_per_node']}:{r['method']}",
            "source_id": f"{SITE_PREFIX}{site}",
            "model": r["model"],
            "params_total": "",
            "n_layers": spec.arch.get("num_hidden_layers", ""),
            "hidden": spec.arch.get("hidden_size", ""),
            "heads": spec.arch.get("num_attention_heads", ""),
            "seq_len": spec.recipe.sequence_length or "",
            "vocab": spec.arch.get("vocab_size", ""),
            "global_batch": r.get("global_batch") or spec.recipe.global_batch,
            "micro_batch": r.get("micro_batch") or "",
            "gpu_type": r["gpu"],
            "gpu_count": world,
            "nodes": int(r["nodes"]),
            "precision": r.get("precision") or spec.recipe.precision,
            "method": r["method"],
            "metric": f"{'tokens' if text else 'samples'}/s (all GPUs)",
            "value": rate,
            "per_gpu_rate": rate / world,
            "per_gpu_rate_unit": unit,
            "tokens_per_s_per_gpu": rate / world if text else "",
            "derivation": f"value / {world} GPUs",
            "framework": f"pretrain-planner, torch {versions.get('torch', '?')}",
            "year": today[:4],
            "location": f"{site}: cells/{folder}/result.json (planner {commit[:12]}, {today})",
            "notes": f"step {r.get('step_time_s')} s over {r.get('timed_steps')} timed steps",
            "site": site,
            "gpu_name": r.get("device_name") or "",
            "gpus_per_node": int(r["gpus_per_node"]),
            "interconnect": interconnect,
            "method_settings": json.dumps(settings, sort_keys=True),
            "versions": json.dumps(versions, sort_keys=True),
            "planner_commit": commit,
            "date": today,
        }
        row["row_id"] = f"{site}:{folder}#{_identity(row)}"
        rows.append({k: row.get(k, "") for k in COLUMNS})
    return rows, left


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _read(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                raise EvidenceError(f"{path}: not an evidence file: no column {', '.join(missing)} (an evidence "
                                    f"file has the columns of `pretrain-planner evidence export`)")  # fmt: skip
            return [{k: (v or "") for k, v in row.items() if k is not None} for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise EvidenceError(f"{path}: cannot be read as CSV: {exc}") from None


def _check(row: dict[str, str], catalog: Any) -> str | None:
    """Why a row cannot be evidence (None: it can): its numbers, units, GPU type, model and the GPU's peak."""
    for k in REQUIRED:
        if not row.get(k, "").strip():
            return f"empty `{k}`"
    if row.get("source_id") != f"{SITE_PREFIX}{row['site']}":
        return (f"source_id {row.get('source_id')!r}: an exported row's is {SITE_PREFIX}<its site> "
                f"({SITE_PREFIX}{row['site']})")  # fmt: skip
    if row["per_gpu_rate_unit"] not in UNITS:
        return f"per_gpu_rate_unit {row['per_gpu_rate_unit']!r}: allowed {', '.join(sorted(UNITS))}"
    try:
        rate, count, nodes = float(row["per_gpu_rate"]), int(row["gpu_count"]), int(row["nodes"])
    except ValueError:
        return (f"per_gpu_rate {row['per_gpu_rate']!r}, gpu_count {row['gpu_count']!r}, nodes {row['nodes']!r}: not "
                "numbers")  # fmt: skip
    if not rate > 0 or rate == float("inf") or count < 1 or nodes < 1 or count % nodes:
        return f"per_gpu_rate {rate:g} must be > 0, gpu_count {count} and nodes {nodes} >= 1 with nodes dividing it"
    if row["gpu_type"] not in catalog.gpus:
        return f"GPU type {row['gpu_type']!r} is not in {catalog.gpus_path}"
    if is_cpu(row["gpu_type"], catalog.gpus[row["gpu_type"]]):
        return f"GPU type {row['gpu_type']!r}: CPU ranks are no GPU type's evidence"
    spec = catalog.models.get(row["model"])
    if spec is None:
        return f"model {row['model']!r} is not in {catalog.models_path} (no FLOPs formula for it)"
    if precision_of(row["precision"]) is None:
        return f"precision {row['precision']!r}: allowed bf16, fp16, fp32"
    try:
        m = methods.parse(row["method"])
    except ValueError as exc:
        return f"method {row['method']!r}: {exc}"
    work = catalog_work(spec, eager=m.base == "naive", tf32=m.base != "naive")
    if work is None:
        return f"model {row['model']!r}: its family has no FLOPs formula"
    unit = UNITS[row["per_gpu_rate_unit"]]
    per_unit = rate * (work.tokens or 1) if unit == "sample" and spec.is_text else rate
    peak = catalog.gpus[row["gpu_type"]].peak_for(precision_of(row["precision"]), tf32=True)
    if peak and per_unit * work.flops > peak * 1e12:
        return (f"{rate:g} {row['per_gpu_rate_unit']} is {per_unit * work.flops / (peak * 1e12):.0%} of "
                f"{row['gpu_type']}'s dense peak ({peak:g} TFLOP/s): faster than the GPU allows")  # fmt: skip
    return None


def import_files(files: Iterable[str | Path], catalog: Any, folder: str | Path) -> tuple[int, int, Path]:
    """Add the rows of `files` to the evidence folder, all or nothing: (rows added, rows already there or repeated,
    the folder's file). Raises EvidenceError naming every refused row and why."""
    folder = Path(folder)
    target = folder / IMPORTED_CSV
    have = {_identity(r) for r in _read(target)} if target.is_file() else set()
    new, repeated, refused = [], 0, []
    for path in (Path(f) for f in files):
        if not path.is_file():
            raise EvidenceError(f"{path}: no such file")
        for i, row in enumerate(_read(path), start=2):
            why = _check(row, catalog)
            if why:
                refused.append(f"{path}:{i} ({row.get('row_id') or 'no row_id'}): {why}")
                continue
            key = _identity(row)
            if key in have:
                repeated += 1
                continue
            have.add(key)
            new.append({k: row.get(k, "") for k in COLUMNS})
    if refused:
        raise EvidenceError(f"nothing imported: {len(refused)} row(s) refused:\n  " + "\n  ".join(refused))
    if new:
        old = _read(target) if target.is_file() else []
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(str(target), csv_text([*({k: r.get(k, "") for k in COLUMNS} for r in old), *new]))
    return len(new), repeated, target


def imported_evidence(catalog: Any, folder: str | Path | None, suspect_mfu: float = 0.85) -> Evidence:
    """The rows imported into `folder` as Runs (origin `imported`), those unusable in `skipped`."""
    out = Evidence()
    target = Path(folder) / IMPORTED_CSV if folder else None
    if target is None or not target.is_file():
        return out
    for row in _read(target):
        why = _check(row, catalog)
        if why:
            out.skipped.append((row["row_id"], why))
            continue
        _add(out, row, catalog, suspect_mfu, "imported")
    return out


def _add(out: Evidence, row: dict[str, Any], catalog: Any, suspect_mfu: float, origin: str) -> None:
    """An exported row (a catalog model's cell, its method a slug) as a Run of `origin`, else skipped with why."""
    m = methods.parse(row["method"])
    got = run_of_row({k: str(v) for k, v in row.items()},
                     {"catalog": row["model"], "attention": "eager" if m.base == "naive" else ""}, catalog,
                     suspect_mfu, origin=origin, tf32=m.base != "naive")  # fmt: skip
    if isinstance(got, str):
        out.skipped.append((row["row_id"], got))
    else:
        out.runs.append(got)


OWN_SITE = "own"  # the site name of this results folder's own cells read as evidence rows


def own_evidence(catalog: Any, results: str | Path | None, model: str | None = None,
                 suspect_mfu: float = 0.85) -> Evidence:  # fmt: skip
    """The ok cells of a results folder (of `model` only, if given) as Runs of origin `own`: the rows `evidence
    export` would write (the suspect, noisy and CPU cells left out), read straight from their result.json."""
    out = Evidence()
    if not results or not Path(results).is_dir():
        return out
    parsed = (parse_result(p)[0] for p in layout.all_results(results, model or "*"))
    rows, _left = export_rows([r for r in parsed if r], catalog, OWN_SITE, commit=OWN_SITE)
    for row in rows:
        _add(out, row, catalog, suspect_mfu, "own")
    return out


def loaded_evidence(catalog: Any, suspect_mfu: float = 0.85, folder: str | Path | None = None) -> Evidence:
    """What the cross-GPU model rests on besides the sweep's own cells: the shipped rows and those imported."""
    shipped = public_evidence(catalog, suspect_mfu)
    mine = imported_evidence(catalog, folder, suspect_mfu)
    return Evidence(shipped.runs + mine.runs, shipped.skipped + mine.skipped)


def folder_digest(folder: str | Path | None) -> str:
    """A digest of the evidence folder's imported rows (a rule parameter: an import re-predicts)."""
    target = Path(folder) / IMPORTED_CSV if folder else None
    if target is None or not target.is_file():
        return "none"
    return hashlib.sha256(target.read_bytes()).hexdigest()[:16]
