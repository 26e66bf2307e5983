# A look of until: decided (thermab.report.look): the phases up to {repeats} stopped,
# ingested and analysed in looks/{repeats}/, and its decision, which the input functions of
# common.smk read to add the next block or end the run. It puts every host back, as
# monitor_stop does: the next block's phases bring them up again.
checkpoint look:
    # touches hosts: never a batch job the scheduler could kill (docs/fleet.md)
    localrule: True
    input:
        phases=get_look_phases("phase_json"),
        requests=get_look_phases("requests"),
        preflight=RUN.preflight,
        run=RUN.run_json,
    output:
        decision=LOOK.decision,
        stopped=LOOK.stopped,
        questions=LOOK.table("questions"),
    params:
        settings=get_look_settings,
    log:
        RUN.log("look{repeats}.log"),
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/look.py"


# ingest reads preflight.json for the clock offsets at the start
rule ingest:
    input:
        stopped=RUN.stopped,
        preflight=RUN.preflight,
        requests=get_phase_files("requests"),
    output:
        telemetry=RUN.tidy_telemetry,
        requests=RUN.tidy_requests,
    log:
        RUN.log("ingest.log"),
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/ingest.py"


# The numbers (analysis room): analysis/ (docs/design.md, "The analysis and its words");
# the tables users read, the words and figures are the report rules' (words.smk,
# figures.smk), which read these files and never analyse again. The analysis settings come through params
# (not from run.json, which keeps the values the run was made with): changing analysis.* in
# the config and running `all` again analyses again with them, Snakemake's params trigger
# reruns this job.
rule analyze:
    input:
        run=RUN.run_json,
        telemetry=RUN.tidy_telemetry,
        requests=RUN.tidy_requests,
    output:
        **ANALYSIS_FILES,
    params:
        analysis=plan.reanalysis(config["analysis"]),
    log:
        RUN.log("analyze.log"),
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/analyze.py"


# `snakemake --cores 1 compare`: every analysed run of each cluster found on disk (AB and
# BA, all repeats) pooled into one variance table and verdict, in results/{cluster}/compare/.
# The runs are read, not declared as inputs: a run made with another `repeats` must not be
# rebuilt to the current config's shape just to be compared.
rule compare:
    params:
        clusters=list(config["clusters"]),
        analysis=plan.reanalysis(config["analysis"]),
    log:
        layout.results_log("compare.log"),
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/compare.py"
