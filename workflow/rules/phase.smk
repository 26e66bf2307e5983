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
# overlap on a cluster even with --cores N. A phase reads preflight.json (the interlock's
# limits, the hosts expected to report, the clock offsets). The load's raw records, its
# marks and validity.json are logs, not outputs: Snakemake deletes the outputs of a failed
# job, and these are what is left to read when a phase fails (an interlock abort included).
rule phase:
    # touches hosts: never a batch job the scheduler could kill (docs/fleet.md)
    localrule: True
    input:
        previous=get_previous_phase,
        preflight=RUN.preflight,
    retries: config["phase_retries"]
    output:
        phase=PHASE.phase_json,
        requests=PHASE.requests,
    log:
        phase=RUN.log("rep{rep}-{arm}.log"),
        locust=RUN.log("rep{rep}-{arm}.locust.log"),
        records=PHASE.records,
        marks=PHASE.marks,
        validity=PHASE.validity,
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/phase.py"
