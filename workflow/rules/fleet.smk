# With several clusters in the config, one report compares them (each keeps its own).
rule fleet_report:
    input:
        get_fleet_inputs,
    output:
        csv="results/fleet/{order}/fleet.csv",
        markdown="results/fleet/{order}/fleet.md",
        figure=report("results/fleet/{order}/fleet.png", caption="../report/fleet.rst", category="Fleet"),
    log:
        "results/fleet/{order}/logs/fleet_report.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/fleet_report.py"
