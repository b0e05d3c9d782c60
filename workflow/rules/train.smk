# The train stage: run a setting's exported plan for real (every family of the catalog) and hold its sustained
# throughput against the benchmark's prediction. Include after common.smk (PP, RESULTS).
#   snakemake --profile cluster/local results/train/tiny-gptneox/cpu/1x1/result.json
# run/ (checkpoint, steps.jsonl) is not an output: a killed job's rerun resumes from it. The config's `train`
# section sets the budget (steps or hours; default: the recipe's) and the data (default: generated / synthetic).
import pretrain_planner.layout as pp_layout

TRAIN_DIR = pp_layout.train_dir_pattern(RESULTS)


rule train:
    input:
        plan=PP.train_plan_input,
    output:
        result=f"{TRAIN_DIR}/{pp_layout.RESULT}",
        md=f"{TRAIN_DIR}/{pp_layout.THROUGHPUT_MD}",
        csv=f"{TRAIN_DIR}/{pp_layout.THROUGHPUT_CSV}",
    log:
        pp_layout.log(RESULTS, "train/{model}/{gpu}/{nodes}x{gpus_per_node}.log"),
    threads: PP.train_threads
    params:
        train=PP.config["train"],
    run:
        from pretrain_planner.train.jobs import train_rule

        train_rule(
            input.plan,
            wildcards,
            PP.train,
            PP.launcher,
            PP.train_device,
            output.result,
            log[0],
            threads,
            workflow.basedir,
        )
