"""What the command line names: the hosts (``NAME=URL``), the jump host and the container
to measure on each host."""

from __future__ import annotations

import re
from dataclasses import dataclass

from thermab.config import port_problem, redact_url
from thermab.experiment.discover.refusals import UsageError


@dataclass(frozen=True)
class Target:
    name: str
    transport: str  # ssh | local
    address: str | None = None
    port: int = 22
    user: str | None = None

    @property
    def url(self) -> str:
        if self.transport == "local":
            return "local://"
        return f"ssh://{self.user + '@' if self.user else ''}{self.address}:{self.port}"


HOST_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
SSH_URL = re.compile(r"^ssh://(?:(?P<user>[^@/:\s]+)@)?(?P<address>[^@:/\s]+)(?::(?P<port>\d+))?/?$")
JUMP = re.compile(r"^([^@\s]+@)?[^@:\s]+(:[0-9]+)?$")  # the schema's `jump` pattern


def parse_target(text: str) -> Target:
    name, equals, url = text.partition("=")
    if not equals or not HOST_NAME.fullmatch(name):
        raise UsageError(
            f"{redact_url(text)!r}: expected NAME=ssh://[user@]host[:port] or NAME=local:// "
            "(NAME: letters, digits, _ . -)"
        )
    if url == "local://":
        return Target(name, "local")
    match = SSH_URL.fullmatch(url)
    if not match or port_problem(match["port"] or "22"):
        raise UsageError(
            f"host {name}: {redact_url(url)!r} is not ssh://[user@]host[:port] or local:// "
            "(a password is never taken: keys or the ssh-agent)"
        )
    return Target(name, "ssh", match["address"], int(match["port"] or 22), match["user"])


def check_jump(jump: str | None) -> None:
    port = (jump or "").rpartition("@")[2].partition(":")[2]
    if jump and (not JUMP.fullmatch(jump) or (port and port_problem(port))):
        raise UsageError(f"--jump {redact_url(jump)}: expected user@host:port (port 1-65535)")


def parse_containers(values: list[str], hosts: list[str]) -> dict[str, str]:
    """``--container`` values: ``NAME`` for every host or ``HOST=NAME`` for one; ``auto``
    (any container or none) and ``none`` (a server outside containers) are choices too."""
    chosen = {host: "auto" for host in hosts}
    for value in values:
        host, equals, name = value.rpartition("=")
        if not equals:
            chosen = {h: value for h in hosts}
            continue
        if host not in chosen:
            raise UsageError(f"--container {value}: no host {host!r} (hosts: {', '.join(hosts)})")
        chosen[host] = name
    return chosen
