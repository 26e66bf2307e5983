"""How the controller reaches a host: run a command, move files.

Every transport reads the same way (after fabric's ``Connection``): ``run(cmd)`` returns a
``Result``; a failing command raises ``CommandError`` naming host, command, exit code and
the tail of stderr, unless ``check=False``.  The rest of thermab never knows which
transport it holds."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from thermab.errors import HostError


@dataclass(frozen=True)
class Result:
    command: str
    exited: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exited == 0


class TransportError(HostError):
    """The host could not be reached or did not answer in time."""

    def __init__(self, host: str, message: str):
        super().__init__(f"host {host}: {message}")
        self.host = host


class CommandError(TransportError):
    def __init__(self, host: str, result: Result):
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        super().__init__(host, f"command failed (exit {result.exited}): {result.command}\n{tail}")
        self.result = result


class NotAFile(TransportError):
    """A path of the host that is missing or no regular file, where one was to be read."""


class Lines(Protocol):
    """A command that answers each line sent to it with a line (``Transport.open_lines``)."""

    def send(self, data: bytes) -> None: ...

    def readline(self, timeout: float) -> str: ...

    def close(self) -> None: ...


class Transport(Protocol):
    host: str

    def run(self, command: str, *, timeout: float = 60, check: bool = True, input: str | None = None) -> Result: ...

    def open_lines(self, command: str) -> Lines: ...

    def put(self, local: Path, remote: str) -> None: ...

    def get(self, remote: str, local: Path) -> None: ...

    def close(self) -> None: ...


class LocalTransport:
    """The machine running the workflow (and the embedded simulated nodes)."""

    def __init__(self, host: str):
        self.host = host

    def run(self, command: str, *, timeout: float = 60, check: bool = True, input: str | None = None) -> Result:
        """``input``: the command's standard input (data too large for its command line)."""
        stdin = {"stdin": subprocess.DEVNULL} if input is None else {"input": input}
        try:
            completed = subprocess.run(
                ["bash", "-c", command], capture_output=True, text=True, timeout=timeout, **stdin
            )
        except subprocess.TimeoutExpired:
            raise TransportError(self.host, f"command timed out after {timeout:.0f} s: {command}") from None
        result = Result(command, completed.returncode, completed.stdout, completed.stderr)
        if check and not result.ok:
            raise CommandError(self.host, result)
        return result

    def open_lines(self, command: str) -> _LocalLines:
        return _LocalLines(self.host, command)

    def put(self, local: Path, remote: str) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, remote)

    def get(self, remote: str, local: Path) -> None:
        try:
            shutil.copyfile(remote, local)
        except OSError as error:
            raise TransportError(self.host, f"cannot read {remote}: {error.strerror}") from None

    def close(self) -> None:
        pass


class LineReader:
    """Lines from a long-lived command's output, each within a timeout; a transport gives
    ``_receive`` (bytes, b"" at the end, None when nothing came within ``left`` seconds)."""

    host: str
    command: str
    buffer = b""

    def _receive(self, left: float) -> bytes | None:
        raise NotImplementedError

    def readline(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            chunk = self._receive(left) if left > 0 else None
            if chunk is None:
                raise TransportError(self.host, f"no answer within {timeout:.0f} s from: {self.command}")
            if not chunk:
                raise TransportError(self.host, f"ended without an answer: {self.command}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode(errors="replace")


class _LocalLines(LineReader):
    def __init__(self, host: str, command: str):
        self.host, self.command = host, command
        self.process = subprocess.Popen(
            ["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0
        )

    def send(self, data: bytes) -> None:
        try:
            self.process.stdin.write(data)
        except OSError:  # the command has ended (the readline after this says so)
            pass

    def _receive(self, left: float) -> bytes | None:
        if not select.select([self.process.stdout], [], [], left)[0]:
            return None
        return os.read(self.process.stdout.fileno(), 4096)

    def close(self) -> None:
        self.process.stdin.close()  # the loop ends at end of input
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
