rule baseline:
    # touches hosts: never a batch job the scheduler could kill (docs/fleet.md)
    localrule: True
    input:
        "results/{cluster}/{order}/monitor/started.json",
    output:
        "results/{cluster}/{order}/phases/baseline/phase.json",
    log:
        "results/{cluster}/{order}/logs/baseline.log",
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/baseline.py"


# Phases form a chain: each waits for the one before it (plan.previous), so they never
# overlap on a cluster even with --cores N.
rule phase:
    # touches hosts: never a batch job the scheduler could kill (docs/fleet.md)
    localrule: True
    input:
        get_previous_phase,
    retries: config["phase_retries"]
    output:
        phase="results/{cluster}/{order}/phases/rep{rep}-{arm}/phase.json",
        requests="results/{cluster}/{order}/phases/rep{rep}-{arm}/requests.parquet",
    log:
        phase="results/{cluster}/{order}/logs/rep{rep}-{arm}.log",
        locust="results/{cluster}/{order}/logs/rep{rep}-{arm}.locust.log",
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/phase.py"
