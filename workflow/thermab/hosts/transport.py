"""How the controller reaches a host: run a command, move files.

Every transport reads the same way (after fabric's ``Connection``): ``run(cmd)`` returns a
``Result``; a failing command raises ``CommandError`` naming host, command, exit code and
the tail of stderr, unless ``check=False``.  The rest of thermab never knows which
transport it holds."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Result:
    command: str
    exited: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exited == 0


class TransportError(RuntimeError):
    """The host could not be reached or did not answer in time."""

    def __init__(self, host: str, message: str):
        super().__init__(f"host {host}: {message}")
        self.host = host


class CommandError(TransportError):
    def __init__(self, host: str, result: Result):
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        super().__init__(host, f"command failed (exit {result.exited}): {result.command}\n{tail}")
        self.result = result


class Transport(Protocol):
    host: str

    def run(self, command: str, *, timeout: float = 60, check: bool = True) -> Result: ...

    def put(self, local: Path, remote: str) -> None: ...

    def get(self, remote: str, local: Path) -> None: ...

    def close(self) -> None: ...


class LocalTransport:
    """The machine running the workflow (and the embedded simulated nodes)."""

    def __init__(self, host: str):
        self.host = host

    def run(self, command: str, *, timeout: float = 60, check: bool = True) -> Result:
        try:
            completed = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                                       timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise TransportError(self.host, f"command timed out after {timeout:.0f} s: {command}") from None
        result = Result(command, completed.returncode, completed.stdout, completed.stderr)
        if check and not result.ok:
            raise CommandError(self.host, result)
        return result

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

