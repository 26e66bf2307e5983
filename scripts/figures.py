"""Rule figures: figures/, report.html and the provenance archive (config, versions, DAG),
from the numbers analyze wrote."""

from pathlib import Path

from thermab import jobs
from thermab.analysis.run_analysis import read_numbers
from thermab.report import provenance
from thermab.report.html_page import write_report
from thermab.report.plots import render_figures

with jobs.logged(snakemake.log[0]):
    run_dir = Path(snakemake.output.html).parent
    render_figures(read_numbers(run_dir, analysis=dict(snakemake.params.analysis)))
    write_report(run_dir, Path(snakemake.output.html))
    provenance.write(
        run_dir,
        Path(snakemake.output.provenance),
        dict(snakemake.config),
        Path(snakemake.params.snakefile),
        Path.cwd(),
        snakemake.output.html,
    )
