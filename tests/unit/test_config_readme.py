"""config/README.md states each key's default as the schema (the one owner of the defaults) has
it: every row of a table with a default column, read back as YAML, equals the schema's
``default``; "(required)" is a required key; "—" or nothing is a key without one."""

import pytest
import yaml

from support.paths import REPO as ROOT
from thermab.config import SCHEMA as SCHEMA_FILE

README = ROOT / "config" / "README.md"
HOST = "clusters.C.hosts.H"  # the README's `….key`
# keys without a schema default whose value is found where it is used (SSH's port and the
# current user, the agent's Python by transport, OpenSSH's known_hosts, the monitor's pattern):
# the README says in words what that is
FOUND_WHERE_USED = {f"{HOST}.{key}" for key in ("port", "user", "agent_python", "known_hosts", "process_pattern")}
NONE = ("", "—")


def schema_keys(schema: dict, prefix: str = "", required: bool = False) -> dict[str, tuple[dict, bool]]:
    """Each key of the schema by its README name (``arms.X.label``, ``clusters.C.hosts.H.port``):
    its schema and whether it is required."""
    keys = {prefix: (schema, required)} if prefix else {}
    for name, sub in schema.get("properties", {}).items():
        keys |= schema_keys(sub, f"{prefix}.{name}" if prefix else name, name in schema.get("required", ()))
    if isinstance(schema.get("additionalProperties"), dict):  # one entry per arm, cluster, host: at least one
        entry = {"arms": "X", "clusters": "C", "clusters.C.hosts": "H"}[prefix]
        keys |= schema_keys(schema["additionalProperties"], f"{prefix}.{entry}", schema.get("minProperties", 0) > 0)
    return keys


def readme_rows() -> list[tuple[str, str]]:
    """(key, default) of every row of the README's tables with a default column, a cell that
    names several keys split into its keys and their defaults."""
    rows, columns = [], None
    for line in README.read_text().splitlines():
        if not line.startswith("|"):
            columns = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").replace("\\|", "\x00").split("|")]
        cells = [cell.replace("\x00", "|") for cell in cells]
        if columns is None:
            columns = cells
            continue
        if columns[:2] != ["key", "default"] or set(cells[0]) <= {"-", " "}:
            continue
        keys = [part.strip().strip("`").replace("….", f"{HOST}.") for part in cells[0].split(",")]
        keys = [key.split("` ", 1)[0] for key in keys]  # "`clusters.C` names"
        defaults = [part.strip() for part in cells[1].split(",")] if len(keys) > 1 else [cells[1]]
        if len(defaults) == 1:
            defaults *= len(keys)
        assert len(defaults) == len(keys), f"{line}: one default per key"
        rows += zip(keys, defaults, strict=True)
    return rows


SCHEMA = schema_keys(yaml.safe_load(SCHEMA_FILE.read_text()))
ROWS = readme_rows()


def test_the_readme_tabulates_keys_of_the_schema():
    assert len(ROWS) > 70
    assert [key for key, _default in ROWS if key not in SCHEMA] == []
    listed = {key for key, _default in ROWS}
    leaves = {key: spec for key, (spec, _required) in SCHEMA.items() if "properties" not in spec}  # not sections
    assert [key for key, spec in leaves.items() if "default" in spec and key not in listed] == []


@pytest.mark.parametrize("key, default", ROWS, ids=[key for key, _default in ROWS])
def test_each_default_is_the_schema_s(key, default):
    spec, required = SCHEMA[key]
    if default == "(required)":
        assert required and "default" not in spec
    elif key in FOUND_WHERE_USED:
        assert "default" not in spec and default not in NONE, "the schema has none: the README says what it is"
    elif default in NONE:
        assert "default" not in spec, f"the schema's default is {spec.get('default')!r}"
    else:
        assert "default" in spec, f"the README says {default}, the schema has no default"
        text = default.strip("`")
        assert spec["default"] in (text, yaml.safe_load(text)), f"the schema's default is {spec['default']!r}"
