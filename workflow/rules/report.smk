# Plots from the tables, and results/report.md gathering tables and plots. The tables' CSVs and the plots'
# PNGs are also marked for Snakemake's HTML report (`snakemake --report report.html` after a sweep), each
# captioned by its paragraph in workflow/report/, the same paragraphs report.md has.

import pretrain_planner.report.document as pp_document
import pretrain_planner.report.plots as pp_plots
import pretrain_planner.report.study_plots as pp_study_plots
import pretrain_planner.report.calendar_plot as pp_calendar_plot
import pretrain_planner.report.loss_plot as pp_loss_plot


report: "../report/workflow.rst"


rule plots:
    input:
        **FILES.tables,
    output:
        **pp_document.for_report(FILES.plots, "Plots"),
    log:
        pp_layout.log(RESULTS, "plots.log"),
    params:
        costs=PP.costs.to_json(),  # its JSON: a change plots again; the function takes PP.costs, typed
    run:
        pp_plots.make_plots(dict(input.items()), dict(output.items()), log[0], PP.costs)


rule study_plots:
    input:
        **FILES.study_tables,
        **FILES.whatif,
    output:
        **pp_document.for_report(FILES.study_plots, "Study views"),
    log:
        pp_layout.log(RESULTS, "study_plots.log"),
    run:
        pp_study_plots.make_plots(dict(input.items()), dict(output.items()), log[0])


rule calendar_plot:
    input:
        calendar=FILES.calendar["calendar_csv"],
    output:
        **pp_document.for_report(FILES.calendar_plots, "Plots"),
    log:
        pp_layout.log(RESULTS, "calendar_plot.log"),
    run:
        pp_calendar_plot.make_plot(input.calendar, dict(output.items()), log[0])


rule loss_plot:
    input:
        table=FILES.tables["loss_check_csv"],
        curves=PP.loss_check_files(),
    output:
        **pp_document.for_report(FILES.loss_plots, "Plots"),
    log:
        pp_layout.log(RESULTS, "loss_plot.log"),
    run:
        pp_loss_plot.make_plot(input.table, dict(output.items()), log[0])


rule report:
    input:
        tables=list(FILES.report_tables().values()),
        plots=list(FILES.report_plots().values()),
        optimal=FILES.optimal,
    output:
        report=FILES.report,
    log:
        pp_layout.log(RESULTS, "report.log"),
    params:
        costs=PP.costs.to_json(),  # its JSON: a change writes the report again; the function takes PP.costs, typed
    run:
        pp_document.write_report(
            FILES.report_tables(),
            FILES.report_plots(),
            input.optimal,
            output.report,
            log[0],
            PP.costs,
        )
