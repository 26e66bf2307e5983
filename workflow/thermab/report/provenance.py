"""``provenance/``: what produced a run, archived with it (after pyperf's metadata).

- ``config.yaml``: the validated config the run used, defaults filled in;
- ``versions.json``: flat named facts (Python, packages, platform, git commit);
- ``dag.dot``: Snakemake's own job DAG of the run; ``dag.mmd`` (Mermaid) and ``dag.svg``
  drawn from it;
- ``sha256.txt``: a manifest of every file of the run directory."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import networkx as nx
import yaml

from thermab.errors import StageFailed
from thermab.headless import plt  # the Agg backend, literal text

PACKAGES = (
    "thermab",
    "snakemake",
    "locust",
    "geventhttpclient",
    "orjson",
    "paramiko",
    "pandas",
    "pyarrow",
    "scipy",
    "statsmodels",
    "matplotlib",
    "plotly",
)


def versions(workdir: Path) -> dict[str, str]:
    facts = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            facts[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            facts[name] = "not installed"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=workdir, capture_output=True, text=True)
    facts["git_commit"] = commit.stdout.strip() if commit.returncode == 0 else "unknown"
    return facts


def snakemake_dag(snakefile: Path, workdir: Path, config_file: Path, target: str) -> str:
    """The DAG of every job the target needs, finished or not (Snakemake draws the finished
    dashed), as dot: one Snakemake start (seconds of a core); ``dag.mmd`` and ``dag.svg`` are
    drawn from it. Not ``--forceall``: that would ask for every checkpoint again, so a run of
    ``until: decided`` would show its first look only, not each look it ran; and files' times
    alone tell what ran (``--rerun-triggers mtime``), as the config given here is another file
    than the run's, which the looks' params name."""
    command = [
        sys.executable,
        "-m",
        "snakemake",
        target,
        "--snakefile",
        str(snakefile),
        "--directory",
        str(workdir),
        "--configfile",
        str(config_file),
        "--nolock",
        "--rerun-triggers",
        "mtime",
        "--dag",
        "dot",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise StageFailed(f"snakemake --dag failed: {result.stderr[-2000:]}")
    return result.stdout


def parse_dot(dot: str) -> nx.DiGraph[str]:
    graph: nx.DiGraph[str] = nx.DiGraph()
    for node, label in re.findall(r'^\s*(\d+)\[label = "([^"]*)"', dot, flags=re.M):
        graph.add_node(node, label=label.replace("\\n", "\n"))
    for source, target in re.findall(r"^\s*(\d+) -> (\d+)", dot, flags=re.M):
        graph.add_edge(source, target)
    return graph


def mermaid(graph: nx.DiGraph[str]) -> str:
    """The job DAG as a Mermaid flowchart (what ``snakemake --dag mermaid-js`` writes, less
    its colours), from the graph read off the dot."""
    lines = ["flowchart TB"]
    for node, data in graph.nodes(data=True):
        label = data.get("label", node).replace('"', "#quot;").replace("\n", "<br/>")
        lines.append(f'    id{node}["{label}"]')
    lines += [f"    id{source} --> id{target}" for source, target in graph.edges]
    return "\n".join(lines) + "\n"


def draw_dag(graph: nx.DiGraph[str], out_svg: Path) -> None:
    for layer, nodes in enumerate(nx.topological_generations(graph)):
        for node in nodes:
            graph.nodes[node]["layer"] = layer
    layout = nx.multipartite_layout(graph, subset_key="layer", align="horizontal", scale=4)
    positions = {node: (x, -y) for node, (x, y) in layout.items()}
    height = 1.2 * (max((d["layer"] for _, d in graph.nodes(data=True)), default=0) + 1)
    figure, axes = plt.subplots(figsize=(9, max(4.0, height)))
    nx.draw_networkx_edges(graph, positions, ax=axes, arrows=True, edge_color="#888888")
    nx.draw_networkx_labels(
        graph,
        positions,
        labels=nx.get_node_attributes(graph, "label"),
        font_size=6,
        ax=axes,
        bbox={"boxstyle": "round", "fc": "#eef3fb", "ec": "#4a6fa5"},
    )
    axes.set_axis_off()
    figure.tight_layout()
    figure.savefig(out_svg)
    plt.close(figure)


def manifest(run_dir: Path, skip: Path) -> str:
    lines = []
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file() and p != skip):
        lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.relative_to(run_dir)}")
    return "\n".join(lines) + "\n"


def write(run_dir: Path, out_dir: Path, config: dict[str, Any], snakefile: Path, workdir: Path, target: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    config_file = out_dir / "config.yaml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    (out_dir / "versions.json").write_text(json.dumps(versions(workdir), indent=1))
    dot = snakemake_dag(snakefile, workdir, config_file, target)
    (out_dir / "dag.dot").write_text(dot)
    graph = parse_dot(dot)
    (out_dir / "dag.mmd").write_text(mermaid(graph))
    draw_dag(graph, out_dir / "dag.svg")
    (out_dir / "sha256.txt").write_text(manifest(run_dir, out_dir / "sha256.txt"))
