# The words (report room): tables/*.csv and *.md (the numbers with their word columns: the
# verdicts, the answers' adjustment and balance), summary.md and evidence.md, made from the
# numbers analyze wrote and the run's own files; they never analyse again. The words read
# the analysis settings too (the names of zones and thresholds, the margins), and the report
# room's own code through its digest (REPORT_CODE, common.smk): a change of wording reruns
# these jobs and the figures, never analyze or a phase.
rule tables:
    input:
        **ANALYSIS_FILES,
        **RUN_FILES,
    output:
        tables=report(tables("csv"), caption="../report/tables.rst", category="Tables"),
        markdown=tables("md"),
    params:
        analysis=plan.reanalysis(config["analysis"]),
        report_code=REPORT_CODE,
    log:
        RUN.log("tables.log"),
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/tables.py"


rule summary:
    input:
        **ANALYSIS_FILES,
        **RUN_FILES,
    output:
        summary=RUN.summary,
    params:
        analysis=plan.reanalysis(config["analysis"]),
        report_code=REPORT_CODE,
    log:
        RUN.log("summary.log"),
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/summary.py"


rule evidence:
    input:
        **ANALYSIS_FILES,
        **RUN_FILES,
    output:
        evidence=RUN.evidence,
    params:
        analysis=plan.reanalysis(config["analysis"]),
        report_code=REPORT_CODE,
    log:
        RUN.log("evidence.log"),
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/evidence.py"
