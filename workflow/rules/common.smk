# Helpers and targets. Validates every config file before anything runs (a mistake ends the dry run).
import sys

import pretrain_planner.integrity as pp_integrity
import pretrain_planner.layout as pp_layout
import pretrain_planner.launch.driver as pp_driver
import pretrain_planner.launch.local as pp_local
import pretrain_planner.launch.request as pp_request
import pretrain_planner.planning.pipeline as pp_pipeline
import pretrain_planner.report.plots as pp_plots
import pretrain_planner.search as pp_search
import pretrain_planner.tables.aggregate as pp_aggregate
from pretrain_planner.planning.grid import WILDCARD_CONSTRAINTS

PP = pp_pipeline.load_or_exit(
    config,
    workflow.basedir,
    " + ".join(map(str, workflow.configfiles)) or "config",
    pp_pipeline.config_sources(workflow.configfiles, workflow.basedir),
)
RESULTS = PP.results
print(PP.summary(), file=sys.stderr)
# One driver per results folder; damaged results are moved aside before the DAG is built (integrity.py), and local
# jobs a killed driver left running are ended. Decided when Snakemake starts to execute, from the executor in
# effect (launch/driver.guard): a dry run, --unlock, --lint ... change nothing, however Snakemake was invoked.
def _prepare(executing):
    for line in pp_integrity.repair(RESULTS, [c.path for c in PP.cells], move=executing):
        print(line, file=sys.stderr)
    if executing:
        for folder in pp_local.end_all_orphans(RESULTS):
            print(f"pretrain-planner: ended a job an earlier driver left running in {folder}", file=sys.stderr)


pp_driver.guard(workflow, RESULTS, _prepare)


onstart:
    pp_driver.started()


CELL_DIR = pp_layout.cell_dir_pattern(RESULTS)
TABLES = pp_aggregate.table_files(f"{RESULTS}/{pp_layout.TABLES}")
PLOTS = pp_plots.plot_files(f"{RESULTS}/{pp_layout.PLOTS}")


wildcard_constraints:
    **WILDCARD_CONSTRAINTS,


# Adaptive search (search.strategy: adaptive): per setting, checkpoint rounds decide which cells to run.
SEARCH_DIR = pp_layout.search_dir_pattern(RESULTS)


def _setting_wc(wildcards):
    return {k: wildcards[k] for k in ("model", "gpu", "nodes", "gpus_per_node")}


def search_round_input(wildcards):
    """Round k reads round k-1's decision and the results of every cell scheduled so far."""
    k = int(wildcards.k)
    if k == 0:
        return {}
    previous = checkpoints.search_round.get(**_setting_wc(wildcards), k=k - 1).output.decision
    return {"previous": previous, "results": pp_search.round_results(RESULTS, previous)}


def all_cell_outputs(wildcards):
    """Every measured cell's result and steps file as targets: a missing one is measured again (as an input
    of tables that exist, Snakemake would take it for a deleted temporary file and do nothing)."""
    if not PP.adaptive:
        return PP.cell_files(pp_layout.RESULT) + PP.cell_files(pp_layout.STEPS)
    out = []
    for st in PP.settings.values():
        wc = {"model": st.model, "gpu": st.gpu, "nodes": st.nodes, "gpus_per_node": st.gpus_per_node}
        for result in search_done_input(wc)["results"]:
            out += [result, result[: -len(pp_layout.RESULT)] + pp_layout.STEPS]
    return out


def search_done_input(wildcards):
    """The rounds of one setting, until one schedules nothing (each round is a checkpoint)."""
    for k in range(PP.config["search"]["max_rounds"]):
        path = checkpoints.search_round.get(**_setting_wc(wildcards), k=k).output.decision
        if pp_search.read_round(path)["done"]:
            return {"last": path, "results": pp_search.round_results(RESULTS, path)}
    raise ValueError(f"adaptive search of {wildcards} did not finish in search.max_rounds rounds")


# The time-budgeted BERT stage (pretrain.smk): its settings, validated at parse time. The training setting
# (micro-batch, accumulation, method) is resolved here from results/optimal/.../plan.json or the config.
import pretrain_planner.budget.config as pp_budget_config

BUDGET = pp_budget_config.load_or_exit(
    config.get("budget", "config/budget.yaml"), workflow.basedir, RESULTS
)
BUDGET_LAUNCH = pp_budget_config.launch_or_exit(PP.config, BUDGET, workflow.basedir)
if BUDGET["setting"]["source"] == "missing":  # the pretrain job stops with this
    print(f"pretrain-planner: warning: {BUDGET['setting']['error']}", file=sys.stderr)
BUDGET_DIR = f"{RESULTS}/{pp_layout.BUDGET}"
BUDGET_TASKS = BUDGET["glue"]["tasks"]
BUDGET_FROM_MNLI = [t for t in BUDGET["glue"]["from_mnli"] if "mnli" in BUDGET_TASKS]
BUDGET_THREADS = min(BUDGET["train"]["threads"] or workflow.cores or 1, workflow.cores or 1)
BUDGET_GLUE = {"csv": f"{BUDGET_DIR}/glue.csv", "md": f"{BUDGET_DIR}/glue.md"}
# cores a budget job holds on the driver's host: its ranks run here (local, debug), or elsewhere (slurm)
BUDGET_RANKS = BUDGET["setting"]["world_size"]
BUDGET_PRETRAIN_THREADS = pp_request.driver_cores(
    BUDGET_LAUNCH["kind"], BUDGET_RANKS, BUDGET_THREADS, workflow.cores
)
BUDGET_JOB_THREADS = pp_request.driver_cores(BUDGET_LAUNCH["kind"], 1, BUDGET_THREADS, workflow.cores)


# budget.sweep: {recipe} is "" for the file's own recipe (results/budget/pretrain/...) and recipes/<name>/ for each
# swept one; {data} is "data", or data-seq<N> for a swept sequence length (pretrain_planner.budget.sweep).
import pretrain_planner.budget.sweep as pp_budget_sweep

BUDGET_RECIPES = pp_budget_sweep.recipes_or_exit(BUDGET)
BUDGET_SWEEP = pp_budget_sweep.swept(BUDGET_RECIPES)
BUDGET_DATA = pp_budget_sweep.data_sets(BUDGET_RECIPES)
BUDGET_SWEEP_OUT = {
    "csv": f"{BUDGET_DIR}/sweep.csv",
    "md": f"{BUDGET_DIR}/sweep.md",
    "png": f"{BUDGET_DIR}/sweep_loss.png",
}


def budget_recipe(wildcards):
    return BUDGET_RECIPES[wildcards.recipe]


def budget_index(wildcards):
    """The prepared data of a recipe (its sequence length's)."""
    key = pp_budget_sweep.data_key(BUDGET_RECIPES[wildcards.recipe], BUDGET)
    return f"{BUDGET_DIR}/{key}/index.json"


def budget_init_model(wildcards):
    """RTE, STS-B, MRPC (glue.from_mnli) start from the MNLI-fine-tuned model; the rest from pre-training."""
    if wildcards.task in BUDGET_FROM_MNLI:
        return f"{BUDGET_DIR}/{wildcards.recipe}glue/mnli/model"
    return f"{BUDGET_DIR}/{wildcards.recipe}pretrain/model"


def budget_metrics(wildcards):
    """The GLUE metrics of every task of a recipe."""
    return [f"{BUDGET_DIR}/{wildcards.recipe}glue/{task}/metrics.json" for task in BUDGET_TASKS]


def budget_targets():
    """What `budget` builds: the sweep's comparison, or the one recipe's GLUE table and pre-training result."""
    if BUDGET_SWEEP:
        return BUDGET_SWEEP_OUT
    return {**BUDGET_GLUE, "pretrain": f"{BUDGET_DIR}/pretrain/result.json"}
