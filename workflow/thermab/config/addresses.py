"""Where a run reaches: endpoint URLs (a password never echoed), ports, host names and
addresses, host roots and paths, and each host's own keys."""

from __future__ import annotations

import ipaddress
import os
import re
import unicodedata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from thermab.config.patterns import SERVER_PLACEHOLDERS, _one_line, _regex, template_fields
from thermab.config.problems import _short

URL_PASSWORD = re.compile(r"(//[^/@\s:]*):[^/@\s]*@")


def redact_url(text: str) -> str:
    """``text`` with any password of a URL in it (``//user:secret@``) replaced by ``***``:
    an error message never echoes one."""
    return URL_PASSWORD.sub(r"\1:***@", text)


def port_problem(port: int | str) -> str | None:
    """Why ``port`` (an int, or its digits) is no TCP port; never wrapped to one."""
    if isinstance(port, str):
        if not port.isascii() or not port.isdigit():
            return f"port {_short(port)!r} is not a number"
        if len(port) > 5:
            return f"port {_short(port)} is outside 1-65535"
        port = int(port)
    return None if 1 <= port <= 65535 else f"port {port} is outside 1-65535"


def _host_name_problem(name: str) -> str | None:
    """A host name that is not plain ASCII: shown punycoded, or refused for an invisible character."""
    if name.isascii():
        return None
    hidden = [c for c in name if not c.isprintable() or unicodedata.category(c) in ("Cf", "Zs", "Mn")]
    if hidden:
        return (
            f"host has an invisible character ({', '.join(f'U+{ord(c):04X}' for c in hidden[:3])}); "
            "write the host in ASCII"
        )
    try:
        ascii_name = name.encode("idna").decode("ascii")
    except UnicodeError:
        return "host is not ASCII, and has no punycode form: write the host in ASCII"
    return f"host is not ASCII: write it punycoded, as {ascii_name}"


def endpoint_problem(url: str) -> str | None:
    """Why ``url`` is no OpenAI endpoint (http(s)://host:port[/path]), or None."""
    if url != url.strip() or any(c.isspace() for c in url):
        return "contains whitespace"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        return f"not a URL: {error}"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "has no host"
    if _host_name_problem(parts.hostname):
        return _host_name_problem(parts.hostname)
    if port is not None and port_problem(port):
        return port_problem(port)
    if parts.username is not None or parts.query or parts.fragment:
        return "must be http(s)://host:port[/path], without user, query or fragment"
    return None


def endpoint_address(url: str) -> tuple[str, int]:
    """The address and port an endpoint that ``endpoint_problem`` accepts is reached at (the
    scheme's port where it names none)."""
    parts = urlsplit(url)
    if parts.hostname is None:
        raise ValueError(f"endpoint {url!r} names no host (endpoint_problem refuses it)")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def host_root(workdir: Path, root: str) -> Path:
    """A host's root as written, absolute and normalised: a '..' is resolved by the text, so
    it cannot climb out unseen; a link (.thermab to a shared directory) stays where the user
    put it, and a link loop is for the first read to report, not a traceback here."""
    return Path(os.path.abspath(Path(workdir) / root))


def _normalised(key: str, path: str, problems: list[str]) -> None:
    """A path that reaches a host is written normalised: a '..' would climb out of the
    simulated root (or the vllm package) the path is meant to stay in."""
    if any(part in ("", ".", "..") for part in path.split("/")[1:]) or path.startswith(("./", "../")):
        problems.append(
            f"config key '{key}': {_short(path)!r} is not a normalised path (no '.', '..' "
            "or empty component, no trailing /): it must stay where it is written"
        )


def _address_problem(address: str) -> str | None:
    if address.startswith("["):
        return "write an IPv6 address without brackets (the port goes under 'port')"
    if address.count(":") == 1:
        return "carries its own port: give the host alone, and the port under 'port'"
    if ":" in address:
        try:
            ipaddress.IPv6Address(address.partition("%")[0])
        except ValueError:
            return "is not an IPv6 address (a port goes under 'port')"
    return None


def _reaches(host: dict[str, Any], workdir: Path) -> tuple[object, ...]:
    """What decides which files a host's paths reach: two hosts alike reach the same files."""
    where = (host.get("address", "").lower(), host.get("port", 22)) if host["transport"] == "ssh" else ("local",)
    root = str(host_root(workdir, host["root"])) if "root" in host else None
    return (*where, host.get("container_engine", "none"), host.get("container"), root)


def _host_problems(where: str, host: dict[str, Any], workdir: Path, problems: list[str]) -> None:
    if host["transport"] == "ssh" and "address" not in host:
        problems.append(f"config key '{where}.address': required for transport ssh")
    if "address" in host and _address_problem(host["address"]):
        problems.append(
            f"config key '{where}.address': {_short(host['address'])!r} {_address_problem(host['address'])}"
        )
    if "jump" in host:
        jump_port = host["jump"].rpartition("@")[2].partition(":")[2]
        if jump_port and port_problem(jump_port):
            problems.append(f"config key '{where}.jump': {port_problem(jump_port)}")
    if "agent_dir" in host:
        _normalised(f"{where}.agent_dir", host["agent_dir"], problems)
    if host.get("container_engine", "none") != "none" and "container" not in host:
        problems.append(f"config key '{where}.container': required with container_engine {host['container_engine']}")
    for name in ("root", "python", "agent_python", "agent_dir", "key_file", "known_hosts"):
        _one_line(f"{where}.{name}", host.get(name), problems)
    if host.get("agent_dir", "").rstrip("/") == "":
        problems.append(f"config key '{where}.agent_dir': not the root directory")
    if "process_pattern" in host:
        _regex(f"{where}.process_pattern", host["process_pattern"], problems)
    if "simulated" in host:
        if "root" not in host:
            problems.append(f"config key '{where}.root': a simulated host needs its node directory")
        else:
            root = host_root(workdir, host["root"])
            try:  # where it is: a link (or a link above it) out of the working directory leads out
                real = root.resolve()
            except (OSError, RuntimeError):  # a loop: for the first read to report
                real = root
            if any(path == workdir or not path.is_relative_to(workdir) for path in (root, real)):
                shown = _short(str(root)) + (f" (a link to {_short(str(real))})" if real != root else "")
                problems.append(
                    f"config key '{where}.root': a simulated node's directory must lie inside "
                    f"the working directory ({workdir}), not at {shown}"
                )
    for which in ("stop", "start"):
        template = host.get("server", {}).get(which)
        if template is None:
            continue
        fields = template_fields(f"{where}.server.{which}", template, SERVER_PLACEHOLDERS, problems)
        if fields and "root" in fields and "root" not in host:
            problems.append(f"config key '{where}.server.{which}': uses {{root}}, but the host has no root")


# the credentials each kind of wall meter may name, each from a variable or a file
METER_SECRETS = {"redfish": ("password",), "tasmota": ("password",), "snmp": ("community", "auth_key", "priv_key")}


def _wall_meter_problems(where: str, meters: list[Any], hosts: dict[str, Any], problems: list[str]) -> None:
    """What the schema cannot say of a host's wall meters (their keys are the schema's): one
    source per credential, a user with its password, no password over plain HTTP, the
    version's credentials for SNMP, and the hosts each meter feeds."""
    for index, meter in enumerate(meters):
        at = f"{where}.wall_meters.{index}"
        for name in METER_SECRETS.get(meter["kind"], ()):
            if f"{name}_env" in meter and f"{name}_file" in meter:
                problems.append(f"config key '{at}.{name}_file': give {name}_env or {name}_file, not both")
        has_password = "password_env" in meter or "password_file" in meter
        if meter["kind"] in ("redfish", "tasmota") and ("user" in meter) != has_password:
            missing = "password_env or password_file" if "user" in meter else "user"
            problems.append(f"config key '{at}.{missing.split()[0]}': a user and a password go together")
        if meter["kind"] == "redfish":
            if has_password and meter["url"].startswith("http://"):
                problems.append(f"config key '{at}.url': a BMC's password is not sent over plain http: use https")
            if "ca_file" in meter and "fingerprint_sha256" in meter:
                problems.append(f"config key '{at}.fingerprint_sha256': give ca_file or fingerprint_sha256, not both")
        if meter["kind"] == "snmp":
            if meter.get("version", "2c") == "2c" and not {"community_env", "community_file"} & set(meter):
                problems.append(f"config key '{at}.community_env': SNMP v2c needs community_env or community_file")
            if meter.get("version", "2c") == "3" and "user" not in meter:
                problems.append(f"config key '{at}.user': SNMP v3 needs a user")
            if {"priv_key_env", "priv_key_file"} & set(meter) and not {"auth_key_env", "auth_key_file"} & set(meter):
                problems.append(f"config key '{at}.auth_key_env': SNMP v3 privacy needs an authentication key")
        for fed in meter.get("feeds", ()):
            if fed not in hosts:
                problems.append(f"config key '{at}.feeds': {_short(fed)!r} is not a host of the cluster")
        if "feeds" in meter and where.rpartition(".")[2] not in meter["feeds"]:
            problems.append(f"config key '{at}.feeds': names the hosts the meter feeds, its own host among them")


def _fed_twice(where: str, hosts: dict[str, Any], problems: list[str]) -> None:
    """A host fed by another host's meter and metered at the wall itself would be counted twice."""
    for name, host in hosts.items():
        for index, meter in enumerate(host.get("wall_meters", ())):
            for fed in meter.get("feeds", ()):
                if fed != name and hosts.get(fed, {}).get("wall_meters"):
                    problems.append(
                        f"config key '{where}.{name}.wall_meters.{index}.feeds': host {fed} has wall meters "
                        "of its own: it would be counted twice"
                    )
