# The time-budgeted BERT recipe (Izsak et al. 2021, issue #6): prepare_data -> pretrain -> finetune -> glue_table.
# Settings: config/budget.yaml (or the file named by `budget:` in the main config). Include after common.smk
# (uses RESULTS, BUDGET* and budget_init_model defined there). Parsing imports no torch; each job calls one function of pretrain_planner.budget.
#   snakemake --profile cluster/local budget      # data, pre-training, GLUE, results/budget/glue.{csv,md}
rule prepare_data:
    input:
        BUDGET["corpus"]["files"],
    output:
        index=f"{BUDGET_DIR}/data/index.json",
    log:
        pp_layout.log(RESULTS, "budget/prepare_data.log"),
    params:
        settings={k: BUDGET[k] for k in ("seed", "corpus", "tokenizer", "data")},
    run:
        from pretrain_planner.budget.data import prepare_data

        prepare_data(BUDGET, output.index, log[0])


# run/ (checkpoint, step log, fine-tuning checkpoints) is not an output: a killed job's rerun resumes from it.
# The job runs on train.nodes x train.gpus_per_node ranks with the main config's launcher (local / slurm / debug).
rule pretrain:
    input:
        index=rules.prepare_data.output.index,
    output:
        model=directory(f"{BUDGET_DIR}/pretrain/model"),
        result=f"{BUDGET_DIR}/pretrain/result.json",
    log:
        pp_layout.log(RESULTS, "budget/pretrain.log"),
    threads: BUDGET_PRETRAIN_THREADS
    params:
        run_dir=f"{BUDGET_DIR}/pretrain/run",
        settings={k: BUDGET[k] for k in ("model", "train", "setting")},
    run:
        from pretrain_planner.budget.jobs import pretrain

        pretrain(
            BUDGET,
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
        metrics=f"{BUDGET_DIR}/glue/mnli/metrics.json",
        model=directory(f"{BUDGET_DIR}/glue/mnli/model"),
    log:
        pp_layout.log(RESULTS, "budget/finetune_mnli.log"),
    threads: BUDGET_JOB_THREADS
    params:
        glue=BUDGET["glue"],
    run:
        from pretrain_planner.budget.jobs import finetune

        finetune(
            BUDGET,
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
        metrics=f"{BUDGET_DIR}/glue/{{task}}/metrics.json",
    log:
        pp_layout.log(RESULTS, "budget/finetune_{task}.log"),
    wildcard_constraints:
        task="(?!mnli$)[a-z0-9]+",
    threads: BUDGET_JOB_THREADS
    params:
        glue=BUDGET["glue"],
        init=lambda wc: "mnli" if wc.task in BUDGET_FROM_MNLI else "pretrained",
    run:
        from pretrain_planner.budget.jobs import finetune

        finetune(
            BUDGET,
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
        expand(f"{BUDGET_DIR}/glue/{{task}}/metrics.json", task=BUDGET_TASKS),
    output:
        **BUDGET_GLUE,
    log:
        pp_layout.log(RESULTS, "budget/glue_table.log"),
    run:
        from pretrain_planner.budget.glue import glue_table

        glue_table(list(input), output.csv, output.md, log[0])


rule budget:
    input:
        **BUDGET_GLUE,
        pretrain=rules.pretrain.output.result,
