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
import shlex
import string
import time
from functools import cached_property
from pathlib import Path

from thermab.config import literal_kind
from thermab.errors import HostError
from thermab.hosts.host import Host
from thermab.hosts.transport import TransportError
from thermab.telemetry.agent import MatchTimeout, match_spans


class PatchError(HostError):
    pass


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def anchor_spans(text: str, anchor: str) -> list[tuple[int, int]]:
    """Where the anchor matches in a file of the host (at most MAX_FILE_BYTES), found within
    MATCH_LIMIT_S: an anchor that backtracks on this file is a PatchError naming the key,
    never a hang."""
    try:
        return match_spans(anchor, text)
    except MatchTimeout as error:
        raise PatchError(
            f"config key 'setting.anchor' ({anchor!r}): {error} on the setting's file; "
            "write it without repeats that can match the same text"
        ) from None


def anchor_matches(text: str, anchor: str) -> list[str]:
    return [text[start:end] for start, end in anchor_spans(text, anchor)]


def anchor_count(text: str, anchor: str) -> int:
    return len(anchor_spans(text, anchor))


def render(original: str, anchor: str, replacement: str, value: str, spans=None) -> str:
    """The file with the anchor's single match replaced; refuses any other match count.
    ``spans``: the anchor's in ``original``, when known already."""
    if "\n" in value:
        raise PatchError(f"value {value!r} contains a newline")
    spans = anchor_spans(original, anchor) if spans is None else spans
    if len(spans) != 1:
        raise PatchError(f"anchor {anchor!r} matches {len(spans)} times (must be exactly 1): nothing written")
    ((start, end),) = spans
    return original[:start] + replacement.format(value=value) + original[end:]


def original_value(match: str, replacement: str) -> str | None:
    """The value inside the anchor's ``match``, framed by the replacement's text around
    ``{value}`` (``busy_loop_s: float = 1`` → ``1``), or None when the match has another shape."""
    parts = list(string.Formatter().parse(replacement))
    at = next(i for i, (_text, name, _spec, _conversion) in enumerate(parts) if name == "value")
    prefix = "".join(text for text, *_ in parts[: at + 1])
    suffix = "".join(text for text, *_ in parts[at + 1 :])
    if len(match) < len(prefix) + len(suffix) or not (match.startswith(prefix) and match.endswith(suffix)):
        return None
    return match[len(prefix) : len(match) - len(suffix)]


def patch_problems(original: str, setting: dict, values: dict[str, str]) -> list[str]:
    """Why the arms' patches would be wrong on this file (empty when they are right): the
    anchor matches once, before and after each patch (so it can be patched again and
    restored), and, unless ``setting.value_type`` is ``expression``, the value it replaces
    is a Python literal of the arms' kind."""
    anchor, replacement = setting["anchor"], setting["replacement"]
    spans = anchor_spans(original, anchor)
    if len(spans) != 1:
        return [f"anchor {anchor!r} matches {len(spans)} times (must be exactly 1): nothing will be patched"]
    problems = []
    for letter, value in values.items():
        after = anchor_count(render(original, anchor, replacement, value, spans), anchor)
        if after != 1:
            problems.append(
                f"patched to arm {letter} ({value!r}), the file would match the anchor {after} times "
                "(must stay 1, to patch again and restore)"
            )
    if setting.get("value_type", "literal") == "literal":
        match = original[spans[0][0] : spans[0][1]]
        old = original_value(match, replacement)
        kind = literal_kind(old) if old is not None else None
        arm_kinds = sorted({str(literal_kind(v)) for v in values.values()})
        if old is None:
            problems.append(
                f"the anchor's match {match!r} does not have setting.replacement's text around "
                "{value}: the value it replaces cannot be told"
            )
        elif kind is None:
            problems.append(
                f"the value the patch replaces, {old!r}, is not a Python literal (set "
                "setting.value_type: expression if the file takes code there)"
            )
        elif arm_kinds != [kind]:
            problems.append(
                f"the value the patch replaces, {old!r}, is a {kind}; the arms' values are {', '.join(arm_kinds)}"
            )
    return problems


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
    return found[-1] + template[len(VLLM_DIR) :]


class Patcher:
    def __init__(self, host: Host, setting: dict, state_dir: Path):
        self.host = host
        # a run with setting.method env has none of these: restoring never needs them
        self.template = setting.get("file")
        self.anchor = setting.get("anchor")
        self.replacement = setting.get("replacement")
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

    def keep_original(self) -> None:
        """Keep the file's bytes as its original, unless kept already.  Every host's is kept
        before any host is written (phase.py), so that hosts that turn out to share
        one file (one install behind two names) all keep its unpatched bytes, and restoring
        them in any order puts those back."""
        if not self.is_patched:
            self._save_original(self.host.read_file(self.file))

    def _write_verified(self, data: bytes) -> None:
        self.host.write_file(self.file, data)
        reread = self.host.read_file(self.file)
        if sha256(reread) != sha256(data):
            raise PatchError(
                f"{self.where()}: re-read sha256 {sha256(reread)[:12]} differs from the written {sha256(data)[:12]}"
            )

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
        return {
            "file": self.file,
            "value": value,
            "sha256": sha256(wanted),
            "original_sha256": sha256(original),
            "changed": current != wanted,
        }

    def restore(self) -> dict | None:
        """Put the original back (verified) and forget the state; None if not patched."""
        if not self.is_patched:
            return None
        original = (self.state_dir / "original").read_bytes()
        try:
            current = self.host.read_file(self.file)
        except TransportError:  # gone or replaced: the original is written back all the same
            current = None
        if current != original:
            self._write_verified(original)
        for name in ("state.json", "original"):
            (self.state_dir / name).unlink()
        return {"file": self.file, "sha256": sha256(original)}
