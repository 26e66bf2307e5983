"""known_hosts read as OpenSSH reads it (hosts/known_hosts.py), without a server: host
patterns, hashed names, certificates made by ssh-keygen, revocation, appending."""

import base64
import os
import shutil
import subprocess
import time

import pytest

from support.known_hosts import hashed
from thermab.hosts import known_hosts as kh

needs_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen (openssh-client)")


def keygen(directory, name, *extra):
    path = directory / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path), *extra], check=True)
    key_type, data = (directory / f"{name}.pub").read_text().split()[:2]
    return key_type, base64.b64decode(data), data


def test_host_patterns_as_openssh_matches_them():
    assert kh.host_name("10.0.0.1", 22) == "10.0.0.1" and kh.host_name("10.0.0.1", 2222) == "[10.0.0.1]:2222"
    assert kh.hosts_match("a.example.com,[10.0.0.1]:2222", "[10.0.0.1]:2222")
    assert not kh.hosts_match("[10.0.0.1]:2222", "10.0.0.1"), "brackets are literal, the port counts"
    assert kh.hosts_match("*.example.com", "Node1.EXAMPLE.com")
    assert kh.hosts_match("node?.lab", "node7.lab") and not kh.hosts_match("node?.lab", "node17.lab")
    assert not kh.hosts_match("*.example.com,!bad.example.com", "bad.example.com")
    assert kh.hosts_match(hashed("[127.0.0.1]:2200"), "[127.0.0.1]:2200")
    assert not kh.hosts_match(hashed("[127.0.0.1]:2200"), "[127.0.0.1]:2201")


def test_every_kind_of_line_is_read_or_passed_over():
    blob = base64.b64encode(b"\0\0\0\x0bssh-ed25519\0\0\0\x01x").decode()
    text = (
        f"# comment\n\n{hashed('h')} ssh-ed25519 {blob}\n"
        f"h sk-ssh-ed25519@openssh.com {blob} me@key\n@cert-authority *.lab ssh-ed25519 {blob}\n"
        f"@revoked * ssh-ed25519 {blob}\n@unknown-marker h ssh-ed25519 {blob}\nh ssh-ed25519 not-base64!\n"
    )
    entries = kh.parse(text, "f")
    assert [(e.where, e.marker, e.key_type) for e in entries] == [
        ("f:3", None, "ssh-ed25519"),
        ("f:4", None, "sk-ssh-ed25519@openssh.com"),
        ("f:5", kh.CA, "ssh-ed25519"),
        ("f:6", kh.REVOKED, "ssh-ed25519"),
    ]


@needs_keygen
def test_fingerprints_read_as_ssh_keygen_prints_them(tmp_path):
    _type, blob, _data = keygen(tmp_path, "k")
    printed = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True).stdout
    assert printed.split()[1] == kh.fingerprint(blob)


def test_the_pinned_types_are_asked_for_first():
    ed = base64.b64encode(b"k").decode()
    known = kh.KnownHosts([])
    known.entries = kh.parse(f"h ecdsa-sha2-nistp256 {ed}\nh ssh-rsa {ed}\nother ssh-ed25519 {ed}\n")
    offered = ["ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256", "ssh-ed25519-cert-v01@openssh.com"]
    assert kh.preferred_key_types(known, "h", offered)[:3] == ["ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256"]
    known.entries += kh.parse(f"@cert-authority h ssh-ed25519 {ed}\n")
    assert kh.preferred_key_types(known, "h", offered)[0] == "ssh-ed25519-cert-v01@openssh.com"


@pytest.fixture
def signed(tmp_path):
    """A CA, a host key and the host certificate the CA signed for 127.0.0.1."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("no ssh-keygen (openssh-client)")
    ca_type, ca_blob, ca_data = keygen(tmp_path, "ca")
    host_type, host_blob, _ = keygen(tmp_path, "host")
    subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-s",
            str(tmp_path / "ca"),
            "-I",
            "node1",
            "-h",
            "-n",
            "127.0.0.1",
            "-V",
            "-5m:+1h",
            str(tmp_path / "host.pub"),
        ],
        check=True,
    )
    cert_type, cert_data = (tmp_path / "host-cert.pub").read_text().split()[:2]
    return {
        "ca": f"{ca_type} {ca_data}",
        "ca_blob": ca_blob,
        "host_blob": host_blob,
        "cert_type": cert_type,
        "cert": base64.b64decode(cert_data),
    }


def known(text: str) -> kh.KnownHosts:
    store = kh.KnownHosts([])
    store.entries = kh.parse(text, "known_hosts")
    return store


def test_a_certificate_signed_by_a_trusted_authority_is_accepted(signed):
    cert = kh.parse_certificate(signed["cert"])
    assert cert.key_blob == signed["host_blob"] and cert.principals == ("127.0.0.1",) and cert.cert_type == 2
    verdict = kh.verify(
        known(f"@cert-authority [127.0.0.1]:* {signed['ca']}\n"), "127.0.0.1", 2200, signed["cert_type"], signed["cert"]
    )
    assert verdict.trusted and "node1" in verdict.how and "known_hosts:1" in verdict.how


def test_a_certificate_is_not_enough_when_wrong_or_untrusted(signed):
    line = f"@cert-authority * {signed['ca']}\n"
    for address, now, why in (
        ("10.0.0.9", None, "do not include 10.0.0.9"),
        ("127.0.0.1", time.time() + 7200, "not now"),
    ):
        verdict = kh.verify(known(line), address, 22, signed["cert_type"], signed["cert"], now=now)
        assert not verdict.trusted and any(why in note for note in verdict.notes)
    verdict = kh.verify(known(""), "127.0.0.1", 22, signed["cert_type"], signed["cert"])
    assert not verdict.trusted and "which no @cert-authority line trusts" in verdict.notes[0]
    assert verdict.key_blob == signed["host_blob"], "accept-new would pin the plain key inside"


def test_an_authority_paramiko_cannot_check_is_skipped_saying_so(signed):
    ca = kh.parse(f"@cert-authority * {signed['ca']}\n", "f")[0]
    sk = kh.Entry(ca.where, kh.CA, "*", "sk-ssh-ed25519@openssh.com", ca.blob)
    problem = kh._certificate_problem(kh.parse_certificate(signed["cert"]), "127.0.0.1", sk, time.time())
    assert "cannot be verified by paramiko: line skipped" in problem


def test_revoked_keys_and_authorities_are_refused(signed):
    host = base64.b64encode(signed["host_blob"]).decode()
    with pytest.raises(kh.HostKeyError, match="@revoked in known_hosts:2"):
        kh.verify(
            known(f"* ssh-ed25519 {host}\n@revoked * ssh-ed25519 {host}\n"), "h", 22, "ssh-ed25519", signed["host_blob"]
        )
    with pytest.raises(kh.HostKeyError, match="@revoked"):
        kh.verify(
            known(f"@cert-authority * {signed['ca']}\n@revoked * {signed['ca']}\n"),
            "127.0.0.1",
            22,
            signed["cert_type"],
            signed["cert"],
        )


def test_a_different_key_than_the_pinned_one_is_a_changed_host(signed):
    other = base64.b64encode(signed["ca_blob"]).decode()
    with pytest.raises(kh.HostKeyError, match="CHANGED.*known_hosts:1"):
        kh.verify(known(f"h ssh-ed25519 {other}\n"), "h", 22, "ssh-ed25519", signed["host_blob"])
    blob = base64.b64encode(signed["host_blob"]).decode()
    assert kh.verify(
        known(f"h sk-ssh-ed25519@openssh.com {other}\nh ssh-ed25519 {blob}\n"),
        "h",
        22,
        "ssh-ed25519",
        signed["host_blob"],
    ).trusted


def test_append_adds_one_line_and_never_rewrites(tmp_path):
    path = tmp_path / "known_hosts"
    path.write_bytes(b"# mine\nh ssh-ed25519 AAAA")  # no newline at the end
    assert kh.append(path, "[10.0.0.1]:2222", "ssh-ed25519", b"key")
    assert not kh.append(path, "[10.0.0.1]:2222", "ssh-ed25519", b"key"), "already there"
    assert path.read_bytes() == b"# mine\nh ssh-ed25519 AAAA\n[10.0.0.1]:2222 ssh-ed25519 a2V5\n"
    fresh = tmp_path / "new" / "known_hosts"
    kh.append(fresh, "h", "ssh-ed25519", b"key")
    assert fresh.read_text() == "h ssh-ed25519 a2V5\n" and os.path.getsize(fresh) == 19
