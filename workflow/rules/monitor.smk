rule monitor_start:
    # touches hosts: never a batch job the scheduler could kill (docs/fleet.md)
    localrule: True
    input:
        "results/{cluster}/{order}/preflight.json",
    output:
        "results/{cluster}/{order}/monitor/started.json",
    log:
        "results/{cluster}/{order}/logs/monitor_start.log",
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/monitor_start.py"


rule monitor_stop:
    # touches hosts: never a batch job the scheduler could kill (docs/fleet.md)
    localrule: True
    input:
        get_phase_files("phase.json"),
    output:
        "results/{cluster}/{order}/monitor/stopped.json",
    log:
        "results/{cluster}/{order}/logs/monitor_stop.log",
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/monitor_stop.py"
