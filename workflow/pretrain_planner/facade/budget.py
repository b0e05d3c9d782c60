"""The budget stage as the workflow sees it (workflow/rules/pretrain.smk): its config, launcher, recipes and paths,
read the first time a rule of the stage is asked for - a budget target - and never by the parse of a benchmark
run (a bad corpus path in budget.yaml does not stop a benchmark's dry run). A configuration error then ends the
workflow with its message. The training setting (micro-batch, accumulation, method) is resolved from
results/optimal/.../plan.json or the config when the stage is first read, so a changed plan changes the pretrain
rule's params (it reruns). Imports no torch.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

from pretrain_planner import layout
from pretrain_planner.budget import config as bconfig
from pretrain_planner.budget import sweep
from pretrain_planner.launch.request import driver_cores
from pretrain_planner.planning.configtypes import (
    BudgetGlue,
    BudgetPrep,
    BudgetRecipe,
    BudgetTrain,
    Launch,
    LauncherSection,
    require,
)


class BudgetStage:
    """`path`: the budget file (the main config's `budget`, default config/budget.yaml); `launcher`: the main
    config's, typed (Pipeline.launcher); `cores`: what Snakemake has (None: unknown)."""

    def __init__(self, path: str, basedir: str | Path, results: str, launcher: LauncherSection, cores: int | None):
        require(launcher, LauncherSection, "facade.budget.BudgetStage")
        self.path, self.basedir, self.results, self.launcher, self.cores = path, basedir, results, launcher, cores

    def __call__(self, pattern: str, **fields: str) -> str:
        """A path under budget/ (layout.budget_path); what is not given stays a wildcard."""
        return layout.budget_path(self.results, pattern, **fields)

    # -- read once, when first asked ------------------------------------------------------------------------
    @functools.cached_property
    def cfg(self) -> dict[str, Any]:
        cfg = bconfig.load_or_exit(self.path, self.basedir, self.results)
        if cfg["setting"].missing:  # the pretrain job stops with this
            print(f"pretrain-planner: warning: {cfg['setting'].error}", file=sys.stderr)
        return cfg

    @functools.cached_property
    def train(self) -> BudgetTrain:
        """The budget file's `train:` section, typed (its own recipe's; a swept recipe's is `recipe(...).train`)."""
        return self.recipe(sweep.BASE).train

    @functools.cached_property
    def glue(self) -> BudgetGlue:
        """The budget file's `glue:` section, typed (every recipe fine-tunes alike)."""
        return self.recipe(sweep.BASE).glue

    @functools.cached_property
    def launch(self) -> Launch:
        return bconfig.launch_or_exit(self.launcher, self.train, self.cfg["source"], self.basedir)

    @functools.cached_property
    def recipes(self) -> dict[str, dict[str, Any]]:
        """{recipe} wildcard -> the recipe's config (budget/sweep.py)."""
        return sweep.recipes_or_exit(self.cfg)

    @functools.cached_property
    def typed(self) -> dict[str, BudgetRecipe]:
        """{recipe} wildcard -> the recipe typed once (its train section, setting and names): what its jobs take."""
        return {wildcard: BudgetRecipe.of(cfg) for wildcard, cfg in self.recipes.items()}

    def recipe(self, wildcard: str) -> BudgetRecipe:
        return self.typed[wildcard]

    @functools.cached_property
    def data(self) -> dict[str, BudgetPrep]:
        """{data} wildcard -> the settings that prepare that data (seed, corpus, tokenizer, data), typed."""
        return {key: recipe.prep for key, recipe in sweep.data_sets(self.typed).items()}

    def data_params(self, wildcards: Any) -> dict[str, Any]:
        """What the prepare_data rule's data depends on (a change prepares it again): its sections as JSON, as the
        file has them."""
        return sweep.data_sets(self.typed)[wildcards.data].prep_params()

    # -- what the rules ask ---------------------------------------------------------------------------------
    def threads(self, ranks: int) -> int:
        """Cores a budget job of `ranks` ranks holds on the driver's host: its ranks run here (local, debug), or
        elsewhere (slurm)."""
        own = min(self.train.threads or self.cores or 1, self.cores or 1)
        return driver_cores(self.launch.kind, ranks, own, self.cores)

    def pretrain_threads(self, wildcards: Any = None) -> int:
        return self.threads(self.recipe(sweep.BASE).setting.world_size)

    def pretrain_params(self, wildcards: Any) -> dict[str, Any]:
        """What a recipe's pre-training depends on besides its input (a change reruns it): the model, the train
        section and the setting, as JSON (Snakemake compares params as JSON: a typed value would be left out)."""
        cfg = self.recipe(wildcards.recipe).to_job()
        return {k: cfg[k] for k in ("model", "train", "setting")}

    def job_threads(self, wildcards: Any = None) -> int:
        return self.threads(1)

    def corpus(self, wildcards: Any = None) -> list[str]:
        return list(self.recipe(sweep.BASE).prep.corpus.files)

    def index(self, wildcards: Any) -> str:
        """The prepared data of a recipe (its sequence length's)."""
        return self(layout.BUDGET_INDEX, data=sweep.data_key(self.recipe(wildcards.recipe), self.recipe(sweep.BASE)))

    def from_mnli(self) -> list[str]:
        """RTE, STS-B, MRPC (glue.from_mnli) start from the MNLI-fine-tuned model, when MNLI is fine-tuned."""
        return [t for t in self.glue.from_mnli if "mnli" in self.glue.tasks]

    def init_model(self, wildcards: Any) -> str:
        """The model a fine-tuning starts from: MNLI's for glue.from_mnli, else the pre-trained one."""
        if wildcards.task in self.from_mnli():
            task = self(layout.BUDGET_GLUE_TASK, recipe=wildcards.recipe, task="mnli")
            return f"{task}/{layout.MODEL_DIR}"
        return f"{self(layout.BUDGET_PRETRAIN, recipe=wildcards.recipe)}/{layout.MODEL_DIR}"

    def init_kind(self, wildcards: Any) -> str:
        return "mnli" if wildcards.task in self.from_mnli() else "pretrained"

    def metrics(self, wildcards: Any) -> list[str]:
        """The GLUE metrics of every task of a recipe."""
        return [f"{self(layout.BUDGET_GLUE_TASK, recipe=wildcards.recipe, task=t)}/{layout.METRICS}"
                for t in self.glue.tasks]  # fmt: skip

    def swept(self) -> list[str]:
        """The {recipe} wildcards of budget.sweep's recipes (empty without a sweep)."""
        return sweep.swept(self.recipes)

    def sweep_out(self) -> dict[str, str]:
        return {"csv": self(layout.BUDGET_SWEEP_TABLE, ext="csv"), "md": self(layout.BUDGET_SWEEP_TABLE, ext="md"),
                "png": self(layout.BUDGET_SWEEP_PLOT)}  # fmt: skip

    def sweep_inputs(self, wildcards: Any = None) -> dict[str, list[str]]:
        recipes = self.swept()
        return {
            "results": [f"{self(layout.BUDGET_PRETRAIN, recipe=r)}/{layout.RESULT}" for r in recipes],
            "glue": [self(layout.BUDGET_GLUE_TABLE, recipe=r, ext="csv") for r in recipes],
        }

    def sweep_values(self, wildcards: Any = None) -> dict[str, Any]:
        """Each swept recipe's name and values (the budget_sweep rule's params)."""
        return {self.recipe(r).recipe: self.recipe(r).values for r in self.swept()}

    def targets(self, wildcards: Any = None) -> dict[str, str]:
        """What `budget` builds: the sweep's comparison, or the one recipe's GLUE table and pre-training result."""
        if self.swept():
            return self.sweep_out()
        return {"csv": self(layout.BUDGET_GLUE_TABLE, recipe="", ext="csv"),
                "md": self(layout.BUDGET_GLUE_TABLE, recipe="", ext="md"),
                "pretrain": f"{self(layout.BUDGET_PRETRAIN, recipe='')}/{layout.RESULT}"}  # fmt: skip
