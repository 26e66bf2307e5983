"""Reading the files a user names: bounded (a FIFO, a device or a huge file refused at
once), and a config file with a strict YAML reader; several config files layered as
Snakemake layers them."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import yaml

from thermab.config.problems import ConfigError, _key, _short
from thermab.errors import UserError

MAX_CONFIG_BYTES = 4 * 2**20  # a config file; larger is not a config


MAX_DIGITS = 100  # an integer written longer is a mistake (Python refuses to convert past 4300)
KeyPath = list[str | int]  # a value's keys and list indices from the top of its document


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def check_file(path: str | Path, limit: int) -> os.stat_result:
    """``path`` is a regular file of at most ``limit`` bytes, or a UserError naming it; for
    files a library opens itself (parquet). ``stat`` never blocks, as opening a FIFO would."""
    try:
        info = os.stat(path)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: cannot read: {getattr(error, 'strerror', None) or error}") from None
    return _checked(path, info, limit)


def _checked(path: str | Path, info: os.stat_result, limit: int) -> os.stat_result:
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{path}: {_file_kind(info.st_mode)}, not a file")
    if info.st_size > limit:
        raise UserError(f"{path}: {info.st_size} bytes, more than the {limit} such a file may have")
    return info


def read_bounded(path: str | Path, limit: int) -> bytes:
    """The bytes of a file the user named, refused at once (a UserError naming it) when it
    is not a regular file (a FIFO, a device such as /dev/zero, a directory) or is larger
    than ``limit``.  Opened non-blocking, so a FIFO without a writer cannot hang the open;
    at most ``limit`` + 1 bytes are read, so a file still growing cannot exhaust memory.
    Every reader of a user's file goes through here (configs, known_hosts, key files,
    chart sources and marks, the files of a run directory)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: cannot read: {getattr(error, 'strerror', None) or error}") from None
    try:
        _checked(path, os.fstat(fd), limit)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(2**20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise UserError(f"{path}: cannot read: {error.strerror}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise UserError(f"{path}: more than the {limit} bytes such a file may have (it grew while read)")
    return b"".join(chunks)


class StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last
    one silently, so an arm or host written twice would vanish without a word), on one line
    of a flow mapping too, and refusing YAML 1.1's implicit readings that change what was
    written: ``0600`` (octal, 384), ``1_000``, ``1:30`` (sexagesimal, 90), ``0x1F``, ``yes``
    / ``no`` / ``on`` / ``off`` as booleans.  A plain number is decimal as written, a
    boolean is true or false; anything else is quoted."""

    key_paths: dict[int, KeyPath]  # set as a document is read (``_key_paths``)


Constructor = Callable[[StrictLoader, yaml.ScalarNode], Any]


def _line(loader: StrictLoader, node: yaml.Node) -> str:
    return f"{loader.name}: line {node.start_mark.line + 1}"


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
    seen: dict[Hashable, int] = {}
    for key_node, _value in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *defaults`: keys written beside it override it, as YAML says
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                raise ConfigError(
                    f"{_line(loader, key_node)}: key {_short(repr(key))} given twice in one "
                    f"mapping (first on line {seen[key]})"
                )
            seen[key] = key_node.start_mark.line + 1
        except TypeError:
            continue  # an unhashable key: the constructor below reports it
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


DECIMAL_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
DECIMAL_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+\.[0-9]*)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")
BOOLEANS = ("true", "True", "TRUE", "false", "False", "FALSE")


def _as_written(kind: str, pattern: re.Pattern[str] | None, construct: Constructor) -> Constructor:
    def constructor(loader: StrictLoader, node: yaml.ScalarNode) -> Any:
        text = node.value
        if kind == "integer" and len(text) > MAX_DIGITS:
            raise ConfigError(f"{_line(loader, node)}: an integer of {len(text)} characters (at most {MAX_DIGITS})")
        written = text in BOOLEANS if pattern is None else pattern.fullmatch(text)
        if not written:
            value = construct(loader, node)
            path = getattr(loader, "key_paths", {}).get(id(node))
            raise ConfigError(
                f"{_line(loader, node)}: "
                + (f"config key '{_key(path)}': " if path else "")
                + f"{_short(text)!r} would be read by YAML 1.1 as the {kind} "
                f"{_short(repr(value))}; write a plain decimal number, true or false, or quote it "
                "to keep it text"
            )
        return construct(loader, node)

    return constructor


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
StrictLoader.add_constructor(
    "tag:yaml.org,2002:int", _as_written("integer", DECIMAL_INT, yaml.SafeLoader.construct_yaml_int)
)
StrictLoader.add_constructor(
    "tag:yaml.org,2002:float", _as_written("number", DECIMAL_FLOAT, yaml.SafeLoader.construct_yaml_float)
)
StrictLoader.add_constructor(
    "tag:yaml.org,2002:bool", _as_written("boolean", None, yaml.SafeLoader.construct_yaml_bool)
)


def _key_paths(node: yaml.Node, path: KeyPath, paths: dict[int, KeyPath] | None = None) -> dict[int, KeyPath]:
    """id of each value node → its key path, so a value refused as it is read names its key."""
    paths = {} if paths is None else paths
    if id(node) in paths:
        return paths  # an alias (even of itself): named where it is first written
    paths[id(node)] = path
    if isinstance(node, yaml.MappingNode):
        for key_node, value in node.value:
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
            paths.setdefault(id(key_node), path + [name])
            _key_paths(value, path + [name], paths)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _key_paths(item, path + [index], paths)
    return paths


def _self_containing(node: yaml.Node, open_: set[int] | None = None, done: set[int] | None = None) -> yaml.Node | None:
    """The first list or mapping node that holds itself (``&a [*a]``): PyYAML refuses such a
    mapping, but builds such a list, which no reader of it could ever finish walking.  Each
    node is walked once (``done``), so aliases shared many times cost nothing more."""
    open_, done = (set() if open_ is None else open_), (set() if done is None else done)
    if id(node) in open_:
        return node
    if id(node) in done:
        return None
    open_.add(id(node))
    if isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    else:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
    for child in children:
        found = _self_containing(child, open_, done)
        if found is not None:
            return found
    open_.discard(id(node))
    done.add(id(node))
    return None


def read_file(path: str | Path) -> dict[str, Any]:
    """A config file (YAML or JSON) as a mapping; anything else is a ConfigError naming the file."""
    try:
        data = read_bounded(path, MAX_CONFIG_BYTES)
    except UserError as error:
        raise ConfigError(str(error)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start})") from None
    loader = None
    try:
        loader = StrictLoader(text)  # its reader refuses control characters already
        loader.name = str(path)
        node = loader.get_single_node()
        loader.key_paths = _key_paths(node, []) if node is not None else {}
        recursive = _self_containing(node) if node is not None else None
        if recursive is not None:
            kind = "mapping" if isinstance(recursive, yaml.MappingNode) else "list"
            raise ConfigError(f"{_line(loader, recursive)}: a {kind} that contains itself (an alias of its own anchor)")
        raw = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(f"{path}: not valid YAML: {where}{_short(' '.join(problem.split()))}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config keys, not a {type(raw).__name__}")
    return raw


def read_layered(paths: list[str | Path]) -> dict[str, Any]:
    """Config files merged as Snakemake merges several ``--configfile``: each later file's
    mappings into the earlier ones, key by key, any other value replaced."""
    from snakemake.utils import update_config  # only where files are layered: seconds to import

    merged: dict[str, Any] = {}
    for path in paths:
        update_config(merged, read_file(path))
    return merged
