# pretrain-planner: benchmark every model x GPU type x count x method cell, then tables and plots.
# Thin by design: the rules call one function of the `pretrain_planner` package each.
#   snakemake --profile cluster/local                      # the default CPU sweep, here
#   snakemake --profile cluster/slurm --configfile config/paper.yaml   # on a cluster
import os

from snakemake.utils import min_version

min_version("9.0")


# The demo sweep (tiny models on this machine's CPUs) applies only when no --configfile is given: a user's
# file is not merged over it, so what the file leaves out takes the schema's defaults, never the demo's caps.
if not workflow.overwrite_configfiles:

    configfile: os.path.join(workflow.basedir, "config/config.yaml")



include: "workflow/rules/common.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/train.smk"


rule all:
    input:
        unpack(INPUTS.all),
    default_target: True
