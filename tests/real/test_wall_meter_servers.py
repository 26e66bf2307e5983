"""Wall meters read from real protocol servers on loopback, each started here and stopped
by its pid (scripts/install_meter_servers.sh installs them; skipped, saying why, without):
sushy-tools' sushy-static serving a Redfish chassis over TLS, and snmpsim answering a PDU's
recorded OIDs over SNMP v2c and v3 with an energy counter that grows with time.  The energy
integrated over a window equals the counter's difference within 1 %."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from support.paths import REPO
from support.ports import free_port
from thermab.telemetry import ingest, power, wall_meters, wall_poll
from thermab.telemetry.wall_meters import Meter, MeterError

VENV = Path(os.environ.get("THERMAB_METER_SERVERS_VENV", REPO / ".thermab/meter-servers-venv"))
POWER_OID = "1.3.6.1.4.1.318.1.1.26.9.4.3.1.7.1"  # an APC outlet's power (deciwatts) and energy
ENERGY_OID = "1.3.6.1.4.1.318.1.1.26.9.4.3.1.11.1"
RATE_W = 250.0


def server_command(name: str) -> Path:
    command = VENV / "bin" / name
    if not command.exists():
        pytest.skip(f"{command} is missing: run scripts/install_meter_servers.sh")
    return command


def started(command: list, log: Path, ready, what: str) -> subprocess.Popen:
    """The server started, once ``ready()``; skipped with its log's tail when it will not."""
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.skip(f"{what} did not start: {log.read_text()[-300:]}")
        if ready():
            return process
        time.sleep(0.1)
    stop(process)
    pytest.skip(f"{what} not ready within 30 s: {log.read_text()[-300:]}")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# -- SNMP: snmpsim ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pdu():
    """snmpsim on a free UDP port: community ``pdu`` (v2c), user ``thermab`` (v3, SHA + AES,
    context ``pdu``); its data and cache in a directory the user it drops to can read."""
    command = server_command("snmpsim-command-responder")
    work = Path(tempfile.mkdtemp(prefix="thermab-snmpsim-"))
    try:
        (work / "data").mkdir()
        (work / "data/pdu.snmprec").write_text(
            f"{POWER_OID}|2|{int(RATE_W * 10)}\n{ENERGY_OID}|65:numeric|rate={RATE_W:g},initial=1000000\n"
        )
        (work / "cache").mkdir(mode=0o777)
        os.chmod(work, 0o755)
        os.chmod(work / "cache", 0o777)
        port = free_port()
        log = work / "snmpsim.log"
        process = started(
            [
                command,
                f"--data-dir={work / 'data'}",
                f"--cache-dir={work / 'cache'}",
                f"--agent-udpv4-endpoint=127.0.0.1:{port}",
                "--v3-user=thermab",
                "--v3-auth-key=authkey-1234",
                "--v3-auth-proto=SHA",
                "--v3-priv-key=privkey-1234",
                "--v3-priv-proto=AES",
                *(["--process-user=nobody", "--process-group=nogroup"] if os.getuid() == 0 else []),
            ],
            log,
            lambda: "Listening at UDP/IPv4" in log.read_text(errors="replace"),
            "snmpsim",
        )
        try:
            yield port
        finally:
            stop(process)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def snmp_meter(port: int, **settings) -> Meter:
    return Meter(
        "head",
        0,
        {
            "kind": "snmp",
            "host": "127.0.0.1",
            "port": port,
            "oid_power": POWER_OID,
            "power_scale": 0.1,
            "oid_energy": ENERGY_OID,
            "energy_scale": 1.0,
            "timeout_s": 1.0,
            **settings,
        },
    )


def test_snmp_v2c_and_v3_read_a_pdu_outlet(pdu, monkeypatch):
    monkeypatch.setenv("THERMAB_TEST_COMMUNITY", "pdu")
    monkeypatch.setenv("THERMAB_TEST_AUTH", "authkey-1234")
    monkeypatch.setenv("THERMAB_TEST_PRIV", "privkey-1234")
    for meter in (
        snmp_meter(pdu, community_env="THERMAB_TEST_COMMUNITY"),
        snmp_meter(
            pdu,
            version="3",
            user="thermab",
            context="pdu",
            auth_key_env="THERMAB_TEST_AUTH",
            priv_key_env="THERMAB_TEST_PRIV",
        ),
    ):
        snmp = wall_meters.reader(meter)
        try:
            watts, energy, wrap = snmp.read()
        finally:
            snmp.close()
        assert watts == RATE_W and energy >= 1_000_000 and wrap == 2**32, "a Counter32 of J"
    monkeypatch.setenv("THERMAB_TEST_COMMUNITY", "not-the-community")
    problem = wall_meters.probe(snmp_meter(pdu, community_env="THERMAB_TEST_COMMUNITY", timeout_s=0.3))
    assert problem.startswith(f"host head: wall meter snmp snmp://127.0.0.1:{pdu}: does not answer")
    assert "not-the-community" not in problem


def integrated(tmp_path: Path, rows: list) -> tuple[float, np.ndarray]:
    """(J from ingest's power rows integrated over their span, their times)."""
    path = tmp_path / "monitor/head/wall.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "\n".join(",".join(row) for row in [wall_poll.HEADER, *rows]) + "\n",
    )
    tidy, _ = ingest.telemetry(tmp_path / "monitor", {"head": 0.0})
    watts = tidy[tidy["sensor"] == "wall-0"]
    t, value = watts["t"].to_numpy(), watts["value"].to_numpy()
    return power.time_weighted_mean(t, value) * (t[-1] - t[0]), t


def counter_over_span(counters: list[float]) -> float:
    """The counter's difference over the span of the power rows (the midpoints of the first
    and last intervals): half the first interval, the middle ones, half the last."""
    steps = np.diff(counters)
    return steps[0] / 2 + steps[1:-1].sum() + steps[-1] / 2


def test_snmp_energy_counter_integrates_to_its_difference(pdu, monkeypatch, tmp_path):
    monkeypatch.setenv("THERMAB_TEST_COMMUNITY", "pdu")
    meter = snmp_meter(pdu, community_env="THERMAB_TEST_COMMUNITY")
    snmp = wall_meters.reader(meter)
    rows, counters = [], []
    try:
        for _ in range(6):
            _t, polled = wall_poll.poll_once(meter, snmp)
            rows += polled
            counters.append(float(next(r for r in polled if r[1].startswith("wall-0 mJ:max="))[2]) / 1000)
            time.sleep(0.3)
    finally:
        snmp.close()
    joules, t = integrated(tmp_path, rows)
    assert joules == pytest.approx(counter_over_span(counters), rel=0.01)
    assert joules / (t[-1] - t[0]) == pytest.approx(RATE_W, rel=0.05), "the counter grows at its rate"


# -- Redfish: sushy-static over TLS ----------------------------------------------------------


def self_signed(directory: Path) -> tuple[Path, Path, str]:
    """(certificate, key, its SHA-256 fingerprint) for 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bmc.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "bmc.pem", directory / "bmc.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    fingerprint = hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).hexdigest()
    return cert_path, key_path, ":".join(fingerprint[i : i + 2] for i in range(0, 64, 2))


def write_resource(mockup: Path, path: str, doc: dict) -> None:
    directory = mockup / path
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / "index.json.tmp"
    temporary.write_text(json.dumps(doc))
    temporary.replace(directory / "index.json")  # the server reads each request's file whole


def environment(watts: float, kwh: float) -> dict:
    return {
        "@odata.id": "/redfish/v1/Chassis/1/EnvironmentMetrics",
        "PowerWatts": {"Reading": watts, "DataSourceUri": "/redfish/v1/Chassis/1/Sensors/TotalPower"},
        "EnergykWh": {"Reading": kwh},
    }


@pytest.fixture(scope="module")
def bmc(tmp_path_factory):
    """sushy-static over TLS on a free port, serving a mockup with chassis 1 (EnvironmentMetrics)
    and chassis 2 (the older Power resource only)."""
    command = server_command("sushy-static")
    work = tmp_path_factory.mktemp("bmc")
    mockup = work / "mockup"
    write_resource(mockup, "", {"@odata.id": "/redfish/v1", "Chassis": {"@odata.id": "/redfish/v1/Chassis"}})
    write_resource(mockup, "Chassis/1", {"@odata.id": "/redfish/v1/Chassis/1", "Id": "1"})
    write_resource(mockup, "Chassis/1/EnvironmentMetrics", environment(412.0, 1.0))
    write_resource(
        mockup, "Chassis/2/Power", {"PowerControl": [{"PowerConsumedWatts": 344}, {"PowerConsumedWatts": 9}]}
    )
    cert, key, fingerprint = self_signed(work)
    port = free_port()
    log = work / "sushy.log"

    def answers() -> bool:
        try:
            return wall_meters.probe(bmc_meter(port, fingerprint_sha256=fingerprint)) is None
        except MeterError:
            return False

    process = started(
        [command, "--interface", "127.0.0.1", "--port", str(port), "--mockup-files", mockup, "-c", cert, "-k", key],
        log,
        answers,
        "sushy-static",
    )
    try:
        yield {"port": port, "mockup": mockup, "cert": cert, "fingerprint": fingerprint, "log": log}
    finally:
        stop(process)


def bmc_meter(port: int, **settings) -> Meter:
    return Meter("head", 0, {"kind": "redfish", "url": f"https://127.0.0.1:{port}", "timeout_s": 2.0, **settings})


def test_redfish_over_tls_checks_the_certificate_before_the_password(bmc, monkeypatch):
    monkeypatch.setenv("THERMAB_TEST_BMC", "bmc-s3cret")
    login = {"user": "admin", "password_env": "THERMAB_TEST_BMC"}
    port = bmc["port"]
    by_ca = wall_meters.reader(bmc_meter(port, ca_file=str(bmc["cert"]), **login))
    assert by_ca.read() == (412.0, pytest.approx(3.6e6), None)
    pinned = wall_meters.reader(bmc_meter(port, fingerprint_sha256=bmc["fingerprint"], **login))
    assert pinned.read().watts == 412.0
    older = wall_meters.reader(bmc_meter(port, chassis="2", fingerprint_sha256=bmc["fingerprint"]))
    assert older.read() == (344.0, None, None), "the older Power resource, its first PowerControl"
    before = bmc["log"].read_text(errors="replace").count("Authorization")
    wrong = bmc_meter(port, fingerprint_sha256="00" * 32, **login)
    assert "not the pinned fingerprint" in wall_meters.probe(wrong)
    unverified = wall_meters.probe(bmc_meter(port, **login))  # a self-signed certificate, no CA given
    assert unverified.startswith(f"host head: wall meter redfish https://127.0.0.1:{port}: TLS:")
    session = wall_meters.probe(bmc_meter(port, auth="session", fingerprint_sha256=bmc["fingerprint"], **login))
    assert "the session was refused" in session, "a mockup server makes no session"
    assert bmc["log"].read_text(errors="replace").count("Authorization") == before, "no password to a wrong peer"
    for problem in (unverified, session):
        assert "bmc-s3cret" not in problem


def test_redfish_energy_counter_integrates_to_its_difference(bmc, tmp_path):
    meter = bmc_meter(bmc["port"], fingerprint_sha256=bmc["fingerprint"])
    redfish = wall_meters.reader(meter)
    rows, counters = [], []
    kwh = 12.0
    for step, watts in enumerate([400.0, 520.0, 610.0, 450.0, 480.0, 700.0]):  # 60 s of model time apart
        write_resource(bmc["mockup"], "Chassis/1/EnvironmentMetrics", environment(watts, round(kwh, 6)))
        clock = iter([1000.0 + 60 * step] * 2)
        _t, polled = wall_poll.poll_once(meter, redfish, clock=lambda clock=clock: next(clock))
        rows += polled
        counters.append(float(next(r for r in polled if r[1] == "wall-0 mJ")[2]) / 1000)
        kwh += watts * 60 / 3.6e6
    joules, _t = integrated(tmp_path, rows)
    assert joules == pytest.approx(counter_over_span(counters), rel=0.01)
