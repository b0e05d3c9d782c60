"""Aggregate N synthetic results (default 10,000) the way the pipeline does, and time each stage.

    .venv/bin/python benchmarks/aggregate_bench.py [--n 10000] [--out benchmarks/results/aggregate.md]

Writes a plan.csv (grid.expand over the catalog's models and GPU types, launcher `slurm` so several
nodes are valid) and one result.json per valid cell with results.write_result: plausible step times
from the FLOPs formula and an MFU drawn per method, ~12% out of memory, a few unsupported. Then times
aggregate.build_tables (read + every table + CSV/Markdown/Parquet), report.make_plots (PNG + SVG),
export.export_plans and report.write_report. Target: tables < 2 s on 2 cores. Imports no torch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from pretrain_planner.planning import methods  # noqa: E402
from pretrain_planner.planning.catalog import load_catalog  # noqa: E402
from pretrain_planner.planning.configtypes import CostsSection, LauncherSection, SweepSection  # noqa: E402
from pretrain_planner.planning.flops import train_flops_per_sample  # noqa: E402
from pretrain_planner.planning.grid import expand  # noqa: E402
from pretrain_planner.report import document, study_plots  # noqa: E402
from pretrain_planner.report import plots as pp_plots  # noqa: E402
from pretrain_planner.results import atomic_write_text, write_result  # noqa: E402
from pretrain_planner.tables import aggregate, export, markdown, study, whatif  # noqa: E402
from pretrain_planner.versions import installed_version  # noqa: E402

MODELS = ["pythia-160m", "pythia-410m", "pythia-1b", "pythia-1.4b", "pythia-2.8b", "pythia-6.9b", "roberta-large",
          "mamba-2.8b", "convnext-xlarge-22k", "vit-large-in21k", "bert-24h"]  # fmt: skip
GPUS = ["rtx3090", "a6000", "a100", "h100", "h200"]
BASES, PARTS = ["naive", "fl"], [[], ["ac"]]
SHARDS = [None, "zero1", "zero2", "zero3", "fsdp-grad", "fsdp-full"]


def all_methods() -> list[str]:
    slugs = []
    for base in BASES:
        for ac in PARTS:
            for shard in SHARDS:
                for off in [False, True] if shard else [False]:
                    slugs.append(methods.Method(base, bool(ac), shard, off).slug)
    return slugs


def synthesise(folder: Path, n: int, seed: int = 0) -> tuple[str, list[str]]:
    """plan.csv and n result files under folder; returns (plan path, result paths)."""
    rng = random.Random(seed)
    catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    sweep = SweepSection.of({"models": MODELS, "gpus": GPUS, "nodes": [1, 2], "gpus_per_node": [1, 2, 4, 8],
                             "methods": all_methods()})  # fmt: skip
    planned = expand(sweep, LauncherSection.given({"kind": "slurm"}), catalog)
    rows = [{**p.row(), "partition": "gpu", "time_limit_min": 120,
             "gpu_hours_max": p.cell.world_size * 2.0 if p.valid else 0.0} for p in planned]  # fmt: skip
    valid_all = [p for p in planned if p.valid]
    chosen = set(rng.sample(range(len(valid_all)), min(n, len(valid_all))))
    valid = [p for i, p in enumerate(valid_all) if i in chosen]
    keep = {p.cell for p in valid}
    rows = [r for r, p in zip(rows, planned, strict=True) if p.cell in keep or not p.valid]
    header = list(rows[0])
    plan = folder / "plan.csv"
    atomic_write_text(plan, markdown.csv_text(header, ([r[k] for k in header] for r in rows)))
    paths = []
    for p in valid:
        c, m, g = p.cell, catalog.models[p.cell.model], catalog.gpus[p.cell.gpu]
        method = methods.parse(c.method)
        gb = m.recipe.global_batch
        per = train_flops_per_sample(m.to_dict()) or 4.0e10 * (m.recipe.image_size or 224) ** 2 / 224**2
        flops = per * gb
        peak = g.peak_for(m.recipe.precision, tf32=method.free_lunch)
        tokens_per_sample = m.recipe.sequence_length or 197
        params = per / (6 * tokens_per_sample)  # ~ matmul parameters
        shard = {None: 1, "zero1": 0.6, "zero2": 0.45, "zero3": 1 / c.world_size, "fsdp-grad": 0.45,
                 "fsdp-full": 1 / c.world_size}[method.sharding] if c.world_size > 1 else 1  # fmt: skip
        need_gib = 16 * params * shard * (0.3 if method.offload else 1) / 2**30 + 2
        roll = rng.random()
        result = {"model": c.model, "gpu": c.gpu, "nodes": c.nodes, "gpus_per_node": c.gpus_per_node,
                  "world_size": c.world_size, "method": c.method, "precision": m.recipe.precision, "global_batch": gb,
                  "wall_time_s": rng.uniform(60, 900), "versions": {"torch": "synthetic"}}  # fmt: skip
        if roll < 0.03:
            result.update(status="unsupported", reason="synthetic: method not available here")
        elif need_gib > 0.9 * (g.memory_gib or 80):
            result.update(status="oom", reason="micro-batch 1 does not fit on every rank")
        else:
            mfu = rng.uniform(0.35, 0.6) if method.free_lunch else rng.uniform(0.2, 0.4)
            mfu *= 0.8 if method.checkpointing else 1.0
            mfu *= 0.9 if method.sharding else 1.0
            mfu *= 0.5 if method.offload else 1.0
            step = flops / (c.world_size * peak * 1e12 * mfu)
            mb = 2 ** rng.randint(0, max(0, int(gb // c.world_size).bit_length() - 1))
            mb = min(mb, gb // c.world_size)
            steps = m.recipe.steps
            tokens = m.recipe.sequence_length
            result.update(
                status="ok", micro_batch=mb, grad_accum_steps=gb // c.world_size // mb, step_time_s=step,
                step_time_p10_s=step * 0.97, step_time_p90_s=step * 1.05, timed_steps=5, warmup_steps=2,
                samples_per_s=gb / step, tokens_per_s=gb * tokens / step if tokens else None,
                flops_per_step=flops, peak_tflops=peak, mfu=mfu, suspect=False, peak_mem_gib=rng.uniform(5, 70),
                recipe_steps=steps, training_days=steps * step / 86400 if steps else None,
                steps_in_budget=m.recipe.time_budget_hours * 3600 / step if m.recipe.time_budget_hours else None,
                method_settings={"base": method.base}, micro_batch_trials=[{"micro_batch": mb, "fits": True}],
            )  # fmt: skip
        path = folder / c.path / "result.json"
        write_result(path, result)
        paths.append(str(path))
    return str(plan), paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/aggregate.md"))
    ap.add_argument("--repeat", type=int, default=3, help="runs of each stage (min, median and max are reported)")
    ap.add_argument("--keep", help="keep the synthetic results folder here (default: a temporary folder)")
    args = ap.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="pp-aggbench-"))
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    results = work / "results"
    catalog = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml")
    costs = CostsSection.given({"amortisation_years": 5, "pareto_cost": "hardware"})
    t: dict[str, tuple[float, ...]] = {}
    t0 = time.perf_counter()
    plan, paths = synthesise(results, args.n)
    synth_s = time.perf_counter() - t0
    tables = aggregate.table_files(str(results / "tables"))
    plots = pp_plots.plot_files(str(results / "plots"))
    logs = results / "logs"

    def stage(name, fn):
        """Run fn `--repeat` times: wall seconds (min, median, max) and CPU seconds of the fastest run."""
        walls, cpus, value = [], [], None
        for _ in range(args.repeat):
            w0, c0 = time.perf_counter(), time.process_time()
            value = fn()
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        best = walls.index(min(walls))
        t[name] = (min(walls), statistics.median(walls), max(walls), cpus[best])
        return value

    load_before = os.getloadavg()
    built = stage(
        "tables: aggregate.build_tables",
        lambda: aggregate.build_tables(plan, paths, tables, str(logs / "aggregate.log"), catalog, costs),
    )
    stage("plots: report.make_plots (5 plots, PNG + SVG)",
          lambda: pp_plots.make_plots(tables, plots, str(logs / "plots.log"), costs))  # fmt: skip
    index = stage(
        "export: export.export_plans",
        lambda: export.export_plans(
            tables["time_to_train_csv"],
            tables["feasibility_csv"],
            str(results / "optimal"),
            str(logs / "export.log"),
            catalog,
        ),
    )
    stage("report: report.write_report",
          lambda: document.write_report(tables, plots, str(results / "optimal"), str(results / "report.md"),
                                      str(logs / "report.log"), costs))  # fmt: skip
    extra = {**study.table_files(str(results / "tables" / "study")), **whatif.table_files(str(results / "tables"))}
    views = stage("study: study.build_study_tables (9 views)",
                  lambda: study.build_study_tables(tables["cells_parquet"], extra, str(logs / "study.log"), catalog,
                                                   0.85))  # fmt: skip
    predicted = stage("whatif: whatif.build_whatif (every GPU type x count)",
                      lambda: whatif.build_whatif(tables["cells_parquet"], extra, str(logs / "whatif.log"), catalog,
                                                  MODELS, [(n, g) for n in (1, 2) for g in (1, 2, 4, 8)], 0.85,
                                                  costs.to_json()))  # fmt: skip
    stage("study plots: study_plots.make_plots (5 plots, PNG + SVG)",
          lambda: study_plots.make_plots({**tables, **extra}, study_plots.plot_files(str(results / "plots" / "study")),
                                         str(logs / "study_plots.log")))  # fmt: skip
    load_after = os.getloadavg()

    shape = {name: df.height for name, df in built.items()}
    status = dict(built["cells"].group_by("status").len().sort("status").rows())
    versions = {k: metadata.version(k) for k in ("polars", "matplotlib", "pyarrow") if _has(k)}
    lines = [
        "# Aggregation benchmark",
        "",
        f"- date: {dt.datetime.now().isoformat(timespec='seconds')}",
        f"- command: `{' '.join([Path(sys.executable).name, *sys.argv])}`",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs visible, POLARS_MAX_THREADS="
        f"{os.environ.get('POLARS_MAX_THREADS', '(unset)')}; Python {platform.python_version()}; "
        + ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"- input: {len(paths)} synthetic result.json files ({status}): a seeded sample of the valid cells of "
        f"{len(MODELS)} models x {len(GPUS)} GPU types x 2 node counts x 4 GPUs/node x {len(all_methods())} methods; "
        f"plan.csv of {built['cells'].height} cells (the sample plus every invalid cell)",
        f"- output rows: {shape}; {sum(1 for e in index if e['best_method'])} exported plans",
        f"- study views (rows): { ({n: (v[0] if isinstance(v, tuple) else v).height for n, v in views.items()}) }; "
        f"what-if: {predicted.height} predictions {dict(predicted.group_by('status').len().sort('status').rows())}",
        "",
        f"- load average (1 min) before / after the timed stages: {load_before[0]:.2f} / {load_after[0]:.2f} "
        "(other jobs on the machine inflate wall time; CPU time is this process's own)",
        f"- writing the synthetic inputs took {synth_s:.1f} s (not part of any stage)",
        "",
        *markdown.plain(
            [
                f"stage ({args.repeat} runs)",
                "wall min (s)",
                "wall median (s)",
                "wall max (s)",
                "CPU of the fastest run (s)",
            ],
            [[k, *(f"{x:.2f}" for x in v)] for k, v in t.items()],
        ),
        "",
        f"Target: tables < 2 s on 2 cores -> {'met' if t['tables: aggregate.build_tables'][0] < 2 else 'NOT met'} "
        f"(fastest of {args.repeat} runs: {t['tables: aggregate.build_tables'][0]:.2f} s).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    if not args.keep:
        shutil.rmtree(work)
    return 0


def _has(pkg: str) -> bool:
    return installed_version(pkg) is not None


if __name__ == "__main__":
    raise SystemExit(main())
