rule baseline:
    # touches hosts: never a batch job the scheduler could kill (docs/fleet.md)
    localrule: True
    input:
        RUN.started,
    output:
        RUN.phase(layout.BASELINE).phase_json,
    log:
        RUN.log("baseline.log"),
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/baseline.py"


# Phases form a chain: each waits for the one before it (plan.previous), so they never
# overlap on a cluster even with --cores N. With load.users a list, one job restarts once and
# runs a window per level, each level's files in its own phase directory (job_files). A
# phase reads preflight.json (the interlock's limits, the hosts expected to report, the
# clock offsets); its load window is a param (get_load_s: timings.load_s, or the shorter
# one until: decided gives speed questions). The load's raw records, its
# marks and validity.json are logs, not outputs: Snakemake deletes the outputs of a failed
# job, and these are what is left to read when a phase fails (an interlock abort included).
rule phase:
    # touches hosts: never a batch job the scheduler could kill (docs/fleet.md)
    localrule: True
    input:
        previous=get_previous_phase,
        preflight=RUN.preflight,
        opened_by=get_opening_look,
    retries: config["phase_retries"]
    output:
        phase=job_files(lambda phase: RUN.phase(phase).phase_json),
        requests=job_files(lambda phase: RUN.phase(phase).requests),
    params:
        load_s=get_load_s,
    log:
        phase=RUN.phase_log(layout.PHASE_PATTERN),
        locust=job_files(RUN.locust_log),
        records=job_files(lambda phase: RUN.phase(phase).records),
        marks=job_files(lambda phase: RUN.phase(phase).marks),
        validity=job_files(lambda phase: RUN.phase(phase).validity),
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/phase.py"
