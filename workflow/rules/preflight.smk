rule preflight:
    output:
        preflight="results/{cluster}/{order}/preflight.json",
        run="results/{cluster}/{order}/run.json",
    log:
        "results/{cluster}/{order}/logs/preflight.log",
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/preflight.py"
