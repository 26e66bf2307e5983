"""The anchor-checked patcher (docs/design.md): a patch can never silently miss or silently stay.

- The anchor (a regex) must match exactly once, or nothing is written.
- Before the first change the original bytes and their sha256 go to a state directory on
  the controller (``results/{cluster}/patch-state/{host}/``); its presence means "this
  host is patched", so a run that died is restored by the next preflight or the guardian.
- Every arm's file is rendered from the original, written, re-read and verified.
- Restoring writes the original back, verifies its sha256, then drops the state.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from functools import cached_property
from pathlib import Path

from thermab.hosts.host import Host


class PatchError(RuntimeError):
    pass


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def anchor_count(text: str, anchor: str) -> int:
    return len(re.findall(anchor, text))


def render(original: str, anchor: str, replacement: str, value: str) -> str:
    """The file with the anchor's single match replaced; refuses any other match count."""
    if "\n" in value:
        raise PatchError(f"value {value!r} contains a newline")
    count = anchor_count(original, anchor)
    if count != 1:
        raise PatchError(f"anchor {anchor!r} matches {count} times (must be exactly 1): nothing written")
    new = replacement.format(value=value)
    return re.sub(anchor, lambda _match: new, original, count=1)


VLLM_DIR = "{vllm}"
FIND_VLLM = "import os, vllm; print(os.path.dirname(vllm.__file__))"


def resolve_file(host: Host, template: str) -> str:
    """``{vllm}/x.py`` -> the installed vllm package's x.py, asked of the host's Python
    (inside the container if there is one); other paths are used as written."""
    if not template.startswith(VLLM_DIR + "/"):
        return template
    python = shlex.quote(host.spec.settings.get("python", "python3"))
    found = host.exec(f"{python} -c {shlex.quote(FIND_VLLM)}").stdout.strip().splitlines()
    if not found:
        raise PatchError(f"host {host.name}: {python} could not locate the vllm package")
    return found[-1] + template[len(VLLM_DIR):]


class Patcher:
    def __init__(self, host: Host, setting: dict, state_dir: Path):
        self.host = host
        self.template = setting["file"]
        self.anchor = setting["anchor"]
        self.replacement = setting["replacement"]
        self.state_dir = Path(state_dir)

    @cached_property
    def file(self) -> str:
        """The file on the host: as recorded when patched (restoring must not depend on
        the package still importing), else resolved now."""
        if self.is_patched:
            return json.loads((self.state_dir / "state.json").read_text())["file"]
        return resolve_file(self.host, self.template)

    def where(self) -> str:
        return f"host {self.host.name}: {self.file}"

    @property
    def is_patched(self) -> bool:
        return (self.state_dir / "state.json").exists()

    def original(self) -> bytes:
        """The pristine bytes: kept ones if this host is patched, else the live file."""
        if self.is_patched:
            return (self.state_dir / "original").read_bytes()
        return self.host.read_file(self.file)

    def _save_original(self, data: bytes) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "original").write_bytes(data)
        state = {"host": self.host.name, "file": self.file, "sha256": sha256(data), "saved_at": time.time()}
        (self.state_dir / "state.json").write_text(json.dumps(state, indent=1))

    def _write_verified(self, data: bytes) -> None:
        self.host.write_file(self.file, data)
        reread = self.host.read_file(self.file)
        if sha256(reread) != sha256(data):
            raise PatchError(f"{self.where()}: re-read sha256 {sha256(reread)[:12]} differs from the "
                             f"written {sha256(data)[:12]}")

    def apply(self, value: str) -> dict:
        """Set the file to the arm's value; returns what was done, for events.jsonl."""
        original = self.original()
        try:
            wanted = render(original.decode(), self.anchor, self.replacement, value).encode()
        except PatchError as error:
            raise PatchError(f"{self.where()}: {error}") from None
        current = self.host.read_file(self.file)
        if not self.is_patched:
            self._save_original(current)
        if current != wanted:
            self._write_verified(wanted)
        return {"file": self.file, "value": value, "sha256": sha256(wanted),
                "original_sha256": sha256(original), "changed": current != wanted}

    def restore(self) -> dict | None:
        """Put the original back (verified) and forget the state; None if not patched."""
        if not self.is_patched:
            return None
        original = (self.state_dir / "original").read_bytes()
        if self.host.read_file(self.file) != original:
            self._write_verified(original)
        for name in ("state.json", "original"):
            (self.state_dir / name).unlink()
        return {"file": self.file, "sha256": sha256(original)}
