"""Untrusted text in summary.md, evidence.md and report.html: arm labels and values, the
cluster's and the setting's names, and what a host or server said (uname, vLLM version,
model name, the setting's file) are escaped where they are written (thermab.markup), so
Markdown and HTML metacharacters in any of them change no structure: the tables keep their
columns, every line stays the kind of line it was, and no HTML element appears that the
same report with plain names does not have.  Pure functions on one analysis of a synthetic
run, a few examples."""

import re
from html.parser import HTMLParser

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from support.synthetic_run import ARMS, plan_view, write_synthetic_run
from thermab import markup
from thermab.analysis.run_analysis import compute
from thermab.report import evidence, html_page, summary

HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "</details>",
    "\n# heading",
    "\n| a | b |\n|---|---|\n",
    "|",
    "`",
    "**",
    "_x_",
    "[x](javascript:alert(1))",
    "![i](x.png)",
    "\r\n- item",
    "\u2028> quote",
    "&lt;b&gt;",
    "\\",
    "~~",
    "1. ",
    "<!--",
]
texts = st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=4)), min_size=1, max_size=5).map("".join)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    return compute(write_synthetic_run(tmp_path_factory.mktemp("run") / "sim" / "AB"))


def preflight(uname: str, vllm: str, model: str, file: str) -> dict:
    facts = {"uname": uname, "vllm_version": vllm, "file": file, "sha256": "ab" * 32, "zones": ["TSOC"]}
    return {"hosts": {"head": facts}, "endpoint": {"url": "http://127.0.0.1:8000", "model": model}}


def outputs(analysed, label_a, label_b, value_a, value_b, cluster, setting, host_said) -> tuple[str, str, str]:
    """summary.md, evidence.md and report.html's body of the synthetic run under these names."""
    arms = {
        "A": {**ARMS["A"], "label": label_a, "value": value_a},
        "B": {**ARMS["B"], "label": label_b, "value": value_b},
    }
    plan = plan_view(cluster=cluster, arms=arms, setting=setting, model=host_said[2])
    tables = dict(analysed.tables)
    variance = tables["variance"].assign(label=tables["variance"]["arm"].map({"A": label_a, "B": label_b}))
    variance = variance.assign(verdict=summary.verdicts(variance))
    tables["variance"] = variance
    summary_md = summary.summary_markdown(
        plan, tables, variance, sample_interval_s={}, sources=[f"results/{cluster}/AB"], best=None
    )
    evidence_md = evidence.evidence_markdown(
        plan,
        tables["questions"],
        variance,
        tables["windows"],
        preflight=preflight(*host_said),
        events=None,
        sources={},
        asked_s=tables["validity"]["load_s"],
    )
    return summary_md, evidence_md, html_page.body_html(summary_md + "\n" + evidence_md)


def line_kinds(text: str) -> list:
    """Each line's kind: a heading of its level, a table row of its cells, a list item, a
    quote, thermab's own HTML lines, blank, or text."""
    kinds = []
    for line in text.split("\n"):
        if line.startswith("|"):
            kinds.append(("row", line.count("|")))  # every | of a cell's text is a reference
        elif re.match(r"#+ ", line):
            kinds.append(("heading", len(line.split(" ")[0])))
        elif line.startswith(("- ", "  ")):
            kinds.append("item")
        elif line.startswith(">"):
            kinds.append("quote")
        elif line.startswith("<"):
            kinds.append(line)
        else:
            kinds.append("blank" if not line.strip() else "text")
    return kinds


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, tuple(attrs)))

    def handle_endtag(self, tag):
        self.tags.append(("/" + tag, ()))


def tags(page: str) -> list:
    parser = Tags()
    parser.feed(page)
    return parser.tags


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strings=st.lists(texts, min_size=10, max_size=10))
def test_untrusted_text_changes_no_structure_of_the_reports(analysed, strings):
    label_a, label_b, value_a, value_b, cluster, setting, *host_said = strings
    plain = outputs(analysed, "stockA", "patchedB", "1", "2", "sim", "busy_loop_s", ("Linux", "0.11", "m", "/f.py"))
    hostile = outputs(analysed, label_a + "A", label_b + "B", value_a, value_b, cluster, setting, host_said)
    for plain_md, hostile_md in zip(plain[:2], hostile[:2], strict=True):
        assert line_kinds(hostile_md) == line_kinds(plain_md)
        assert "<script" not in hostile_md and "<img" not in hostile_md
    assert tags(hostile[2]) == tags(plain[2]), "no element thermab did not write"


@pytest.mark.parametrize(
    "text", ["a|b", "x\ny", "</details>", "<script>", "_a_", "*b*", "`c`", "[d](e)", "# f", "1. g", "\\|"]
)
def test_each_escape_reads_as_written_and_escaping_twice_changes_nothing(text):
    for escape in (markup.md_cell, markup.md_text):
        once = escape(text)
        assert escape(once) == once and "\n" not in once and "|" not in once and "<" not in once
        rendered = html_page.body_html(f"| h |\n|---|\n| {once} |\n\nline {once}\n")
        assert rendered.count("<td>") == 1 and "<script" not in rendered and "<a" not in rendered
    assert markup.html_text('<b>&"') == "&lt;b&gt;&amp;&quot;"
