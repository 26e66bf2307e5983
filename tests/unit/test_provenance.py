"""provenance/: the job DAG is asked of Snakemake once, as dot, and dag.mmd is drawn from it."""

from __future__ import annotations

from thermab.report.provenance import mermaid, parse_dot

# the shape of `snakemake --dag dot` (labels with \n between rule and wildcards)
DOT = r"""digraph snakemake_dag {
    graph[bgcolor=white, margin=0];
    node[shape=box, style=rounded, fontname=sans,                 fontsize=10, penwidth=2];
    edge[penwidth=2, color=grey];
	0[label = "all", color = "0.00 0.6 0.85", style="rounded"];
	1[label = "analyze\ncluster: sim\norder: AB", color = "0.10 0.6 0.85", style="rounded"];
	2[label = "phase\nphase: rep1-A", color = "0.20 0.6 0.85", style="rounded"];
	3[label = "phase\nphase: rep1-B", color = "0.20 0.6 0.85", style="rounded"];
	1 -> 0
	2 -> 1
	3 -> 1
	2 -> 3
}
"""


def test_the_mermaid_dag_has_every_job_and_dependency_of_the_dot():
    text = mermaid(parse_dot(DOT))
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0] == "flowchart TB"
    assert 'id1["analyze<br/>cluster: sim<br/>order: AB"]' in lines
    assert {line for line in lines if "-->" in line} == {
        "id1 --> id0",
        "id2 --> id1",
        "id3 --> id1",
        "id2 --> id3",
    }
    assert sum('["' in line for line in lines) == 4


def test_a_quote_in_a_label_cannot_end_the_mermaid_node():
    text = mermaid(parse_dot('0[label = "phase\\nvalue: 1", color = "x"];\n'))
    assert text.splitlines()[1] == '    id0["phase<br/>value: 1"]'
    graph = parse_dot('0[label = "a", color = "x"];\n')
    graph.nodes["0"]["label"] = 'say "hi"'
    assert mermaid(graph).splitlines()[1] == '    id0["say #quot;hi#quot;"]'
