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
