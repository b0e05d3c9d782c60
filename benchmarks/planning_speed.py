"""How long planning a large sweep takes on a login node, and where the time goes: this package's code (the facade
the Snakefile asks: the config, the plan, every cell's inputs, params and threads) against Snakemake's own (parsing
the rules, building and checking the DAG, the dry run's listing). A `snakemake -n` of a ~20,000-cell sweep in the
local and the SLURM profile, each run under cProfile: "ours" is the cumulative time of the package's entry points
(a function of workflow/pretrain_planner called from outside it), the rest is Snakemake's and Python's.

    .venv/bin/python benchmarks/planning_speed.py [--cells 20000] [--out benchmarks/results/planning_speed.md]

No torch, no scheduler contact (the SLURM profile's dry run reads the site file only). About a minute on two cores.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PKG = str(REPO / "workflow" / "pretrain_planner")
SNAKEMAKE = REPO / ".venv" / "bin" / "snakemake"
METHODS = ["naive", "fl", "fl+ac"] + [f"fl+{ac}{s}{o}" for s in ("zero1", "zero2", "zero3", "fsdp-grad", "fsdp-full")
                                      for ac in ("", "ac+") for o in ("", "+off")]  # fmt: skip


def sweep(cells: int) -> dict:
    """A sweep of about `cells` cells over the catalog's full-size models and GPU types (23 methods, 1-8 GPUs per
    node, 1-2 nodes), every GPU type mapped in the site file."""
    catalog = yaml.safe_load((REPO / "config/models.yaml").read_text())["models"]
    models = [m for m in catalog if not m.startswith(("tiny", "bert-24h"))]
    gpus = [g for g in yaml.safe_load((REPO / "config/gpus.yaml").read_text())["gpus"] if g != "cpu"]
    per_gpu = len(METHODS) * 4 * 2  # methods x gpus_per_node x nodes
    n_gpus = max(1, min(len(gpus), round(cells / (per_gpu * len(models)))))
    n_models = max(1, min(len(models), round(cells / (per_gpu * n_gpus))))
    return {"sweep": {"models": models[:n_models], "gpus": gpus[:n_gpus], "nodes": [1, 2],
                      "gpus_per_node": [1, 2, 4, 8], "methods": METHODS}}  # fmt: skip


def site(gpus: list[str]) -> dict:
    return {"gpus": {g: {"partition": f"gpu-{g}", "gres_type": g} for g in gpus}}


def dry_run(work: Path, profile: str, config: Path) -> dict:
    """`snakemake -n` twice: plain for its wall time, then under cProfile for this package's share of it."""
    base = [str(SNAKEMAKE), "-n", "--profile", str(REPO / "cluster" / profile), "--configfile", str(config), "-s",
            str(REPO / "Snakefile")]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    t0 = time.perf_counter()
    out = subprocess.run([*base, "-d", str(work / profile)], capture_output=True, text=True, cwd=REPO, env=env)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"dry run ({profile}) failed:\n{out.stderr[-3000:]}")
    jobs = next((int(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("total ")), None)
    prof = work / f"{profile}.prof"
    cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), *base, "-d", str(work / f"{profile}-profiled")]
    subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, check=True)
    return {"wall_s": wall, "jobs": jobs, **split(prof)}


def _ours(filename: str) -> bool:
    return filename.startswith(PKG)


# Entry points that wrap Snakemake's own work rather than do ours: launch/driver.guard wraps Workflow.execute (the
# whole DAG build and the dry run's listing) to hold the results folder while jobs run.
WRAPPERS = {"pretrain_planner/launch/driver:execute"}


def split(prof: Path) -> dict:
    """The profile's total, and the cumulative time of this package's entry points (functions of the package whose
    callers are not, the WRAPPERS aside), the ten largest of them named."""
    st = pstats.Stats(str(prof))
    total = max(ct for (_f, _l, _n), (_cc, _nc, _tt, ct, _callers) in st.stats.items())
    entries = []
    for (f, _line, name), (_cc, _nc, _tt, ct, callers) in st.stats.items():
        where = f"{Path(f).relative_to(REPO / 'workflow').with_suffix('')}:{name}" if _ours(f) else ""
        if where and where not in WRAPPERS and not any(_ours(cf) for (cf, _cl, _cn) in callers):
            entries.append((ct, where))
    entries.sort(reverse=True)
    return {"profiled_s": total, "ours_s": sum(ct for ct, _ in entries),
            "top": [{"where": w, "s": round(ct, 3)} for ct, w in entries[:10]]}  # fmt: skip


def in_process(config: dict, site_path: Path, basedir: Path) -> dict:
    """The facade's planning alone, timed in this process (no Snakemake): load (validate, catalog, expand, site
    limits), the dry run's summary, and per valid cell what a rule asks (spec, threads)."""
    sys.path.insert(0, str(REPO / "workflow"))
    from types import SimpleNamespace

    from pretrain_planner.facade.pipeline import load

    t0 = time.perf_counter()
    conf = json.loads(json.dumps(config))
    conf.setdefault("launcher", {})["kind"] = "slurm"
    conf["launcher"]["site"] = str(site_path)
    pp = load(conf, REPO, "bench", cores=256)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    pp.summary()
    t_summary = time.perf_counter() - t0
    t0 = time.perf_counter()
    for c in pp.cells:
        wc = {"model": c.model, "gpu": c.gpu, "nodes": str(c.nodes), "gpus_per_node": str(c.gpus_per_node),
              "method": c.method}  # fmt: skip
        pp.spec(wc, SimpleNamespace(result="r.json", steps="s.jsonl"))
        pp.threads(wc)
    t_cells = time.perf_counter() - t0
    return {"cells": len(pp.planned), "valid": len(pp.cells), "load_s": t_load, "summary_s": t_summary,
            "per_cell_s": t_cells}  # fmt: skip


def markdown(rec: dict) -> str:
    sys.path.insert(0, str(REPO / "workflow"))
    from pretrain_planner.tables import markdown as md

    ip = rec["in_process"]
    lines = [
        "# Planning speed: a dry run of a large sweep",
        "",
        f"{rec['date']}, {rec['host']}, Python {rec['python']}; `benchmarks/planning_speed.py --cells "
        f"{rec['asked']}`. A sweep of {ip['cells']:,} cells ({ip['valid']:,} valid) over "
        f"{len(rec['sweep']['models'])} models x {len(rec['sweep']['gpus'])} GPU types x 1-8 GPUs per node x 1-2 "
        f"nodes x {len(METHODS)} methods. Target (issue 41): 20k cells in under 5 s in both profiles.",
        "",
    ]
    lines += md.plain(
        ["profile", "jobs planned", "wall", "under cProfile", "this package (entry points, profiled)",
         "Snakemake and the rest (profiled)"],
        [[name, f"{r['jobs']:,}", f"{r['wall_s']:.1f} s", f"{r['profiled_s']:.1f} s",
          f"{r['ours_s']:.1f} s ({r['ours_s'] / r['profiled_s']:.0%})", f"{r['profiled_s'] - r['ours_s']:.1f} s"]
         for name, r in rec["dry_runs"].items()],
    )  # fmt: skip
    ours = ip["load_s"] + ip["summary_s"] + ip["per_cell_s"]
    lines += ["", "This package's planning in one process, without Snakemake: load (validate, catalog, the grid, the "
              f"site's limits) {ip['load_s']:.2f} s, the dry run's summary {ip['summary_s']:.2f} s, every valid "
              f"cell's spec and threads {ip['per_cell_s']:.2f} s.", ""]  # fmt: skip
    for name, r in rec["dry_runs"].items():
        per_job = (r["wall_s"] - ours) / r["jobs"] * 1e3
        lines.append(f"The floor, {name}: the rest of the wall time is Snakemake's own (parsing, the DAG of "
                     f"{r['jobs']:,} jobs, its checks and listing), {per_job:.2f} ms per planned job; under 5 s for "
                     f"these jobs would need {5000 / r['jobs']:.2f} ms per job with nothing of ours.")  # fmt: skip
    lines.append("")
    for name, r in rec["dry_runs"].items():
        lines += [f"Where this package's time goes in the {name} dry run:", ""]
        lines += [*md.plain(["entry point", "s"], [[t["where"], f"{t['s']:.2f}"] for t in r["top"]]), ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", type=int, default=20000)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/planning_speed.md"))
    args = ap.parse_args()
    config = sweep(args.cells)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        site_path = work / "site.yaml"
        site_path.write_text(yaml.safe_dump(site(config["sweep"]["gpus"])))
        conf_path = work / "sweep.yaml"
        conf_path.write_text(yaml.safe_dump({**config, "launcher": {"site": str(site_path)}}))
        rec = {"date": dt.date.today().isoformat(), "host": platform.node(), "python": platform.python_version(),
               "asked": args.cells, "sweep": config["sweep"], "in_process": in_process(config, site_path, work),
               "dry_runs": {p: dry_run(work, p, conf_path) for p in ("local", "slurm")}}  # fmt: skip
    text = markdown(rec)
    print(text)
    Path(args.out).write_text(text + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
