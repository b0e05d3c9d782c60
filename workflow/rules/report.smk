# Plots from the tables.


rule report:
    input:
        cells=TABLES["cells_parquet"],
        time_to_train=TABLES["time_to_train_csv"],
    output:
        **PLOTS,
    log:
        f"{RESULTS}/logs/report.log",
    run:
        pp_report.make_plots(input.cells, input.time_to_train, dict(output.items()), log[0])
