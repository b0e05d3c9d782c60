# Helpers and targets. Validates every config file before anything runs (a mistake ends the dry run).
# Every helper is the facade's (pretrain_planner.facade): the rules ask it, they hold no logic.
import sys

import pretrain_planner.facade.pipeline as pp_pipeline
import pretrain_planner.facade.workflow as pp_workflow
import pretrain_planner.integrity as pp_integrity
import pretrain_planner.layout as pp_layout
import pretrain_planner.launch.driver as pp_driver
import pretrain_planner.launch.local as pp_local
import pretrain_planner.search as pp_search
from pretrain_planner.planning.grid import WILDCARD_CONSTRAINTS

PP = pp_pipeline.load_or_exit(
    config,
    workflow.basedir,
    " + ".join(map(str, workflow.configfiles)) or "config",
    pp_pipeline.config_sources(workflow.configfiles, workflow.basedir),
    workflow.cores,
)
RESULTS = PP.results
# One driver per results folder; damaged results are moved aside before the DAG is built (integrity.py), and local
# jobs a killed driver left running are ended. Decided when Snakemake starts to execute, from the executor in
# effect (launch/driver.guard): a dry run, --unlock, --lint ... change nothing, however Snakemake was invoked.
# The plan is said here, where Snakemake knows its targets: a budget-stage target runs none of the sweep's cells.
def _prepare(executing):
    print(PP.summary(getattr(workflow.dag_settings, "targets", ())), file=sys.stderr)
    for line in pp_integrity.repair(RESULTS, [c.path for c in PP.cells], move=executing):
        print(line, file=sys.stderr)
    if executing:
        pp_pipeline.record_sweep(PP, workflow.configfiles, workflow.basedir)
        for folder in pp_local.end_all_orphans(RESULTS):
            print(f"pretrain-planner: ended a job an earlier driver left running in {folder}", file=sys.stderr)


pp_driver.guard(workflow, RESULTS, _prepare)


onstart:
    pp_driver.started()


CELL_DIR = pp_layout.cell_dir_pattern(RESULTS)
FILES = pp_workflow.Files.of(RESULTS)
INPUTS = pp_workflow.Inputs(PP, checkpoints, FILES)


wildcard_constraints:
    **WILDCARD_CONSTRAINTS,


# Adaptive search (search.strategy: adaptive): per setting, checkpoint rounds decide which cells to run.
SEARCH_DIR = pp_layout.search_dir_pattern(RESULTS)
LOSS_CHECK_DIR = pp_layout.loss_check_dir_pattern(RESULTS)

