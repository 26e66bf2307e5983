"""A host as the workflow sees it: a transport, an optional container, an optional root.

Files are read and written through shell commands (base64 over ``run``) so the same code
serves a local directory, an SSH host and a file inside a container.  Every string that
reaches a shell goes through ``shlex.quote``."""

from __future__ import annotations

import base64
import shlex
import sys
from functools import cached_property

from thermab.config import HostSpec
from thermab.hosts.transport import LocalTransport, Result, Transport


def connect(spec: HostSpec, progress=print) -> Transport:
    """The transport for a host: this module sits above both kinds, so neither imports
    the other.  ``progress`` hears what the connection does on its own (retries,
    reconnects, a host key accepted)."""
    if spec.transport == "local":
        return LocalTransport(spec.name)
    from thermab.hosts.ssh import SshTransport  # paramiko is only needed for real clusters

    return SshTransport.from_spec(spec, progress)


class Host:
    def __init__(self, spec: HostSpec, transport: Transport | None = None, progress=print):
        self.spec = spec
        self.name = spec.name
        self._transport = transport
        self.progress = progress

    @cached_property
    def transport(self) -> Transport:
        return self._transport or connect(self.spec, self.progress)

    @property
    def agent_python(self) -> str:
        """The Python that runs the telemetry agent on the host (on the host itself, not
        in its container): the ``agent_python`` setting; else, on a local host, the
        controller's own; over SSH, ``python3`` as the PATH of a non-login shell finds it."""
        if "agent_python" in self.spec.settings:
            return self.spec.settings["agent_python"]
        return sys.executable if self.spec.transport == "local" else "python3"

    def path(self, path: str) -> str:
        """Where ``path`` of the host's filesystem lies as the transport sees it."""
        if self.spec.root is None:
            return path
        return str(self.spec.root) + "/" + path.lstrip("/")

    def run(self, command: str, *, timeout: float = 60, check: bool = True) -> Result:
        """Run on the host itself (lifecycle commands, the agent)."""
        return self.transport.run(command, timeout=timeout, check=check)

    def exec(self, command: str, *, timeout: float = 60, check: bool = True) -> Result:
        """Run where the server lives: inside the container if there is one."""
        engine = self.spec.container_engine
        if engine != "none":
            command = f"{engine} exec {shlex.quote(self.spec.container)} sh -c {shlex.quote(command)}"
        return self.run(command, timeout=timeout, check=check)

    def read_file(self, path: str) -> bytes:
        result = self.exec(f"base64 < {shlex.quote(self.path(path))}")
        return base64.b64decode(result.stdout)

    def write_file(self, path: str, data: bytes) -> None:
        encoded = base64.b64encode(data).decode()
        # in place (not rename) so the file keeps its owner and mode inside the container
        self.exec(f"printf %s {encoded} | base64 -d > {shlex.quote(self.path(path))}")

    def close(self) -> None:
        if self._transport is not None or "transport" in self.__dict__:
            self.transport.close()
