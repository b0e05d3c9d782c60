# The time-budgeted BERT recipe (Izsak et al. 2021, issue #6): prepare_data -> pretrain -> finetune -> glue_table.
# Settings: config/budget.yaml (or the file named by `budget:` in the main config). Include after common.smk
# (uses RESULTS, BUDGET* and budget_init_model defined there). Parsing imports no torch; each job calls one function of pretrain_planner.budget.
#   snakemake --profile cluster/local budget      # data, pre-training, GLUE, results/budget/glue.{csv,md}
# With budget.sweep, every recipe runs under results/budget/recipes/<name>/ and `budget` builds
# results/budget/sweep.{csv,md} and sweep_loss.png ({recipe} and {data}: common.smk).
wildcard_constraints:
    recipe=r"(recipes/[^/]+/)?",
    data=r"data(-seq[0-9]+)?",


rule prepare_data:
    input:
        BUDGET["corpus"]["files"],
    output:
        index=f"{BUDGET_DIR}/{{data}}/index.json",
    log:
        pp_layout.log(RESULTS, "budget/prepare_{data}.log"),
    params:
        settings=lambda wc: {k: BUDGET_DATA[wc.data][k] for k in ("seed", "corpus", "tokenizer", "data")},
    run:
        from pretrain_planner.trainer.data.mlm import prepare_data

        prepare_data(BUDGET_DATA[wildcards.data], output.index, log[0])


# run/ (checkpoint, step log, fine-tuning checkpoints) is not an output: a killed job's rerun resumes from it.
# The job runs on train.nodes x train.gpus_per_node ranks with the main config's launcher (local / slurm / debug).
# Beside result.json it writes summary.{csv,md} and loss.png (train.plot), not outputs: a plot that fails must
# not make the run's result incomplete.
rule pretrain:
    input:
        index=budget_index,
    output:
        model=directory(f"{BUDGET_DIR}/{{recipe}}pretrain/model"),
        result=f"{BUDGET_DIR}/{{recipe}}pretrain/result.json",
    log:
        pp_layout.log(RESULTS, "budget/{recipe}pretrain.log"),
    threads: BUDGET_PRETRAIN_THREADS
    params:
        run_dir=f"{BUDGET_DIR}/{{recipe}}pretrain/run",
        settings=lambda wc: {k: BUDGET_RECIPES[wc.recipe][k] for k in ("model", "train", "setting")},
    run:
        from pretrain_planner.budget.jobs import pretrain

        pretrain(
            budget_recipe(wildcards),
            BUDGET_LAUNCH,
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
        metrics=f"{BUDGET_DIR}/{{recipe}}glue/mnli/metrics.json",
        model=directory(f"{BUDGET_DIR}/{{recipe}}glue/mnli/model"),
    log:
        pp_layout.log(RESULTS, "budget/{recipe}finetune_mnli.log"),
    threads: BUDGET_JOB_THREADS
    params:
        glue=BUDGET["glue"],
    run:
        from pretrain_planner.budget.jobs import finetune

        finetune(
            budget_recipe(wildcards),
            BUDGET_LAUNCH,
            "mnli",
            input.model,
            output.metrics,
            log[0],
            out_model=output.model,
            threads=threads,
        )


rule finetune:
    input:
        model=budget_init_model,
    output:
        metrics=f"{BUDGET_DIR}/{{recipe}}glue/{{task}}/metrics.json",
    log:
        pp_layout.log(RESULTS, "budget/{recipe}finetune_{task}.log"),
    wildcard_constraints:
        task="(?!mnli/)[a-z0-9]+",  # not mnli (finetune_mnli): the lookahead reads past the wildcard
    threads: BUDGET_JOB_THREADS
    params:
        glue=BUDGET["glue"],
        init=lambda wc: "mnli" if wc.task in BUDGET_FROM_MNLI else "pretrained",
    run:
        from pretrain_planner.budget.jobs import finetune

        finetune(
            budget_recipe(wildcards),
            BUDGET_LAUNCH,
            wildcards.task,
            input.model,
            output.metrics,
            log[0],
            init_kind=params.init,
            threads=threads,
        )


rule glue_table:
    input:
        budget_metrics,
    output:
        csv=f"{BUDGET_DIR}/{{recipe}}glue.csv",
        md=f"{BUDGET_DIR}/{{recipe}}glue.md",
    log:
        pp_layout.log(RESULTS, "budget/{recipe}glue_table.log"),
    run:
        from pretrain_planner.budget.glue_report import glue_table

        glue_table(list(input), output.csv, output.md, log[0])


rule budget_sweep:
    input:
        results=expand(f"{BUDGET_DIR}/{{recipe}}pretrain/result.json", recipe=BUDGET_SWEEP),
        glue=expand(f"{BUDGET_DIR}/{{recipe}}glue.csv", recipe=BUDGET_SWEEP),
    output:
        **BUDGET_SWEEP_OUT,
    log:
        pp_layout.log(RESULTS, "budget/sweep_table.log"),
    params:
        recipes={BUDGET_RECIPES[r]["recipe"]["name"]: BUDGET_RECIPES[r]["recipe"]["values"] for r in BUDGET_SWEEP},
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
        **budget_targets(),
