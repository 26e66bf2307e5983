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


# analyze also reads phases/*/validity.json: each is written by the phase job whose
# requests.parquet tidy/requests.parquet already waits for.
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


# `snakemake --cores 1 compare`: every analysed run of each cluster found on disk (AB and
# BA, all repeats) pooled into one variance table and verdict, in results/{cluster}/compare/.
# The runs are read, not declared as inputs: a run made with another `repeats` must not be
# rebuilt to the current config's shape just to be compared.
rule compare:
    params:
        clusters=list(config["clusters"]),
    log:
        "results/logs/compare.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../scripts/compare.py"
