# The plan (every cell, valid or not) and one job per valid cell.

import pretrain_planner.launch.cell as pp_cell
import pretrain_planner.launch.losscheck as pp_losscheck
import pretrain_planner.launch.preflight as pp_preflight


rule plan:
    input:
        models=PP.catalog.models_path,
        gpus=PP.catalog.gpus_path,
    output:
        plan=FILES.plan,
    log:
        pp_layout.log(RESULTS, "plan.log"),
    params:
        plan=PP.plan_params(),
    run:
        pp_pipeline.write_plan(PP, output.plan)


# SLURM: one short job per GPU type checks the site's environment before its first cell (launch/preflight.py);
# a failed one is not retried (its cause is a setting), and stops only that type's cells.
rule preflight_gpu:
    output:
        preflight=pp_layout.preflight_file(RESULTS, "{gpu}"),
    log:
        pp_layout.log(RESULTS, "preflight-{gpu}.log"),
    params:
        digest=PP.preflight_params,
    retries: 0
    run:
        pp_preflight.run_preflight(PP.preflight_spec(wildcards), output.preflight, log[0])


# `snakemake ... preflight` (or `pretrain-planner preflight`): every GPU type's preflight alone.
rule preflight:
    input:
        PP.preflight_files(),


rule benchmark_cell:
    input:
        preflight=INPUTS.preflight,
    output:
        result=f"{CELL_DIR}/{pp_layout.RESULT}",
        steps=f"{CELL_DIR}/{pp_layout.STEPS}",
    log:
        f"{CELL_DIR}/{pp_layout.CELL_LOG}",
    threads: PP.threads
    params:
        spec=PP.spec,
    run:
        pp_cell.run_cell(params.spec, log[0], threads, input.preflight)


# `snakemake ... cells`: measure every cell of the sweep (the adaptive search's rounds included) and stop there, no
# loss check, tables or report (they follow when the sweep is run again without a target).
rule cells:
    input:
        unpack(INPUTS.measured),


rule loss_check:
    input:
        cells=INPUTS.loss_check,
    output:
        curves=f"{LOSS_CHECK_DIR}/{pp_layout.LOSS_CURVES}",
    log:
        f"{LOSS_CHECK_DIR}/{pp_layout.LOSS_CHECK_LOG}",
    threads: PP.loss_check_threads
    params:
        spec=PP.loss_check_spec,
    run:
        pp_losscheck.run_check(params.spec, input.cells, output.curves, log[0], threads)


if PP.adaptive:

    checkpoint search_round:
        input:
            unpack(INPUTS.search_round),
        output:
            decision=pp_layout.round_file(SEARCH_DIR, pp_layout.wildcard("k")),
        log:
            pp_layout.round_file(SEARCH_DIR, pp_layout.wildcard("k"), "log"),
        wildcard_constraints:
            k=r"\d+",
        params:
            search=PP.search_params,
        run:
            pp_search.write_round(
                PP.setting(wildcards), wildcards.k, input, RESULTS, output[0], log[0], PP.search_prior(wildcards)
            )

    rule search_done:
        input:
            unpack(INPUTS.search_done),
        output:
            search=f"{SEARCH_DIR}/{pp_layout.SEARCH_FILE}",
        log:
            f"{SEARCH_DIR}/search.log",
        run:
            pp_search.write_search(input.last, output.search, log[0])
