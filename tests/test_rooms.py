"""The package's rooms, read from its own source: no import cycles, no import that runs
upward in the room order docs/design.md writes down, and the agent stdlib-only."""

import ast
import functools
import re
import sys
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "workflow" / "thermab"


def room_order() -> dict[str, int]:
    """Each room's rank, lowest 0, from the 'Room order' line of docs/design.md."""
    line = next(
        line for line in (REPO / "docs" / "design.md").read_text().splitlines() if line.startswith("Room order")
    )
    ranks = {}
    for rank, step in enumerate(line.split(":", 1)[1].split("<")):
        for name in re.findall(r"`([^`]+)`", step):
            ranks[name] = rank
    return ranks


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = PACKAGE) -> set[str]:
    """Every thermab module this file imports, at any depth (late imports count too)."""
    own = module_name(path, root)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name == "thermab" or name.startswith("thermab.")}


@functools.cache  # read once for the three tests below
def package_graph(root: Path = PACKAGE) -> nx.DiGraph:
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for target in imports_of(path, root):
            if target in modules and target != name and not name.startswith(target + "."):
                graph.add_edge(name, target)
    return graph


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "thermab"


def test_the_room_order_names_every_room():
    rooms = {room_of(name) for name in package_graph()} - {"thermab"}
    assert rooms == set(room_order()), "docs/design.md's room order and the package's rooms differ"


def test_no_import_cycles():
    cycles = list(nx.simple_cycles(package_graph()))
    assert not cycles, f"import cycles: {cycles}"


def test_no_room_imports_a_higher_one():
    ranks = room_order()
    upward = [
        (source, target)
        for source, target in package_graph().edges
        if room_of(target) in ranks and ranks[room_of(source)] < ranks[room_of(target)]
    ]
    assert not upward, f"imports that run upward in the room order: {upward}"


def test_the_agent_is_one_stdlib_file():
    tree = ast.parse((PACKAGE / "telemetry" / "agent.py").read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_the_checker_sees_late_and_relative_imports(tmp_path):
    """The checks above can fail: a late import and a relative one are both edges."""
    root = tmp_path / "thermab"
    for name, text in {
        "__init__.py": "",
        "hosts/__init__.py": "",
        "analysis/__init__.py": "",
        "hosts/ssh.py": "def f():\n    from thermab.analysis import summary\n",
        "analysis/summary.py": "from ..hosts import ssh\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    graph = package_graph(root)
    assert {
        ("thermab.hosts.ssh", "thermab.analysis.summary"),
        ("thermab.analysis.summary", "thermab.hosts.ssh"),
    } <= set(graph.edges)
    assert list(nx.simple_cycles(graph))
