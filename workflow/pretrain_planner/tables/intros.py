"""The prose of the aggregate's Markdown tables (results/tables/*.md): each file's title and the paragraph that says
what its table holds, and the out-of-memory section's, said once for the reader; apart from how the tables are
computed (tables/aggregate.py) and how their columns are shown (tables/views.py, tables/markdown.py). Imports no
torch."""

from __future__ import annotations

import textwrap

from pretrain_planner.tables.markdown import WIDTH

TABLE_INTROS = {
    "cells": "Every cell of the plan joined with its result (status ok, noisy, oom, unsupported, invalid, missing, "
    "corrupt); mb x accum = micro-batch x gradient accumulation steps; start-up = what one restart of the setting "
    "costs before it trains (process start to rank up, model build, method wrapping, data, compile), compile = its "
    "first step's extra time.",
    "time_to_train": "Fastest method that ran per model x GPU type x count (suspect and noisy timings excluded), "
    "beside "
    "naive and free-lunch (`fl`) alone and the analytic estimate at 100% of the dense peak.",
    "feasibility": "Which settings fit in memory with naive, with free-lunch alone, and with any method.",
    "loss_check": "Whether each checked method trains the same model as naive: from naive's initial weights on "
    "naive's batches, its loss (and gradient norm) per step against naive's, inside the band naive's own legitimate "
    "variants span (another micro-batch split, another world size, another dropout seed); `same`, or `differs` with "
    'the tail\'s relative difference and the step where it left (docs/methods.md "Loss equivalence"). A '
    "`precision` line compares naive at a method's precision with naive.",
    "costs": "What the best setting of each model x GPU type x count costs: hardware purchase, amortised "
    "experiment cost, cloud rent. A blank cost has its reason in `cost_note`.",
    "pareto": "Per model, the settings that no other setting beats in both days to train and cost.",
    "problems": "Result files that could not be used (skipped by the aggregation), and why.",
    "benchmark_cost": "GPU-hours the benchmark itself spent per setting (wall time x GPUs of each measured cell), "
    "the cells it ran and pruned (adaptive search; reasons in cells.csv), and the time-limit bound of the cells "
    "run beside that of every valid cell (what the exhaustive search could spend).",
}

OOM_INTRO = (
    "Each cell that did not fit even at micro-batch 1: the memory it needs at micro-batch 1 per GPU (measured where a "
    "cell of the same model, method and GPU count ran at micro-batch 1, or out of memory on a GPU that large; else "
    "the memory model's lower bound, `>=`) against the GPU's, and the cheapest change that fits: a method measured to "
    "fit here, else a memory-saving method, more GPUs, a GPU type with more memory, a shorter sequence "
    "(tables/memfix.py; cells.csv has the same columns)."
)


def opening(name: str) -> str:
    """Table `name`'s Markdown file up to its table: the title, then what it holds and where every column is."""
    title = name.replace("_", " ").capitalize()
    where = f"Every column, unrounded: {name}.csv beside this file" + (
        " (and cells.parquet)." if name == "cells" else "."
    )
    intro = textwrap.fill(f"{TABLE_INTROS[name]} {where}", WIDTH)
    return f"# {title}\n\n{intro}\n\n"


def oom_opening(any_oom: bool) -> str:
    """feasibility.md's out-of-memory section up to its table; without an `oom` cell, the whole section."""
    if not any_oom:
        return "\n## Out of memory\n\nNo cell ran out of memory.\n"
    return f"\n## Out of memory\n\n{textwrap.fill(OOM_INTRO, WIDTH)}\n\n"
