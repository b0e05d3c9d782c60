# Helpers and targets. Validates every config file before anything runs (a mistake ends the dry run).
import sys

import pretrain_planner.aggregate as pp_aggregate
import pretrain_planner.launch as pp_launch
import pretrain_planner.pipeline as pp_pipeline
import pretrain_planner.report as pp_report
import pretrain_planner.search as pp_search
from pretrain_planner.grid import WILDCARD_CONSTRAINTS

PP = pp_pipeline.load_or_exit(
    config, workflow.basedir, " + ".join(map(str, workflow.configfiles)) or "config"
)
RESULTS = PP.results
print(PP.summary(), file=sys.stderr)
CELL_DIR = f"{RESULTS}/cells/{{model}}/{{gpu}}/{{nodes}}x{{gpus_per_node}}/{{method}}"
TABLES = pp_aggregate.table_files(f"{RESULTS}/tables")
PLOTS = pp_report.plot_files(f"{RESULTS}/plots")


wildcard_constraints:
    **WILDCARD_CONSTRAINTS,


# Adaptive search (search.strategy: adaptive): per setting, checkpoint rounds decide which cells to run.
SEARCH_DIR = f"{RESULTS}/search/{{model}}/{{gpu}}/{{nodes}}x{{gpus_per_node}}"


def _setting_wc(wildcards):
    return {k: wildcards[k] for k in ("model", "gpu", "nodes", "gpus_per_node")}


def search_round_input(wildcards):
    """Round k reads round k-1's decision and the results of every cell scheduled so far."""
    k = int(wildcards.k)
    if k == 0:
        return {}
    previous = checkpoints.search_round.get(**_setting_wc(wildcards), k=k - 1).output.decision
    return {"previous": previous, "results": pp_search.round_results(RESULTS, previous)}


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
BUDGET_DIR = f"{RESULTS}/budget"
BUDGET_TASKS = BUDGET["glue"]["tasks"]
BUDGET_FROM_MNLI = [t for t in BUDGET["glue"]["from_mnli"] if "mnli" in BUDGET_TASKS]
BUDGET_THREADS = min(BUDGET["train"]["threads"] or workflow.cores or 1, workflow.cores or 1)
BUDGET_GLUE = {"csv": f"{BUDGET_DIR}/glue.csv", "md": f"{BUDGET_DIR}/glue.md"}
# cores a budget job holds on the driver's host: its ranks run here (local, debug), or elsewhere (slurm)
BUDGET_RANKS = BUDGET["setting"]["world_size"]
BUDGET_PRETRAIN_THREADS = (
    1
    if BUDGET_LAUNCH["kind"] == "slurm"
    else min(max(BUDGET_THREADS, BUDGET_RANKS), workflow.cores or 1)
)
BUDGET_JOB_THREADS = 1 if BUDGET_LAUNCH["kind"] == "slurm" else BUDGET_THREADS


def budget_init_model(wildcards):
    """RTE, STS-B, MRPC (glue.from_mnli) start from the MNLI-fine-tuned model; the rest from pre-training."""
    if wildcards.task in BUDGET_FROM_MNLI:
        return f"{BUDGET_DIR}/glue/mnli/model"
    return f"{BUDGET_DIR}/pretrain/model"
