"""known_hosts as OpenSSH reads it, and never rewritten.

A user's known_hosts holds more than paramiko understands: comments, hashed names
(``|1|salt|hash``), ``@cert-authority`` and ``@revoked`` markers, key types such as
``sk-ssh-ed25519@openssh.com``.  paramiko's own loader rejects the markers and its save
drops whatever it did not parse, so thermab reads the files itself, keeping every line,
and writes only by appending one line (``append``).

A host is looked up by the name OpenSSH uses: ``addr`` on port 22, ``[addr]:port``
otherwise.  ``verify`` decides on the key a server presented: revoked, certified by a
trusted authority, pinned, or unknown (the caller decides what unknown means)."""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import hmac
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko
from paramiko.pkey import UnknownKeyType

from thermab.config import read_bounded
from thermab.errors import HostError, UserError

CA = "@cert-authority"
MAX_KNOWN_HOSTS_BYTES = 64 * 2**20
REVOKED = "@revoked"
CERT_SUFFIX = "-cert-v01@openssh.com"
# the public-key fields of each certificate type, after its nonce (PROTOCOL.certkeys)
CERT_KEY_FIELDS = {
    "ssh-ed25519": 1,
    "ssh-rsa": 2,
    "ssh-dss": 4,
    "ecdsa-sha2-nistp256": 2,
    "ecdsa-sha2-nistp384": 2,
    "ecdsa-sha2-nistp521": 2,
    "sk-ssh-ed25519@openssh.com": 2,
    "sk-ecdsa-sha2-nistp256@openssh.com": 3,
}
HOST_CERT = 2
# the plain host key types paramiko can be presented (RSA is pinned as ssh-rsa)
NEGOTIABLE = {"ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521"}


class HostKeyError(HostError):
    """The presented key must not be used (revoked, or certified wrongly and not pinned)."""


@dataclass(frozen=True)
class Entry:
    """One key line of a known_hosts file; ``where`` is ``path:line`` for messages."""

    where: str
    marker: str | None
    hosts: str
    key_type: str
    blob: bytes


def host_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def fingerprint(blob: bytes) -> str:
    """As ``ssh-keygen -lf`` prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def parse(text: str, path: str = "known_hosts") -> list[Entry]:
    """The key lines of a known_hosts file; comments, blank lines and lines OpenSSH
    would not read either (an unknown marker, a key that is not base64) are passed over."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = fields.pop(0) if fields[0].startswith("@") else None
        if marker not in (None, CA, REVOKED) or len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except binascii.Error:
            continue
        entries.append(Entry(f"{path}:{number}", marker, fields[0], fields[1], blob))
    return entries


def _pattern_matches(pattern: str, name: str) -> bool:
    # OpenSSH's match_pattern: only * and ? are special (so [addr]:port is literal)
    expression = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(expression, name, re.IGNORECASE) is not None


def hosts_match(hosts: str, name: str) -> bool:
    """Whether the host field of a line (hashed, or a comma list of patterns with ``!``
    negations) covers ``name``."""
    if hosts.startswith("|1|"):
        try:
            salt, digest = (base64.b64decode(part) for part in hosts[3:].split("|", 1))
        except (ValueError, binascii.Error):
            return False
        return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)
    matched = False
    for pattern in hosts.split(","):
        if pattern.startswith("!"):
            if _pattern_matches(pattern[1:], name):
                return False
        elif _pattern_matches(pattern, name):
            matched = True
    return matched


class KnownHosts:
    """The entries of several files (read once, in order) that concern one lookup."""

    def __init__(self, files: list[Path]):
        self.files = [Path(f) for f in files]
        self.entries: list[Entry] = []
        for path in self.files:
            if path.exists():  # bounded, and a directory or FIFO named as known_hosts is one line
                try:
                    data = read_bounded(path, MAX_KNOWN_HOSTS_BYTES)
                except UserError as error:
                    raise UserError(f"known_hosts {error}") from None
                self.entries += parse(data.decode(errors="replace"), str(path))

    def for_host(self, name: str) -> list[Entry]:
        return [e for e in self.entries if hosts_match(e.hosts, name)]


@dataclass(frozen=True)
class Certificate:
    """The fields of an OpenSSH certificate that decide whether to trust it."""

    key_type: str  # the certified key's plain type, e.g. ssh-ed25519
    key_blob: bytes  # the certified key as a plain public key
    cert_type: int
    key_id: str
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    ca_type: str
    ca_blob: bytes
    signed: bytes  # the bytes the signature covers
    signature: bytes


def _read_string(data: bytes, at: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from(">I", data, at)
    end = at + 4 + length
    if end > len(data):
        raise ValueError("truncated")
    return data[at + 4 : end], end


def _string(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def parse_certificate(blob: bytes) -> Certificate:
    cert_type_name, at = _read_string(blob, 0)
    plain = cert_type_name.decode().removesuffix(CERT_SUFFIX)
    if plain not in CERT_KEY_FIELDS:
        raise ValueError(f"unknown certificate type {cert_type_name.decode()!r}")
    _nonce, at = _read_string(blob, at)
    key_fields = []
    for _ in range(CERT_KEY_FIELDS[plain]):
        field, at = _read_string(blob, at)
        key_fields.append(field)
    _serial, cert_type = struct.unpack_from(">QI", blob, at)
    at += 12
    key_id, at = _read_string(blob, at)
    packed_principals, at = _read_string(blob, at)
    valid_after, valid_before = struct.unpack_from(">QQ", blob, at)
    at += 16
    for _ in range(3):  # critical options, extensions, reserved
        _skipped, at = _read_string(blob, at)
    ca_blob, at = _read_string(blob, at)
    signed = blob[:at]
    signature, _end = _read_string(blob, at)
    principals, p = [], 0
    while p < len(packed_principals):
        principal, p = _read_string(packed_principals, p)
        principals.append(principal.decode(errors="replace"))
    ca_type, _ = _read_string(ca_blob, 0)
    key_blob = _string(plain.encode()) + b"".join(_string(f) for f in key_fields)
    return Certificate(
        plain,
        key_blob,
        cert_type,
        key_id.decode(errors="replace"),
        tuple(principals),
        valid_after,
        valid_before,
        ca_type.decode(),
        ca_blob,
        signed,
        signature,
    )


def _certificate_problem(cert: Certificate, address: str, ca: Entry, now: float) -> str | None:
    """Why ``ca`` does not vouch for ``cert`` as the host ``address`` (None: it does)."""
    try:
        ca_key = paramiko.PKey.from_type_string(ca.key_type, ca.blob)
    except (UnknownKeyType, paramiko.SSHException, ValueError):
        return f"{ca.where}: @cert-authority key type {ca.key_type} cannot be verified by paramiko: line skipped"
    if not ca_key.verify_ssh_sig(cert.signed, paramiko.Message(cert.signature)):
        return f"{ca.where}: the certificate's signature does not verify"
    if cert.cert_type != HOST_CERT:
        return f"{ca.where}: a user certificate, not a host certificate"
    if cert.principals and address.lower() not in (p.lower() for p in cert.principals):
        return f"{ca.where}: certificate principals {', '.join(cert.principals)} do not include {address}"
    if not cert.valid_after <= now < cert.valid_before:
        return (
            f"{ca.where}: certificate valid {time.strftime('%Y-%m-%d %H:%M', time.gmtime(cert.valid_after))}"
            f" to {time.strftime('%Y-%m-%d %H:%M', time.gmtime(min(cert.valid_before, 2**31 - 1)))} UTC,"
            " not now"
        )
    return None


@dataclass(frozen=True)
class Verdict:
    """How a presented key was judged: ``trusted`` by ``how`` (a line of a file), or not
    found (``trusted`` False; the caller refuses it or, with accept-new, pins it).
    ``notes`` are what a user should hear either way (a skipped CA line, say)."""

    trusted: bool
    how: str
    key_type: str  # the plain key's type and blob: what accept-new pins
    key_blob: bytes
    notes: tuple[str, ...] = ()


def verify(known: KnownHosts, address: str, port: int, key_type: str, blob: bytes, now: float | None = None) -> Verdict:
    """Judge the key a server presented (``blob`` in wire format: a plain key or a
    certificate), as OpenSSH does: a revoked key (or certifying authority) is refused;
    a certificate is trusted when a matching ``@cert-authority`` line signed it for this
    address and it is valid now; otherwise the plain key must be pinned.  A pinned key
    of the same type that differs raises (a changed host key)."""
    now = time.time() if now is None else now
    name = host_name(address, port)
    entries = known.for_host(name)
    notes: list[str] = []
    cert = None
    if key_type.endswith(CERT_SUFFIX):
        cert = parse_certificate(blob)
        key_type, blob = cert.key_type, cert.key_blob
    revoked = {e.blob: e for e in entries if e.marker == REVOKED}
    for candidate in (blob, cert.ca_blob if cert else None):
        if candidate in revoked:
            raise HostKeyError(
                f"the host key of {name} ({fingerprint(candidate)}) is marked @revoked in {revoked[candidate].where}"
            )
    if cert is not None:
        authorities = [e for e in entries if e.marker == CA and e.blob == cert.ca_blob]
        for ca in authorities:
            problem = _certificate_problem(cert, address, ca, now)
            if problem is None:
                return Verdict(
                    True,
                    f"certificate {cert.key_id!r} signed by the authority in {ca.where}",
                    key_type,
                    blob,
                    tuple(notes),
                )
            notes.append(problem)
        if not authorities:
            notes.append(
                f"{name} presented a certificate signed by {fingerprint(cert.ca_blob)}, "
                "which no @cert-authority line trusts"
            )
    # a pin of a type paramiko never negotiates (sk-*, ssh-dss) cannot be what was presented
    pinned = [e for e in entries if e.marker is None and e.key_type in NEGOTIABLE]
    for entry in pinned:
        if entry.key_type == key_type and entry.blob == blob:
            return Verdict(True, f"pinned in {entry.where}", key_type, blob, tuple(notes))
    if pinned:
        # the server was asked for the pinned types first, so another key means a changed host
        pins = "; ".join(f"{e.key_type} {fingerprint(e.blob)} ({e.where})" for e in pinned)
        raise HostKeyError(
            f"the host key of {name} CHANGED: it presented {key_type} {fingerprint(blob)}, known_hosts pins {pins}"
        )
    return Verdict(False, "not pinned", key_type, blob, tuple(notes))


def preferred_key_types(known: KnownHosts, name: str, offered: list[str]) -> list[str]:
    """``offered`` (paramiko's host key algorithms) reordered the way OpenSSH does: the
    types known for this host first (certificates first where an authority is trusted),
    so a host with several keys presents the one that is pinned."""
    entries = known.for_host(name)
    wanted = []
    if any(e.marker == CA for e in entries):
        wanted += [t for t in offered if t.endswith(CERT_SUFFIX)]
    for entry in entries:
        if entry.marker is None:
            # an RSA key is pinned as ssh-rsa and negotiated as rsa-sha2-*
            wanted += [
                t
                for t in offered
                if t == entry.key_type
                or (entry.key_type == "ssh-rsa" and t.startswith("rsa-sha2-") and CERT_SUFFIX not in t)
            ]
    first = list(dict.fromkeys(wanted))
    return first + [t for t in offered if t not in first]


def append(path: Path, name: str, key_type: str, blob: bytes) -> bool:
    """Pin a key by appending one OpenSSH line to ``path``; nothing already there is
    rewritten.  False when an identical line is already present (another job got there
    first: the lock makes check-and-append one step)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = f"{name} {key_type} {base64.b64encode(blob).decode()}\n"
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        text = handle.read()
        if any(
            e.marker is None and e.key_type == key_type and e.blob == blob and hosts_match(e.hosts, name)
            for e in parse(text, str(path))
        ):
            return False
        handle.write(("" if not text or text.endswith("\n") else "\n") + line)
    return True
