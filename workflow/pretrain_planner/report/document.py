"""results/report.md: the tables and plots of a sweep, with a paragraph each on how to read them. Imports no
torch."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import polars as pl

from pretrain_planner.report.plots import PLOTS
from pretrain_planner.results import atomic_write_text
from pretrain_planner.tables import costs as pp_costs
from pretrain_planner.tables.aggregate import GROUP, read_table, to_markdown


def _rel(path: str, base: Path) -> str:
    return os.path.relpath(Path(path).resolve(), base.resolve())


def _img(key: str, plots: dict[str, str], base: Path) -> str:
    stem, title = PLOTS[key]
    return f"![{title}]({_rel(plots[f'{key}_png'], base)}) ([SVG]({_rel(plots[f'{key}_svg'], base)}))\n"


def _link(name: str, tables: dict[str, str], base: Path) -> str:
    return f"[{name}.csv]({_rel(tables[f'{name}_csv'], base)}) / [{name}.md]({_rel(tables[f'{name}_md'], base)})"


def _summary_lines(ttt: pl.DataFrame, pareto: pl.DataFrame) -> list[str]:
    lines = []
    for model in sorted(set(ttt["model"].to_list())):
        mine = ttt.filter(pl.col("model") == model).filter(pl.col("training_days").is_not_null())
        if mine.is_empty():
            continue
        r = mine.sort("training_days").row(0, named=True)
        line = (
            f"- **{model}**: fastest measured setting {r['nodes']}x{r['gpus_per_node']} {r['gpu']} with "
            f"`{r['best_method']}`: {r['training_days']:.3g} days"
        )
        front = pareto.filter(pl.col("model") == model).sort("cost_usd")
        if front.height:
            c = front.row(0, named=True)
            line += (
                f"; cheapest on the Pareto front {c['world_size']}x{c['gpu']} ({c['best_method']}): "
                f"{c['training_days']:.3g} days for {pp_costs.usd(c['cost_usd'])} ({c['cost_kind']})"
            )
        lines.append(line)
    return lines or ["- no setting has run successfully yet"]


def _benchmark_cost_section(cost: pl.DataFrame, tables: dict[str, str], base: Path) -> list[str]:
    """What the benchmark itself cost: GPU-hours spent, and (adaptive search) the cells it pruned."""
    spent = cost["gpu_hours_spent"].sum() or 0.0
    bound = cost["gpu_hours_max_exhaustive"].sum() or 0.0
    adaptive = cost.height and (cost["strategy"] == "adaptive").any()
    lines = [
        "## Benchmark cost\n",
        f"The benchmark spent **{spent:.3g} GPU-hours** (wall time x GPUs of every measured cell); measuring every "
        f"valid cell could take up to {bound:.3g} GPU-hours (the time limits' bound). "
        + (
            f"The adaptive search ran {int(cost['methods_run'].sum())} cells and pruned "
            f"{int(cost['methods_pruned'].sum())} that could not be their setting's fastest (status `pruned` in "
            "cells.csv, with the reason). "
            if adaptive
            else ""
        )
        + f"Full table: {_link('benchmark_cost', tables, base)}.\n",
    ]
    return lines


def write_report(
    tables: dict[str, str],
    plots: dict[str, str],
    optimal_dir: str | None,
    out_md: str,
    log_path: str,
    costs_config: dict | None = None,
) -> None:
    """The `report` rule: results/report.md."""
    conf = pp_costs.settings(costs_config)
    base = Path(out_md).parent
    cells = pl.read_parquet(tables["cells_parquet"])
    ttt = read_table(tables["time_to_train_csv"])
    pareto = read_table(tables["pareto_csv"])
    problems = read_table(tables["problems_csv"])
    by_status = dict(cells.group_by("status").len().sort("status").rows())
    status_txt = ", ".join(f"{n} {s}" for s, n in by_status.items())
    kind, years = conf["pareto_cost"], conf["amortisation_years"]
    md: list[str] = [
        "# Pre-training plan: results\n",
        f"Generated {dt.datetime.now().isoformat(timespec='seconds')} by pretrain-planner from {cells.height} cells "
        f"({status_txt}). Every number below is a measurement of this sweep unless it says *analytic*.\n",
        "## Summary\n",
        *_summary_lines(ttt, pareto),
        "",
        "## Time to train\n",
        "One row per model x GPU type x count: the fastest method that ran (not `suspect`), its micro-batch and "
        "gradient accumulation, the median optimizer step with its p10/p90 spread, throughput, MFU and peak memory. "
        "**training_days** is the recipe's step count times the median step. `days_naive` / `days_fl` are the "
        "days with `naive` and with free-lunch alone, and `speedup_vs_*` how much faster the best method is than "
        "each (1 = it is that method). A blank cell means not measured or not known (e.g. no MFU without a GPU "
        f"peak). Full table: {_link('time_to_train', tables, base)}.\n",
        to_markdown(
            ttt.select(
                *GROUP,
                "best_method",
                "micro_batch_size",
                "grad_accum_steps",
                "step_time_s",
                "mfu",
                "training_days",
                "days_naive",
                "days_fl",
                "speedup_vs_naive",
                "speedup_vs_fl",
            ),  # fmt: skip
            max_rows=200,
        ),
        _img("days", plots, base),
        "Each bar is one setting (model, GPU type, nodes x GPUs per node) with its fastest method, labelled with "
        "its days (colour: GPU type); the axis is logarithmic when the days span more than a factor 100.\n",
        "## Feasibility\n",
        "Which settings fit in memory at all. `naive` and `fl` say what that method did there: `fits`, `oom` "
        "(even micro-batch 1 did not fit), `unsupported`, `invalid` (the plan rules it out; reason in plan.csv), "
        "`missing`/`corrupt` (no usable result yet) or `not swept`. `fits_any` is true if any method ran; "
        "`verdict` is the best that can be said, and `fitting_methods` lists every method that ran. "
        f"Full table: {_link('feasibility', tables, base)}.\n",
        _img("feasibility", plots, base),
        "Rows are model / GPU type, columns the GPU count (nodes x GPUs per node); the colour is the verdict "
        "(dark green: even naive fits; light green: free-lunch needed; yellow: only checkpointing or sharding "
        "fits; red: out of memory) and the text the fastest method.\n",
        "## Costs and the Pareto front\n",
        'What the best setting costs, with the "$100K or 100 Days" study\'s arithmetic: **hardware_usd** = base '
        "machine for the GPU count (per node) + GPUs x GPU price; **amortised_usd** = hardware x days / "
        f"({years:g} years x 365), the share of the machine's life the run uses; **cloud_usd** = $/GPU-hour x GPUs "
        "x hours. Prices come from config/gpus.yaml; a blank cost has its reason in `cost_note` (fill in the "
        f"price to get it). `pareto` marks the settings on their model's front. Full table: "
        f"{_link('costs', tables, base)}.\n",
        f"The Pareto table keeps, per model, only the settings that no other setting beats in both days and "
        f"{kind} cost: every other setting is slower and no cheaper, or dearer and no faster. Pick from it by "
        f"budget or deadline. Full table: {_link('pareto', tables, base)}.\n",
        to_markdown(pareto, max_rows=200)
        if pareto.height
        else f"No setting has both a time to train and a known {kind} cost yet (see `cost_note` in costs.csv).\n",
        _img("cost_days", plots, base),
        "One panel per model: each point is a setting with its fastest method, days on a log axis, colour the "
        "GPU type, size the GPU count; black-edged points joined by the black step line are the Pareto front.\n",
        "## Measured vs analytic\n",
        "The analytic estimate assumes every GPU runs at its dense peak: FLOPs per step (the one formula in "
        "flops.py x the global batch) / (GPUs x peak) gives `analytic_step_time_s` and `analytic_days`; "
        "`measured_over_analytic` is how many times slower the measurement is (1 / MFU). Values near 1 are "
        "implausible (the `suspect` check), 2-4 is typical of good training runs. Blank where the GPU type "
        "declares no peak.\n",
        to_markdown(
            ttt.select(*GROUP, "best_method", "training_days", "analytic_days", "measured_over_analytic"),
            max_rows=200,
        ),
        "## MFU and step time by method\n",
        _img("mfu", plots, base),
        "MFU (model FLOPs utilisation) of every cell that ran, per method: the share of the GPUs' dense peak the "
        "training FLOPs use. Higher is better; free-lunch should beat naive, memory saving costs some.\n",
        _img("methods", plots, base),
        "Median seconds per optimizer step of every cell that ran (whiskers: p10-p90), or, for large sweeps, "
        "each method's step time relative to the fastest method of the same setting.\n",
        "## Problems\n",
        (
            "Result files the aggregation could not use; their cells count as `corrupt` and are skipped "
            f"everywhere else:\n\n{to_markdown(problems, max_rows=200)}"
            if problems.height
            else "None: every result file was usable.\n"
        ),
    ]
    if optimal_dir and Path(optimal_dir, "index.csv").is_file():
        index = read_table(Path(optimal_dir) / "index.csv")
        planned = index.filter(pl.col("best_method").is_not_null()).height
        md += [
            "## Exported plans\n",
            f"{planned} settings have a plan in [{_rel(optimal_dir, base)}/]({_rel(optimal_dir, base)}/index.csv): "
            "`training_arguments.json` (keyword arguments of `transformers.TrainingArguments`), `deepspeed.json` "
            "for ZeRO methods, `launch.sh` (torchrun, or srun + torchrun on SLURM) and `plan.json` (the "
            "measurement and the model it rests on).\n",
        ]
    if "benchmark_cost_csv" in tables and Path(tables["benchmark_cost_csv"]).is_file():
        md += _benchmark_cost_section(read_table(tables["benchmark_cost_csv"]), tables, base)
    md += [
        "## Files\n",
        "\n".join(
            f"- {_link(n, tables, base)}"
            for n in ("cells", "time_to_train", "feasibility", "costs", "pareto", "problems", "benchmark_cost")
            if f"{n}_csv" in tables
        )  # fmt: skip
        + f"\n- [cells.parquet]({_rel(tables['cells_parquet'], base)}): every column, nested settings included\n",
    ]
    atomic_write_text(out_md, "\n".join(md))
    atomic_write_text(log_path, f"report: {cells.height} cells, {ttt.height} settings, {pareto.height} on a front\n")
