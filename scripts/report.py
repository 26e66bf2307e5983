"""Rule report: figures, report.html and the provenance archive (config, versions, DAG)."""
from pathlib import Path

from thermab import provenance, snake
from thermab.plots import render_figures
from thermab.report import write_report

with snake.logged(snakemake.log[0]):
    run_dir = Path(snakemake.output.html).parent
    render_figures(run_dir)
    write_report(run_dir, Path(snakemake.output.html))
    provenance.write(run_dir, Path(snakemake.output.provenance), dict(snakemake.config),
                     Path(snakemake.params.snakefile), Path.cwd(), snakemake.output.html)
