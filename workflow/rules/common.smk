# Helpers and targets. Validates every config file before anything runs (a mistake ends the dry run).
import sys

import pretrain_planner.integrity as pp_integrity
import pretrain_planner.layout as pp_layout
import pretrain_planner.launch.driver as pp_driver
import pretrain_planner.launch.local as pp_local
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
        pp_pipeline.record_sweep(PP, workflow.configfiles, workflow.basedir)
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
LOSS_CHECK_DIR = pp_layout.loss_check_dir_pattern(RESULTS)


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


def loss_check_input(wildcards):
    """A setting's loss check reads the results of the setting's cells (adaptive: those its search ran)."""
    if PP.adaptive:
        return search_done_input(wildcards)["results"]
    return PP.loss_check_cells(wildcards)
