rule monitor_start:
    # touches hosts: never a batch job the scheduler could kill (docs/fleet.md)
    localrule: True
    input:
        preflight=RUN.preflight,
    output:
        RUN.started,
    log:
        RUN.log("monitor_start.log"),
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/monitor_start.py"


# reads preflight.json for the clock offsets at the start (the drift is measured against them);
# an until: decided run ended at its last look, which put the hosts back: its stop is that look's
rule monitor_stop:
    # touches hosts: never a batch job the scheduler could kill (docs/fleet.md)
    localrule: True
    input:
        phases=get_phase_files("phase_json"),
        preflight=RUN.preflight,
        last_look=get_last_look,
    output:
        RUN.stopped,
    log:
        RUN.log("monitor_stop.log"),
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/monitor_stop.py"
