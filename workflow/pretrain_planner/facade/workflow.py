"""The workflow's targets and its checkpoint-dependent inputs, in one place: every file the rules make (by the modules
that own their names), what `rule all` asks for, and the input functions that read the adaptive search's rounds
(Snakemake checkpoints). The .smk files ask these; they hold no logic of their own. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from snakemake.io import ancient

from pretrain_planner import layout
from pretrain_planner import search as pp_search
from pretrain_planner.facade.pipeline import SETTING_KEYS, Pipeline
from pretrain_planner.report import calendar_plot, loss_plot, plots, study_plots
from pretrain_planner.tables import aggregate, calendar, study, whatif


@dataclass(frozen=True)
class Files:
    """Every table, plot and report file of a results folder, each a {name: path} of the module that writes it."""

    plan: str
    tables: dict[str, str]
    plots: dict[str, str]
    study_tables: dict[str, str]
    whatif: dict[str, str]
    calendar: dict[str, str]
    study_plots: dict[str, str]
    calendar_plots: dict[str, str]
    loss_plots: dict[str, str]
    optimal: str
    report: str

    @classmethod
    def of(cls, results: str) -> Files:
        tables, figures = f"{results}/{layout.TABLES}", f"{results}/{layout.PLOTS}"
        return cls(
            plan=f"{results}/{layout.PLAN}",
            tables=aggregate.table_files(tables),
            plots=plots.plot_files(figures),
            study_tables=study.table_files(f"{results}/{layout.STUDY}"),
            whatif=whatif.table_files(tables),
            calendar=calendar.table_files(tables),
            study_plots=study_plots.plot_files(f"{results}/{layout.STUDY_PLOTS}"),
            calendar_plots=calendar_plot.plot_files(figures),
            loss_plots=loss_plot.plot_files(figures),
            optimal=f"{results}/{layout.OPTIMAL}",
            report=f"{results}/{layout.REPORT}",
        )

    def report_tables(self) -> dict[str, str]:
        """The tables report.md reads."""
        return {**self.tables, **self.study_tables, **self.whatif, **self.calendar}

    def report_plots(self) -> dict[str, str]:
        """The plots report.md shows."""
        return {**self.plots, **self.study_plots, **self.calendar_plots, **self.loss_plots}


class Inputs:
    """The input functions whose answer depends on the adaptive search's rounds, bound to the workflow's
    `checkpoints` (each round is a checkpoint: its decision is read once it exists)."""

    def __init__(self, pipeline: Pipeline, checkpoints: Any, files: Files):
        self.pp, self.checkpoints, self.files = pipeline, checkpoints, files

    def _decision(self, wildcards: Any, k: int) -> str:
        setting = {key: wildcards[key] for key in SETTING_KEYS}
        return self.checkpoints.search_round.get(**setting, k=k).output.decision

    def search_round(self, wildcards: Any) -> dict[str, Any]:
        """Round k reads round k-1's decision and the results of every cell scheduled so far."""
        k = int(wildcards.k)
        if k == 0:
            return {}
        previous = self._decision(wildcards, k - 1)
        return {"previous": previous, "results": pp_search.round_results(self.pp.results, previous)}

    def search_done(self, wildcards: Any) -> dict[str, Any]:
        """The rounds of one setting, until one schedules nothing."""
        for k in range(self.pp.config["search"]["max_rounds"]):
            path = self._decision(wildcards, k)
            if pp_search.read_round(path)["done"]:
                return {"last": path, "results": pp_search.round_results(self.pp.results, path)}
        raise ValueError(f"adaptive search of {wildcards} did not finish in search.max_rounds rounds")

    def preflight(self, wildcards: Any) -> list[Any]:
        """A cell's input: its GPU type's preflight (SLURM), by presence, not time (`ancient`): a preflight run again
        because the site changed re-measures no cell."""
        return [ancient(f) for f in self.pp.preflight_input(wildcards)]

    def cell_outputs(self, wildcards: Any = None) -> list[str]:
        """Every measured cell's result and steps file as targets: a missing one is measured again (as an input
        of tables that exist, Snakemake would take it for a deleted temporary file and do nothing)."""
        if not self.pp.adaptive:
            return self.pp.cell_files(layout.RESULT) + self.pp.cell_files(layout.STEPS)
        out = []
        for st in self.pp.settings.values():
            wc = {"model": st.model, "gpu": st.gpu, "nodes": st.nodes, "gpus_per_node": st.gpus_per_node}
            for result in self.search_done(wc)["results"]:
                out += [result, result[: -len(layout.RESULT)] + layout.STEPS]
        return out

    def measured(self, wildcards: Any = None) -> dict[str, Any]:
        """What the `cells` target builds: the plan and every cell, no loss check, table or report."""
        return {"plan": self.files.plan, "cells": self.cell_outputs()}

    def loss_check(self, wildcards: Any) -> list[str]:
        """A setting's loss check reads the results of the setting's cells (adaptive: those its search ran)."""
        if self.pp.adaptive:
            return self.search_done(wildcards)["results"]
        return self.pp.loss_check_cells(wildcards)

    def all(self, wildcards: Any = None) -> dict[str, Any]:
        """What `rule all` builds: the plan, every cell, every table, plot and study view, the calendar, the
        exported plans and the report."""
        f = self.files
        return {
            "plan": f.plan,
            "cells": self.cell_outputs(),
            "tables": list(f.tables.values()),
            "plots": list(f.plots.values()) + list(f.loss_plots.values()),
            "study": list(f.study_tables.values()) + list(f.whatif.values()) + list(f.study_plots.values()),
            "calendar": list(f.calendar.values()) + list(f.calendar_plots.values()),
            "optimal": f.optimal,
            "report": f.report,
        }
