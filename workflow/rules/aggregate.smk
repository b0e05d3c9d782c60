# Every cell's result -> polars tables (cells, time_to_train, feasibility, costs, pareto, problems, calendar),
# then the plan of each setting's fastest method as Trainer arguments and a launch script.

import pretrain_planner.report.document as pp_document
import pretrain_planner.tables.aggregate as pp_aggregate
import pretrain_planner.tables.export as pp_export
import pretrain_planner.tables.study as pp_study
import pretrain_planner.planning.evidence as pp_evidence
import pretrain_planner.tables.whatif as pp_whatif
import pretrain_planner.tables.calendar as pp_calendar


rule aggregate:
    input:
        plan=FILES.plan,
        results=[] if PP.adaptive else PP.cell_files(pp_layout.RESULT),
        search=PP.search_files() if PP.adaptive else [],
        loss_checks=PP.loss_check_files(),
        models=PP.catalog.models_path,
        gpus=PP.catalog.gpus_path,
    output:
        **pp_document.for_report(FILES.tables, "Tables"),  # report(): each CSV, captioned (workflow/report/)
    log:
        pp_layout.log(RESULTS, "aggregate.log"),
    params:
        costs=PP.costs.to_json(),  # JSON, as the config wrote it: a param Snakemake compares (a change re-prices)
        loss_check=PP.loss_check.to_json(),  # JSON: a param Snakemake compares (a change re-aggregates)
    run:
        pp_aggregate.aggregate_rule(input, output, log[0], PP.catalog, params)


rule export_plan:
    input:
        time_to_train=FILES.tables["time_to_train_csv"],
        feasibility=FILES.tables["feasibility_csv"],
        models=PP.catalog.models_path,
        gpus=PP.catalog.gpus_path,
    output:
        directory(FILES.optimal),
    log:
        pp_layout.log(RESULTS, "export_plan.log"),
    params:
        seed=PP.benchmark.seed,
    run:
        pp_export.export_plans(
            input.time_to_train, input.feasibility, output[0], log[0], PP.catalog, params.seed, site=PP.site
        )


rule study_tables:
    input:
        cells=FILES.tables["cells_parquet"],
        models=PP.catalog.models_path,
        gpus=PP.catalog.gpus_path,
    output:
        **pp_document.for_report(FILES.study_tables, "Study views"),
    log:
        pp_layout.log(RESULTS, "study_tables.log"),
    params:
        suspect_mfu=PP.benchmark.suspect_mfu,
        study=PP.study.to_json(),  # its JSON: a change rebuilds the views; the function takes PP.study, typed
    run:
        pp_study.build_study_tables(input.cells, dict(output.items()), log[0], PP.catalog, params.suspect_mfu, PP.study)


rule whatif:
    input:
        cells=FILES.tables["cells_parquet"],
        models=PP.catalog.models_path,
        gpus=PP.catalog.gpus_path,
        evidence=str(pp_evidence.PUBLIC_CSV),
        evidence_models=str(pp_evidence.MODELS_YAML),
    output:
        **pp_document.for_report(FILES.whatif, "Study views"),
    log:
        pp_layout.log(RESULTS, "whatif.log"),
    params:
        # checked at parse time (the dry run)
        settings=pp_whatif.rule_settings(
            PP.sweep, PP.benchmark, PP.evidence, PP.costs, PP.study, PP.whatif, PP.catalog, PP.results
        ),
    run:
        pp_whatif.build_whatif(input.cells, dict(output.items()), log[0], PP.catalog, **params.settings)


rule calendar:
    input:
        time_to_train=FILES.tables["time_to_train_csv"],
        cells=FILES.tables["cells_parquet"],
        models=PP.catalog.models_path,
        gpus=PP.catalog.gpus_path,
    output:
        **pp_document.for_report(FILES.calendar, "Tables"),
    log:
        pp_layout.log(RESULTS, "calendar.log"),
    params:
        train=PP.config["train"],  # its JSON: a change rebuilds the calendar; the function takes PP.train, typed
    run:
        pp_calendar.build_calendar(input, output, log[0], PP.site, PP.catalog, PP.train)
