"""results/report.md: the tables and plots of a sweep, with a paragraph each on how to read them.

The paragraphs live in workflow/report/*.rst, one file per table or plot (the captions of `snakemake --report`'s
HTML report; the rules mark the outputs with `for_report`): one text for both documents. This module adds
what only report.md has: the numbers of this sweep, the tables in Markdown, the links. Imports no torch."""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pretrain_planner import layout
from pretrain_planner.planning.configtypes import CostsSection
from pretrain_planner.planning.losscheck import DIFFERS, NOT_CHECKED, SAME
from pretrain_planner.report.calendar_plot import CALENDAR_PLOTS
from pretrain_planner.report.loss_plot import LOSS_PLOTS
from pretrain_planner.report.plots import PLOTS as BASE_PLOTS
from pretrain_planner.report.study_plots import STUDY_PLOTS
from pretrain_planner.results import atomic_write_text
from pretrain_planner.tables import costs as pp_costs
from pretrain_planner.tables import units
from pretrain_planner.tables.aggregate import UNCHECKED, markdown_body, oom_section, read_table

# workflow/report/: the snakemake-workflows convention, beside the rules (the package runs from the repository)
CAPTIONS = Path(__file__).resolve().parents[2] / "report"
PLOTS = {**BASE_PLOTS, **STUDY_PLOTS, **CALENDAR_PLOTS, **LOSS_PLOTS}  # every plot: key -> (file stem, title)
MAX_ROWS = 200  # report.md shows at most this many rows of a table (the CSV holds them all)


def caption_file(stem: str) -> Path:
    return CAPTIONS / f"{stem}.rst"


def paragraphs(stem: str) -> list[str]:
    """The paragraphs of workflow/report/{stem}.rst as Markdown: one line each, ``code`` written `code`."""
    text = caption_file(stem).read_text(encoding="utf-8").strip()
    return [re.sub(r"``(.+?)``", r"`\1`", " ".join(p.split())) for p in re.split(r"\n\s*\n", text)]


def caption_of(key: str) -> str | None:
    """The caption file of an output that the HTML report shows (keys as aggregate.table_files and
    plots.plot_files): every table's CSV and every plot's PNG (its SVG would show the same). None for the rest."""
    name, _, ext = key.rpartition("_")
    if ext == "csv":
        return str(caption_file(name))
    if ext == "png" and name in PLOTS:
        return str(caption_file(PLOTS[name][0]))
    return None


def for_report(files: dict[str, str], category: str) -> dict[str, Any]:
    """A rule's outputs (name -> path) with those `caption_of` names flagged by Snakemake's report(): shown by
    `snakemake --report report.html` under `category`, with their caption."""
    from snakemake.io import report

    return {k: report(v, caption=c, category=category) if (c := caption_of(k)) else v for k, v in files.items()}


# ------------------------------------------------------------------------------------------- pieces


@dataclass(frozen=True)
class Links:
    """Paths of the tables and plots, written relative to report.md's folder."""

    tables: dict[str, str]
    plots: dict[str, str]
    base: Path

    def rel(self, path: str | Path) -> str:
        return os.path.relpath(Path(path).resolve(), self.base.resolve())

    def img(self, key: str) -> str:
        title = PLOTS[key][1]
        png, svg = self.rel(self.plots[f"{key}_png"]), self.rel(self.plots[f"{key}_svg"])
        return f"![{title}]({png}) ([SVG]({svg}))\n"

    def table(self, name: str) -> str:
        csv, md = self.rel(self.tables[f"{name}_csv"]), self.rel(self.tables[f"{name}_md"])
        return f"[{name}.csv]({csv}) / [{name}.md]({md})"

    def described(self, name: str) -> str:
        """A table's paragraph (its caption) and the link to the whole table."""
        return f"{' '.join(paragraphs(name))} Full table: {self.table(name)}.\n"

    def plot(self, key: str) -> list[str]:
        """A plot and its paragraph (its caption)."""
        return [self.img(key), *(p + "\n" for p in paragraphs(PLOTS[key][0]))]


def _summary_lines(ttt: pl.DataFrame, pareto: pl.DataFrame) -> list[str]:
    lines = []
    for model in sorted(set(ttt["model"].to_list())):
        mine = ttt.filter(pl.col("model") == model).filter(pl.col("training_days").is_not_null())
        if mine.is_empty():
            continue
        r = mine.sort("training_days").row(0, named=True)
        line = (
            f"- **{model}**: fastest measured setting {r['nodes']}x{r['gpus_per_node']} {r['gpu']} with "
            f"`{r['best_method']}`: {units.days(r['training_days'])}"
        )
        front = pareto.filter(pl.col("model") == model).sort("cost_usd")
        if front.height:
            c = front.row(0, named=True)
            line += (
                f"; cheapest on the Pareto front {units.layout(c['nodes'], c['gpus_per_node'])} {c['gpu']} "
                f"({c['best_method']}): "
                f"{units.days(c['training_days'])} for {units.usd(c['cost_usd'])} ({c['cost_kind']})"
            )
        lines.append(line)
    return lines or ["- no setting has run successfully yet"]


def _header(cells: pl.DataFrame, ttt: pl.DataFrame, pareto: pl.DataFrame) -> list[str]:
    by_status = dict(cells.group_by("status").len().sort("status").rows())
    status_txt = ", ".join(f"{n} {s}" for s, n in by_status.items())
    return [
        "# Pre-training plan: results\n",
        f"Generated {dt.datetime.now().isoformat(timespec='seconds')} from {cells.height} cells ({status_txt}).\n",
        *(p + "\n" for p in paragraphs("workflow")),
        "## Summary\n",
        *_summary_lines(ttt, pareto),
        "",
    ]


def _time_to_train(ttt: pl.DataFrame, links: Links) -> list[str]:
    first = paragraphs("time_to_train")[0]
    return [
        "## Time to train\n",
        f"{first} Full table: {links.table('time_to_train')}.\n",
        markdown_body("time_to_train", ttt, MAX_ROWS),
        *links.plot("days"),
    ]


def _calendar(links: Links) -> list[str]:
    """When each setting finishes if submitted now (tables/calendar.py): the table's lead rows, the timeline."""
    if "calendar_csv" not in links.tables:
        return []
    from pretrain_planner.tables.calendar import read_calendar

    cal = read_calendar(links.tables["calendar_csv"])
    first = cal.filter(pl.col("finishes_first"))
    lines = [f"- {r['model']} ({r['run']}): {r['nodes']}x{r['gpus_per_node']} {r['gpu']} finishes first, "
             f"{r['expected_finish']} ({units.days(r['calendar_days'])} of calendar time for "
             f"{units.days(r['compute_days'])} of compute)" for r in first.iter_rows(named=True)]  # fmt: skip
    return [
        "## When will it finish?\n",
        links.described("calendar"),
        *(["\n".join(lines) + "\n"] if lines else []),
        markdown_body("calendar", cal, MAX_ROWS),
        *links.plot("calendar"),
    ]


def _feasibility(feas: pl.DataFrame, cells: pl.DataFrame, links: Links) -> list[str]:
    """The settings' verdicts, and why what does not fit does not, with the cheapest fix (tables/memfix.py)."""
    oom = oom_section(cells).replace("## Out of memory", "### Out of memory")
    return ["## Feasibility\n", links.described("feasibility"), markdown_body("feasibility", feas, MAX_ROWS), oom,
            *links.plot("feasibility")]  # fmt: skip


def _loss_check(links: Links) -> list[str]:
    """Whether each checked method trains the same model as naive (planning/losscheck.py): the verdicts and the
    curves inside naive's band."""
    path = links.tables.get("loss_check_csv")
    if not path or not Path(path).is_file():
        return []
    checks = read_table(path)
    lines = checks.filter(pl.col("role") == "method")
    if lines.is_empty():
        said = "No method was checked in this sweep" + _unchecked_reasons(checks) + "."
    else:
        verdict = pl.col("loss").fill_null(NOT_CHECKED)
        same = lines.filter(verdict == SAME).height
        differs = lines.filter(verdict.str.starts_with(DIFFERS)).height
        settings = lines.select("model", "gpu", "nodes", "gpus_per_node").unique().height
        n, unchecked = lines.height, lines.height - same - differs
        said = (f"{n} method line{'s' * (n != 1)} at {settings} setting{'s' * (settings != 1)}: {same} `same` as "
                f"naive, {differs} `differs`, {unchecked} `not checked`.")  # fmt: skip
    return [
        "## Does each method train the same model?\n",
        links.described("loss_check"),
        said + "\n",
        *([markdown_body("loss_check", checks, MAX_ROWS)] if checks.height else []),
        *(links.plot("loss_check") if "loss_check_png" in links.plots else []),
    ]


def _unchecked_reasons(checks: pl.DataFrame) -> str:
    """': <reason> (N settings); ...' from the table's `unchecked` lines (tables/aggregate.loss_check_table)."""
    if "note" not in checks.columns:
        return ""
    notes = checks.filter(pl.col("role") == UNCHECKED)["note"].drop_nulls().to_list()
    counted = {n: notes.count(n) for n in dict.fromkeys(notes)}
    return (": " + "; ".join(f"{n} ({k} setting{'s' * (k != 1)})" for n, k in counted.items())) if counted else ""


def _costs(pareto: pl.DataFrame, kind: str, links: Links) -> list[str]:
    table = (
        markdown_body("pareto", pareto, MAX_ROWS)
        if pareto.height
        else f"No setting has both a time to train and a known {kind} cost yet (see `cost_note` in costs.csv).\n"
    )
    return [
        "## Costs and the Pareto front\n",
        links.described("costs"),
        links.described("pareto"),
        table,
        *links.plot("cost_days"),
    ]


def _measured_vs_analytic(ttt: pl.DataFrame) -> list[str]:
    return [
        "## Measured vs analytic\n",
        paragraphs("time_to_train")[1] + "\n",
        markdown_body("measured_vs_analytic", ttt, MAX_ROWS),
    ]


def _problems(problems: pl.DataFrame) -> list[str]:
    if problems.is_empty():
        return ["## Problems\n", "None: every result file was usable.\n"]
    return ["## Problems\n", " ".join(paragraphs("problems")) + "\n", markdown_body("problems", problems, MAX_ROWS)]


def _exported_plans(optimal_dir: str | None, links: Links) -> list[str]:
    if not optimal_dir or not Path(optimal_dir, layout.OPTIMAL_INDEX).is_file():
        return []
    index = read_table(Path(optimal_dir) / layout.OPTIMAL_INDEX)
    planned = index.filter(pl.col("best_method").is_not_null()).height
    rel = links.rel(optimal_dir)
    return [
        "## Exported plans\n",
        f"{planned} settings have a plan in [{rel}/]({rel}/index.csv): "
        "`training_arguments.json` (keyword arguments of `transformers.TrainingArguments`), `deepspeed.json` "
        "for ZeRO methods, `launch.sh` (torchrun, or srun + torchrun on SLURM) and `plan.json` (the "
        "measurement and the model it rests on).\n",
    ]


def _benchmark_cost(links: Links) -> list[str]:
    """What the benchmark itself cost: GPU-hours spent, and (adaptive search) the cells it pruned."""
    path = links.tables.get("benchmark_cost_csv")
    if not path or not Path(path).is_file():
        return []
    cost = read_table(path)
    spent = cost["gpu_hours_spent"].sum() or 0.0
    bound = cost["gpu_hours_max_exhaustive"].sum() or 0.0
    adaptive = cost.height and (cost["strategy"] == "adaptive").any()
    said = (f"The benchmark spent **{units.number(spent)} GPU-hours**; measuring every valid cell could take up to "
            f"{units.number(bound)}.")  # fmt: skip
    if adaptive:
        said += (
            f" The adaptive search ran {int(cost['methods_run'].sum())} cells and pruned "
            f"{int(cost['methods_pruned'].sum())} that could not be their setting's fastest."
        )
    return ["## Benchmark cost\n", said + "\n", links.described("benchmark_cost")]


def _study(links: Links) -> list[str]:
    """The study's views (tables/study.py) and the what-if predictions, each with its paragraph."""
    if "days_optimal_csv" not in links.tables or not Path(links.tables["days_optimal_csv"]).is_file():
        return []
    from pretrain_planner.tables.study import sweep_line  # what this sweep's views show: the captions say no sweep's

    cells = pl.read_parquet(links.tables["cells_parquet"])
    md = ["## The study's views\n", " ".join([*paragraphs("study_views"), sweep_line(cells)]) + "\n"]
    for name in ("days_optimal", "days_naive", "optimal_settings"):
        md.append(links.described(name))
    md.append(Path(links.tables["days_optimal_md"]).read_text().split("\n\n", 2)[-1])
    md += links.plot("study_days")
    md += [links.described("gpu_days"), *links.plot("gpu_days")]
    md += [links.described("speedups"), links.described("step_time_stats"), *links.plot("speedups")]
    md += [links.described("memory_saving"), *links.plot("memory_saving")]
    md += [links.described("model_flops"), links.described("study_claims")]
    claims = Path(links.tables["study_claims_md"]).read_text().split("\n\n", 2)[-1]
    md += [claims, "### What the study's numbers mean\n", " ".join(paragraphs("study_reading")) + "\n"]
    if "whatif_csv" in links.tables and Path(links.tables["whatif_csv"]).is_file():
        from pretrain_planner.tables.whatif import read_error_sentence  # the figures of this run's fit, generated

        error = read_error_sentence(links.tables["whatif_md"]) if "whatif_md" in links.tables else None
        said = [f"{error} Every kind of transfer's error: {links.table('whatif')}.\n"] if error else []
        md += ["## What-if: GPU types you do not own (predictions)\n", links.described("whatif"), *said,
               *links.plot("whatif")]  # fmt: skip
    return md


def _files(links: Links) -> list[str]:
    names = [n for n in ("cells", "time_to_train", "feasibility", "costs", "pareto", "problems", "benchmark_cost")
             if f"{n}_csv" in links.tables]  # fmt: skip
    return [
        "## Files\n",
        " ".join(paragraphs("cells")) + "\n",
        "\n".join(f"- {links.table(n)}" for n in names)
        + f"\n- [cells.parquet]({links.rel(links.tables['cells_parquet'])}): every column, nested settings included\n",
    ]


# ------------------------------------------------------------------------------------------ the report rule


def write_report(
    tables: dict[str, str],
    plots: dict[str, str],
    optimal_dir: str | None,
    out_md: str,
    log_path: str,
    costs: CostsSection | None = None,
) -> None:
    """The `report` rule: results/report.md, section by section (`costs`: the config's section, typed: the Pareto
    front's cost axis; None: the schema's defaults)."""
    conf = pp_costs.typed(costs, "report.document.write_report")
    links = Links(tables, plots, Path(out_md).parent)
    cells = pl.read_parquet(tables["cells_parquet"])
    ttt = read_table(tables["time_to_train_csv"])
    pareto = read_table(tables["pareto_csv"])
    md = [
        *_header(cells, ttt, pareto),
        *_time_to_train(ttt, links),
        *_calendar(links),
        *_feasibility(read_table(tables["feasibility_csv"]), cells, links),
        *_loss_check(links),
        *_costs(pareto, conf.pareto_cost, links),
        *_measured_vs_analytic(ttt),
        "## MFU and step time by method\n",
        *links.plot("mfu"),
        *links.plot("methods"),
        *_problems(read_table(tables["problems_csv"])),
        *_exported_plans(optimal_dir, links),
        *_benchmark_cost(links),
        *_study(links),
        *_files(links),
    ]
    atomic_write_text(out_md, "\n".join(md))
    atomic_write_text(log_path, f"report: {cells.height} cells, {ttt.height} settings, {pareto.height} on a front\n")
