# Plots from the tables, and results/report.md gathering tables and plots. The tables' CSVs and the plots'
# PNGs are also marked for Snakemake's HTML report (`snakemake --report report.html` after a sweep), each
# captioned by its paragraph in workflow/report/, the same paragraphs report.md has.

import pretrain_planner.report.document as pp_document
import pretrain_planner.report.study_plots as pp_study_plots
import pretrain_planner.report.calendar_plot as pp_calendar_plot
import pretrain_planner.report.loss_plot as pp_loss_plot

REPORT = f"{RESULTS}/{pp_layout.REPORT}"
STUDY_PLOTS = pp_study_plots.plot_files(f"{RESULTS}/{pp_layout.STUDY_PLOTS}")
CALENDAR_PLOTS = pp_calendar_plot.plot_files(f"{RESULTS}/{pp_layout.PLOTS}")
LOSS_PLOTS_FILES = pp_loss_plot.plot_files(f"{RESULTS}/{pp_layout.PLOTS}")


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


rule study_plots:
    input:
        **STUDY_TABLES,
        **WHATIF,
    output:
        **pp_document.for_report(STUDY_PLOTS, "Study views"),
    log:
        pp_layout.log(RESULTS, "study_plots.log"),
    run:
        pp_study_plots.make_plots(dict(input.items()), dict(output.items()), log[0])


rule calendar_plot:
    input:
        calendar=CALENDAR["calendar_csv"],
    output:
        **pp_document.for_report(CALENDAR_PLOTS, "Plots"),
    log:
        pp_layout.log(RESULTS, "calendar_plot.log"),
    run:
        pp_calendar_plot.make_plot(input.calendar, dict(output.items()), log[0])


rule loss_plot:
    input:
        table=TABLES["loss_check_csv"],
        curves=PP.loss_check_files(),
    output:
        **pp_document.for_report(LOSS_PLOTS_FILES, "Plots"),
    log:
        pp_layout.log(RESULTS, "loss_plot.log"),
    run:
        pp_loss_plot.make_plot(input.table, dict(output.items()), log[0])


rule report:
    input:
        tables=list(TABLES.values()),
        plots=list(PLOTS.values()),
        study=list(STUDY_TABLES.values()) + list(WHATIF.values()),
        study_plots=list(STUDY_PLOTS.values()),
        calendar=list(CALENDAR.values()) + list(CALENDAR_PLOTS.values()),
        loss_plots=list(LOSS_PLOTS_FILES.values()),
        optimal=OPTIMAL,
    output:
        report=REPORT,
    log:
        pp_layout.log(RESULTS, "report.log"),
    params:
        costs=PP.config.get("costs", {}),
    run:
        pp_document.write_report(
            {**TABLES, **STUDY_TABLES, **WHATIF, **CALENDAR},
            {**PLOTS, **STUDY_PLOTS, **CALENDAR_PLOTS, **LOSS_PLOTS_FILES},
            input.optimal,
            output.report,
            log[0],
            params.costs,
        )
