"""The package's rooms, read from its own source: no import cycles, no import that runs
upward in the room order docs/design.md writes down, and the agent stdlib-only; and the
tests' own: what they share is in tests/support, never in another test module."""

import ast
import functools
import re
import sys
from pathlib import Path

import networkx as nx

from support.paths import REPO

PACKAGE = REPO / "workflow" / "thermab"


def room_order(heading: str = "Room order") -> dict[str, int]:
    """Each room's rank, lowest 0, from the line of docs/design.md that starts with ``heading``
    (the config room's modules have a line of their own)."""
    line = next(line for line in (REPO / "docs" / "design.md").read_text().splitlines() if line.startswith(heading))
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


def test_the_config_modules_import_only_lower_ones():
    ranks = room_order("Config's modules")
    inside = {
        name: name.removeprefix("thermab.config").lstrip(".") or "__init__"
        for name in package_graph()
        if room_of(name) == "config"
    }
    assert set(inside.values()) == set(ranks), "docs/design.md's config modules and the package's differ"
    upward = [
        (source, target)
        for source, target in package_graph().edges
        if source in inside and target in inside and ranks[inside[source]] < ranks[inside[target]]
    ]
    assert not upward, f"config modules that import a higher one: {upward}"


def test_no_two_modules_share_a_name():
    """One name per job: a file name says which module it is wherever it is quoted (a
    package's ``__init__`` aside)."""
    by_name: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"modules that share a file name: {shared}"


def test_the_agent_is_one_stdlib_file():
    tree = ast.parse((PACKAGE / "telemetry" / "agent.py").read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def matplotlib_setups(tree: ast.AST) -> list[int]:
    """The lines of a module that reach into matplotlib: any import of it or of a module of
    it (``pyplot``, ``ticker``, ...), or a call of ``matplotlib.use``, at any depth."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "matplotlib" for alias in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "matplotlib":
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "use"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "matplotlib"
        ):
            lines.append(node.lineno)
    return lines


def python_files():
    for folder in (PACKAGE, REPO / "scripts", REPO / "bench"):
        yield from sorted(folder.rglob("*.py"))


def test_headless_is_the_only_way_into_matplotlib():
    """Every figure is drawn through thermab.headless (Agg, labels never read as mathtext)."""
    found = {
        f"{path.relative_to(REPO)}:{line}"
        for path in python_files()
        if path != PACKAGE / "headless.py"
        for line in matplotlib_setups(ast.parse(path.read_text()))
    }
    assert not found, f"matplotlib set up outside thermab/headless.py: {sorted(found)}"


def test_the_matplotlib_check_can_fail():
    tree = ast.parse(
        "import matplotlib\nmatplotlib.use('Agg')\ndef f():\n    import matplotlib.pyplot as plt\n"
        "from matplotlib import pyplot\nfrom matplotlib import ticker\nimport numpy\n"
    )
    assert sorted(matplotlib_setups(tree)) == [1, 2, 4, 5, 6]


COMMAND_HELP = {"parser", "add_argument"}  # cli.parser's description, an option's help


def report_words(tree: ast.AST) -> list[int]:
    """The lines of a module that build words for a report: a string literal (an f-string's
    text with its fields as ``{}``) that, stripped, opens a Markdown heading (``#``) or list
    item (``- ``), or is a sentence (ends in one ``.`` and holds a space). A docstring and a
    command's help (the text given to ``cli.parser`` or ``add_argument``) are not a report's."""
    exempt = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            exempt.add(id(body[0].value))  # a docstring
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in COMMAND_HELP:
            exempt |= {id(inner) for argument in node.args + node.keywords for inner in ast.walk(argument)}
        if isinstance(node, ast.JoinedStr):
            exempt |= {id(part) for part in node.values}
    lines = []
    for node in ast.walk(tree):
        if id(node) in exempt:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
        elif isinstance(node, ast.JoinedStr):
            text = "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values).strip()
        else:
            continue
        sentence = text.endswith(".") and not text.endswith("..") and " " in text
        if text.startswith(("#", "- ")) or sentence:
            lines.append(node.lineno)
    return lines


def test_analysis_builds_no_words():
    """The analysis room hands numbers to the report room, which puts them in words: no
    heading, list item or sentence is built in analysis/."""
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted((PACKAGE / "analysis").glob("*.py"))
        for line in report_words(ast.parse(path.read_text()))
    ]
    assert not found, f"words built in analysis/ (the report room's job): {found}"


def test_the_words_check_can_fail():
    tree = ast.parse(
        'def f(x):\n    """A docstring."""\n    lines = ["## Heading", ""]\n    lines.append(f"- {x} item")\n'
        '    lines.append(f"It is {x}.")\n    path = "a.csv"\n    note = "no."\n'
        '    cli.parser("p", "A command. Its help.")\n    parser.add_argument("--x", help="An option.")\n'
    )
    assert report_words(tree) == [3, 4, 5]


def test_user_error_is_imported_from_its_owner():
    """UserError is thermab.errors' alone: no module takes it from elsewhere in the package."""
    found = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in [*python_files(), *sorted((REPO / "tests").rglob("*.py"))]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").split(".")[0] in {"thermab", ""}
        and (node.module or "").rpartition(".")[2] != "errors"
        and any(alias.name == "UserError" for alias in node.names)
    ]
    assert not found, f"UserError imported from a module other than thermab.errors: {found}"


def test_the_checker_sees_late_and_relative_imports(tmp_path):
    """The checks above can fail: a late import and a relative one are both edges."""
    root = tmp_path / "thermab"
    for name, text in {
        "__init__.py": "",
        "hosts/__init__.py": "",
        "report/__init__.py": "",
        "hosts/ssh.py": "def f():\n    from thermab.report import summary\n",
        "report/summary.py": "from ..hosts import ssh\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    graph = package_graph(root)
    assert {
        ("thermab.hosts.ssh", "thermab.report.summary"),
        ("thermab.report.summary", "thermab.hosts.ssh"),
    } <= set(graph.edges)
    assert list(nx.simple_cycles(graph))


def is_test_module(name: str) -> bool:
    return any(part.startswith("test_") for part in name.split("."))


def imported_test_modules(source: str) -> set[str]:
    """The test modules (``test_*``) a file imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [module] if is_test_module(module) else [f"{module}.{a.name}".lstrip(".") for a in node.names]
            found |= {"." * node.level + name for name in names}
    return {name for name in found if is_test_module(name)}


def test_no_test_module_imports_another():
    """A test file moves to another tier's folder, or splits, without breaking the files that
    share its helpers: those live in tests/support."""
    found = {
        str(path.relative_to(REPO)): imported
        for path in sorted((REPO / "tests").rglob("*.py"))
        if (imported := imported_test_modules(path.read_text()))
    }
    assert not found, f"test modules imported by others (move what they share to tests/support): {found}"


def test_the_test_import_check_can_fail():
    source = "from test_agent import csv_rows\nimport support.paths\nfrom . import test_sim\n"
    source += "def f():\n    import test_x\n"
    assert imported_test_modules(source) == {"test_agent", ".test_sim", "test_x"}
