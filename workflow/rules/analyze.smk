rule ingest:
    input:
        stopped="results/{cluster}/{order}/monitor/stopped.json",
        requests=get_phase_files("requests.parquet"),
    output:
        telemetry="results/{cluster}/{order}/tidy/telemetry.parquet",
        requests="results/{cluster}/{order}/tidy/requests.parquet",
    log:
        "results/{cluster}/{order}/logs/ingest.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/ingest.py"


rule analyze:
    input:
        run="results/{cluster}/{order}/run.json",
        telemetry="results/{cluster}/{order}/tidy/telemetry.parquet",
        requests="results/{cluster}/{order}/tidy/requests.parquet",
    output:
        tables=report(
            expand("results/{cluster}/{order}/tables/{table}.csv", table=TABLES, allow_missing=True),
            caption="../report/tables.rst",
            category="Tables",
        ),
        markdown=expand("results/{cluster}/{order}/tables/{table}.md", table=TABLES, allow_missing=True),
        summary="results/{cluster}/{order}/summary.md",
    log:
        "results/{cluster}/{order}/logs/analyze.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/analyze.py"


# `snakemake --cores 1 compare`: every run of each cluster on disk (AB and BA, all
# repeats) pooled into one variance table and verdict, in results/{cluster}/compare/.
rule compare:
    input:
        expand("results/{cluster}/compare/summary.md", cluster=config["clusters"]),


rule compare_cluster:
    input:
        get_cluster_runs,
    output:
        variance="results/{cluster}/compare/variance.csv",
        summary="results/{cluster}/compare/summary.md",
    log:
        "results/{cluster}/compare/compare.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/compare.py"
