# Every cell's result -> polars tables (cells, time_to_train).


rule aggregate:
    input:
        plan=f"{RESULTS}/plan.csv",
        results=PP.cell_files("result.json"),
    output:
        **TABLES,
    log:
        f"{RESULTS}/logs/aggregate.log",
    run:
        pp_aggregate.build_tables(input.plan, input.results, dict(output.items()), log[0])
