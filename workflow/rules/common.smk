# Helpers and targets. Validates every config file before anything runs (a mistake ends the dry run).
import sys

import pretrain_planner.aggregate as pp_aggregate
import pretrain_planner.launch as pp_launch
import pretrain_planner.pipeline as pp_pipeline
import pretrain_planner.report as pp_report
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


# The time-budgeted BERT stage (pretrain.smk): its settings, validated at parse time.
import pretrain_planner.budget.config as pp_budget_config

BUDGET = pp_budget_config.load_or_exit(config.get("budget", "config/budget.yaml"), workflow.basedir)
BUDGET_DIR = f"{RESULTS}/budget"
BUDGET_TASKS = BUDGET["glue"]["tasks"]
BUDGET_FROM_MNLI = [t for t in BUDGET["glue"]["from_mnli"] if "mnli" in BUDGET_TASKS]
BUDGET_THREADS = min(BUDGET["train"]["threads"] or workflow.cores or 1, workflow.cores or 1)
BUDGET_GLUE = {"csv": f"{BUDGET_DIR}/glue.csv", "md": f"{BUDGET_DIR}/glue.md"}


def budget_init_model(wildcards):
    """RTE, STS-B, MRPC (glue.from_mnli) start from the MNLI-fine-tuned model; the rest from pre-training."""
    if wildcards.task in BUDGET_FROM_MNLI:
        return f"{BUDGET_DIR}/glue/mnli/model"
    return f"{BUDGET_DIR}/pretrain/model"
