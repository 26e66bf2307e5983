rule preflight:
    # touches hosts: never a batch job the scheduler could kill (docs/fleet.md)
    localrule: True
    output:
        preflight=RUN.preflight,
        run=RUN.run_json,
    log:
        RUN.log("preflight.log"),
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/preflight.py"


# `snakemake --cores 1 restore`: put every host back from the kept originals by hand
# (after a crash of the controller itself); the same as `python -m thermab restore`.
rule restore:
    # touches hosts: never a batch job the scheduler could kill (docs/fleet.md)
    localrule: True
    log:
        layout.results_log("restore.log"),
    conda:
        "../../envs/control.yaml"
    script:
        "../../scripts/restore.py"
