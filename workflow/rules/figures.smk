# Every figure is an output (thermab.layout.figures), so --report, --summary and reruns see
# them: those the config gives data for (the wake-up figure only where load.wakeup_gaps_s
# asks for probes); a sweep (more than two arms in the order, which names each arm once) also
# draws the dose response, in figures_sweep below. report.html holds summary.md, and the
# provenance's manifest every file of the run: the tables and words come first.
rule figures:
    input:
        **ANALYSIS_FILES,
        **RUN_FILES,
        summary=RUN.summary,
        evidence=RUN.evidence,
        tables=tables("csv"),
    output:
        **figure_outputs(layout.figures(2, WAKEUP)),
        html=RUN.report,
        provenance=directory(RUN.provenance),
    params:
        # the DAG archived in provenance/ is drawn by running this Snakefile with --dag
        snakefile=workflow.main_snakefile,
        analysis=plan.reanalysis(config["analysis"]),
        report_code=REPORT_CODE,
    wildcard_constraints:
        order=f"{ARM}{ARM}?",
    log:
        RUN.log("figures.log"),
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/figures.py"


use rule figures as figures_sweep with:
    output:
        **figure_outputs(layout.figures(3, WAKEUP)),
        html=RUN.report,
        provenance=directory(RUN.provenance),
    wildcard_constraints:
        order=f"{ARM}{ARM}{ARM}+",
