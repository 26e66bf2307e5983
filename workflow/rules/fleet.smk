# With several clusters in the config, one report compares them (each keeps its own).
rule fleet_report:
    input:
        get_fleet_inputs,
    output:
        csv=FLEET / "fleet.csv",
        markdown=FLEET / "fleet.md",
        figure=report(FLEET / "fleet.png", caption="../report/fleet.rst", category="Fleet"),
    params:
        analysis=plan.reanalysis(config["analysis"]),  # as the runs were analysed (their metric names)
    log:
        FLEET / "logs" / "fleet_report.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/fleet_report.py"
