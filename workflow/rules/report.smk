# Plots from the tables, and results/report.md gathering tables and plots. The tables' CSVs and the plots'
# PNGs are also marked for Snakemake's HTML report (`snakemake --report report.html` after a sweep), each
# captioned by its paragraph in workflow/report/, the same paragraphs report.md has.

import pretrain_planner.report.document as pp_document

REPORT = f"{RESULTS}/{pp_layout.REPORT}"


report: "../report/workflow.rst"


rule plots:
    input:
        **TABLES,
    output:
        **pp_document.for_report(PLOTS, "Plots"),
    log:
        pp_layout.log(RESULTS, "plots.log"),
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
        pp_layout.log(RESULTS, "report.log"),
    params:
        costs=PP.config.get("costs", {}),
    run:
        pp_document.write_report(TABLES, PLOTS, input.optimal, output.report, log[0], params.costs)
