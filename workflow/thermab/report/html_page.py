"""``report.html``: one self-contained page a person can read and pass around — the
summary (with its tables), every figure inlined, and where the provenance lies."""

from __future__ import annotations

import base64
from pathlib import Path

import markdown
import nh3

from thermab.layout import RunDir, figures
from thermab.markup import html_text

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f3f8; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
code { background: #f5f5f5; padding: 0 0.2em; }
"""


def figure_html(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    title = html_text(path.stem.replace("_", " "))
    return f'<figure><img alt="{title}" src="data:image/png;base64,{data}"><figcaption>{title}</figcaption></figure>'


def figure_order(path: Path) -> tuple[int, str]:
    """The layout's order (the timeline first, the run's best picture), then by name."""
    known = list(figures(3, wakeup=True))  # every figure a run can have
    return (known.index(path.name) if path.name in known else len(known), path.name)


# the elements summary.md's Markdown becomes (Python-Markdown with tables) and the collapsed
# section thermab writes; nothing else survives into the page, whatever a label or a host said
BODY_TAGS = {
    *("h1", "h2", "h3", "h4", "h5", "h6", "p", "ul", "ol", "li", "blockquote", "hr", "br"),
    *("table", "thead", "tbody", "tr", "th", "td", "code", "pre", "em", "strong", "details", "summary"),
}
BODY_ATTRIBUTES = {"th": {"align", "style"}, "td": {"align", "style"}}


def body_html(summary: str) -> str:
    """summary.md as HTML: its text was escaped where it was written (thermab.markup), and the
    HTML is sanitised too (nh3, Ammonia's allow-list: ``BODY_TAGS`` only, no link, image or
    script), so no element reaches the page that thermab did not write."""
    rendered = markdown.markdown(summary, extensions=["tables"])
    return nh3.clean(rendered, tags=BODY_TAGS, attributes=BODY_ATTRIBUTES, link_rel=None)


def write_report(run_dir: Path, out_path: Path) -> None:
    run_dir = Path(run_dir)
    summary = RunDir(run_dir).summary.read_text()
    body = body_html(summary)
    figures = "\n".join(figure_html(p) for p in sorted(RunDir(run_dir).figures.glob("*.png"), key=figure_order))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>thermab report: {html_text(run_dir)}</title>
<style>{STYLE}</style></head><body>
{body}
<h2>Figures</h2>
<p>The interactive timeline (hover for every zone's value) is <a
href="figures/timeline.html">figures/timeline.html</a>.</p>
{figures}
<h2>Provenance</h2>
<p>Config, versions, the Snakemake DAG (<a href="provenance/dag.svg">dag.svg</a>, dag.dot, dag.mmd) and a
sha256 manifest of every file are in <code>provenance/</code>. Tables as CSV and Markdown are in
<code>tables/</code>.</p>
</body></html>
"""
    out_path.write_text(page)
