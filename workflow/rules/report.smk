# Plots from the tables, and results/report.md gathering tables and plots.

import pretrain_planner.report.document as pp_document

REPORT = f"{RESULTS}/report.md"


rule plots:
    input:
        **TABLES,
    output:
        **PLOTS,
    log:
        f"{RESULTS}/logs/plots.log",
    params:
        costs=PP.config.get("costs", {}),
    run:
        pp_plots.make_plots(dict(input.items()), dict(output.items()), log[0], params.costs)


rule report:
    input:
        tables=list(TABLES.values()),
        plots=list(PLOTS.values()),
        optimal=OPTIMAL,
    output:
        report=REPORT,
    log:
        f"{RESULTS}/logs/report.log",
    params:
        costs=PP.config.get("costs", {}),
    run:
        pp_document.write_report(TABLES, PLOTS, input.optimal, output.report, log[0], params.costs)
