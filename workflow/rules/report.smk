rule report:
    input:
        summary="results/{cluster}/{order}/summary.md",
        tables=expand("results/{cluster}/{order}/tables/{table}.csv", table=TABLES, allow_missing=True),
    output:
        timeline=report("results/{cluster}/{order}/figures/timeline.png", caption="../report/timeline.rst", category="Figures"),
        timeline_svg="results/{cluster}/{order}/figures/timeline.svg",
        timeline_html=report(
            "results/{cluster}/{order}/figures/timeline.html", caption="../report/timeline_html.rst", category="Figures"
        ),
        questions=report(
            "results/{cluster}/{order}/figures/questions.png", caption="../report/questions.rst", category="Figures"
        ),
        html="results/{cluster}/{order}/report.html",
        provenance=directory("results/{cluster}/{order}/provenance"),
    params:
        # the DAG archived in provenance/ is drawn by running this Snakefile with --dag
        snakefile=workflow.main_snakefile,
    log:
        "results/{cluster}/{order}/logs/report.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/report.py"
