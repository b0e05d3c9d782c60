# The time-budgeted BERT recipe (Izsak et al. 2021, issue #6): prepare_data -> pretrain -> finetune -> glue_table.
# Settings: config/budget.yaml (or the file named by `budget:` in the main config), read only when a rule of this
# stage is asked for (pretrain_planner.facade.budget): a benchmark run never parses them. Include after common.smk
# (uses PP, RESULTS). Parsing imports no torch; each job calls one function of pretrain_planner.budget.
#   snakemake --profile cluster/local budget      # data, pre-training, GLUE, results/budget/glue.{csv,md}
# With budget.sweep, every recipe runs under results/budget/recipes/<name>/ and `budget` builds
# results/budget/sweep.{csv,md} and sweep_loss.png ({recipe} and {data}: pretrain_planner.budget.sweep).
import pretrain_planner.facade.budget as pp_budget_stage

BUDGET = pp_budget_stage.BudgetStage(
    config.get("budget", "config/budget.yaml"), workflow.basedir, RESULTS, PP.launcher, workflow.cores
)


wildcard_constraints:
    recipe=r"(recipes/[^/]+/)?",
    data=r"data(-seq[0-9]+)?",


rule prepare_data:
    input:
        BUDGET.corpus,
    output:
        index=BUDGET(pp_layout.BUDGET_INDEX),
    log:
        pp_layout.log(RESULTS, "budget/prepare_{data}.log"),
    params:
        settings=BUDGET.data_params,
    run:
        from pretrain_planner.trainer.data.mlm import prepare_data

        prepare_data(BUDGET.data[wildcards.data], output.index, log[0])


# run/ (checkpoint, step log, fine-tuning checkpoints) is not an output: a killed job's rerun resumes from it.
# The job runs on train.nodes x train.gpus_per_node ranks with the main config's launcher (local / slurm / debug).
# Beside result.json it writes summary.{csv,md} and loss.png (train.plot), not outputs: a plot that fails must
# not make the run's result incomplete.
rule pretrain:
    input:
        index=BUDGET.index,
    output:
        model=directory(f"{BUDGET(pp_layout.BUDGET_PRETRAIN)}/{pp_layout.MODEL_DIR}"),
        result=f"{BUDGET(pp_layout.BUDGET_PRETRAIN)}/{pp_layout.RESULT}",
    log:
        pp_layout.log(RESULTS, "budget/{recipe}pretrain.log"),
    threads: BUDGET.pretrain_threads
    params:
        run_dir=f"{BUDGET(pp_layout.BUDGET_PRETRAIN)}/{pp_layout.TRAIN_RUN}",
        settings=BUDGET.pretrain_params,
    run:
        from pretrain_planner.budget.jobs import pretrain

        pretrain(
            BUDGET.recipe(wildcards.recipe),
            BUDGET.launch,
            input.index,
            output.model,
            output.result,
            params.run_dir,
            log[0],
            threads=threads,
        )


rule finetune_mnli:
    input:
        model=rules.pretrain.output.model,
    output:
        metrics=f"{BUDGET(pp_layout.BUDGET_GLUE_TASK, task='mnli')}/{pp_layout.METRICS}",
        model=directory(f"{BUDGET(pp_layout.BUDGET_GLUE_TASK, task='mnli')}/{pp_layout.MODEL_DIR}"),
    log:
        pp_layout.log(RESULTS, "budget/{recipe}finetune_mnli.log"),
    threads: BUDGET.job_threads
    params:
        glue=lambda wc: BUDGET.cfg["glue"],
    run:
        from pretrain_planner.budget.jobs import finetune

        finetune(
            BUDGET.recipe(wildcards.recipe),
            BUDGET.launch,
            "mnli",
            input.model,
            output.metrics,
            log[0],
            out_model=output.model,
            threads=threads,
        )


rule finetune:
    input:
        model=BUDGET.init_model,
    output:
        metrics=f"{BUDGET(pp_layout.BUDGET_GLUE_TASK)}/{pp_layout.METRICS}",
    log:
        pp_layout.log(RESULTS, "budget/{recipe}finetune_{task}.log"),
    wildcard_constraints:
        task="(?!mnli/)[a-z0-9]+",  # not mnli (finetune_mnli): the lookahead reads past the wildcard
    threads: BUDGET.job_threads
    params:
        glue=lambda wc: BUDGET.cfg["glue"],
        init=BUDGET.init_kind,
    run:
        from pretrain_planner.budget.jobs import finetune

        finetune(
            BUDGET.recipe(wildcards.recipe),
            BUDGET.launch,
            wildcards.task,
            input.model,
            output.metrics,
            log[0],
            init_kind=params.init,
            threads=threads,
        )


rule glue_table:
    input:
        BUDGET.metrics,
    output:
        csv=BUDGET(pp_layout.BUDGET_GLUE_TABLE, ext="csv"),
        md=BUDGET(pp_layout.BUDGET_GLUE_TABLE, ext="md"),
    log:
        pp_layout.log(RESULTS, "budget/{recipe}glue_table.log"),
    run:
        from pretrain_planner.budget.glue_report import glue_table

        glue_table(list(input), output.csv, output.md, log[0])


rule budget_sweep:
    input:
        unpack(BUDGET.sweep_inputs),
    output:
        **BUDGET.sweep_out(),
    log:
        pp_layout.log(RESULTS, "budget/sweep_table.log"),
    params:
        recipes=BUDGET.sweep_values,
    run:
        from pretrain_planner.budget.sweep import sweep_table

        sweep_table(
            params.recipes,
            input.results,
            input.glue,
            output.csv,
            output.md,
            output.png,
            log[0],
        )


rule budget:
    input:
        unpack(BUDGET.targets),
