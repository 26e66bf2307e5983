"""A host as the workflow sees it: a transport, an optional container, an optional root.

Files are read and written through shell commands (base64 over ``run``) so the same code
serves a local directory, an SSH host and a file inside a container.  Every string that
reaches a shell goes through ``shlex.quote``."""

from __future__ import annotations

import base64
import posixpath
import shlex
import sys
from functools import cached_property

from thermab.config import HostSpec
from thermab.hosts.transport import CommandError, LocalTransport, NotAFile, Result, Transport, TransportError

NOT_A_FILE = 66  # read_file's exit status where the path is no regular file (sysexits' EX_NOINPUT)
MAX_FILE_BYTES = 16 * 2**20  # a file of a host thermab reads (the setting's file): a larger one is not it


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
        """Where ``path`` of the host's filesystem lies as the transport sees it: under the
        root, normalised there, so that no '..' climbs out of it."""
        if self.spec.root is None:
            return path
        return str(self.spec.root) + posixpath.normpath("/" + path.lstrip("/"))

    def run(self, command: str, *, timeout: float = 60, check: bool = True, input: str | None = None) -> Result:
        """Run on the host itself (lifecycle commands, the agent); ``input`` is its stdin."""
        if input is None:  # a transport without stdin support still runs everything else
            return self.transport.run(command, timeout=timeout, check=check)
        return self.transport.run(command, timeout=timeout, check=check, input=input)

    def exec(self, command: str, *, timeout: float = 60, check: bool = True, input: str | None = None) -> Result:
        """Run where the server lives: inside the container if there is one."""
        engine = self.spec.container_engine
        if engine != "none":
            stdin = "-i " if input is not None else ""
            command = f"{engine} exec {stdin}{shlex.quote(self.spec.container)} sh -c {shlex.quote(command)}"
        return self.run(command, timeout=timeout, check=check, input=input)

    def read_file(self, path: str) -> bytes:
        """A regular file of the host, at most MAX_FILE_BYTES: anything else (a FIFO, which
        would block, a device, a directory, a huge file) is refused naming it."""
        quoted = shlex.quote(self.path(path))
        # `[ -f ]` first: opening a FIFO to read it would wait for a writer; what else the
        # path is comes back as one word on stderr, with an exit status of its own
        result = self.exec(
            f"if [ -f {quoted} ]; then head -c {MAX_FILE_BYTES + 1} < {quoted} | base64; "
            f"elif [ -d {quoted} ]; then echo 'a directory' >&2; exit {NOT_A_FILE}; "
            f"elif [ -e {quoted} ]; then echo 'not a regular file (a FIFO, socket or device)' >&2; exit {NOT_A_FILE}; "
            f"else echo 'missing' >&2; exit {NOT_A_FILE}; fi",
            check=False,
        )
        if result.exited == NOT_A_FILE:
            raise NotAFile(self.name, f"{path}: {result.stderr.strip()[-60:]}, where a regular file is needed")
        if not result.ok:
            raise CommandError(self.name, result)
        data = base64.b64decode(result.stdout)
        if len(data) > MAX_FILE_BYTES:
            raise TransportError(self.name, f"{path}: more than {MAX_FILE_BYTES} bytes")
        return data

    def write_file(self, path: str, data: bytes) -> None:
        # on stdin: a command line holds no argument over 128 KiB; in place (not rename) so
        # the file keeps its owner and mode inside the container
        self.exec(f"base64 -d > {shlex.quote(self.path(path))}", input=base64.b64encode(data).decode())

    def close(self) -> None:
        if self._transport is not None or "transport" in self.__dict__:
            self.transport.close()
