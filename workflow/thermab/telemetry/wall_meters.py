"""Meters outside the host, read by the controller: a BMC over Redfish, a PDU outlet over
SNMP, a Shelly or Tasmota smart plug, a Prometheus query (docs/power.md, "At the wall").

Each kind has one reader: ``read()`` returns a :class:`Reading` (watts, and joules of the
meter's energy counter where it has one) or raises :class:`MeterError`, one line naming the
kind and where, never a credential.  The JSON APIs go over the standard library's
http.client (TLS checked against a CA file or a pinned certificate fingerprint before a
credential is sent); SNMP over pysnmp.  Credentials come from the environment variable or
the file the config names (``password_env``, ``password_file``, ``community_env`` …), read
when a reader is made; the config, run.json and the meters' record hold their names only.

The parsers of each answer are pure functions; :mod:`thermab.telemetry.wall_poll` polls the
readers during a run and writes their rows."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import math
import os
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from thermab.config import thaw
from thermab.contracts import MeterRecord
from thermab.errors import HostError
from thermab.telemetry.agent import plausible_watts

KINDS = ("redfish", "shelly", "tasmota", "prometheus", "snmp")
DOMAIN = "wall"  # a host's meters are its domains wall-0, wall-1 … (scope wall)
SIM_PLUG_FILE = "run/plug.url"  # where a simulated node's plug writes its URL (thermab.sim.plug)
J_PER_WH = 3600.0


class MeterError(HostError):
    """A meter did not give a reading: one line naming the meter, never a credential."""


class Reading(NamedTuple):
    watts: float | None
    energy_j: float | None = None  # the meter's energy counter, where it has one
    wrap_j: float | None = None  # where the counter wraps to 0 (an SNMP Counter32), else None


@dataclass(frozen=True)
class Meter:
    """One meter of one host, as the config gives it (``settings``: the keys of its entry in
    ``hosts.<name>.wall_meters``, with the schema's defaults)."""

    host: str
    index: int
    settings: Mapping = field(repr=False)
    sim_root: Path | None = None  # a simulated node's plug: its URL is read from the node's tree

    @property
    def kind(self) -> str:
        return self.settings["kind"]

    @property
    def domain(self) -> str:
        return f"{DOMAIN}-{self.index}"

    @property
    def feeds(self) -> tuple[str, ...]:
        return tuple(self.settings.get("feeds") or (self.host,))

    @property
    def where(self) -> str:
        """The meter's address for messages and records: its URL, or ``snmp://host:port``
        (no credential is ever part of either)."""
        if self.kind == "snmp":
            return f"snmp://{self.settings['host']}:{self.settings.get('port', 161)}"
        if self.sim_root is not None:
            return "the simulated node's plug"
        return self.settings["url"]

    def url(self) -> str:
        if self.sim_root is None:
            return self.settings["url"]
        try:
            return (self.sim_root / SIM_PLUG_FILE).read_text().strip()
        except OSError as error:
            raise MeterError(f"{self.name}: the simulated plug is not up ({error.strerror})") from None

    @property
    def name(self) -> str:
        return f"host {self.host}: wall meter {self.kind} {self.where}"

    def record(self) -> MeterRecord:
        """What monitor/wall.json keeps of the meter: no credential, only where it is."""
        return {
            "host": self.host,
            "domain": self.domain,
            "kind": self.kind,
            "where": self.where,
            "feeds": list(self.feeds),
            "interval_s": self.settings.get("interval_s", 1.0),
            "update_s": self.settings.get("update_s"),
            "simulated": self.sim_root is not None,
        }


def meters_of(host: str, settings: Mapping, sim_root: Path | None = None) -> list[Meter]:
    """A host's meters from its config entry; a simulated host without ``wall_meters`` has
    its simulated plug (a Shelly Gen2 plug, thermab.sim.plug)."""
    if "wall_meters" in settings:
        return [Meter(host, i, thaw(entry)) for i, entry in enumerate(settings["wall_meters"])]
    if settings.get("simulated") and sim_root is not None:
        return [Meter(host, 0, {"kind": "shelly", "channel": 0, "interval_s": 1.0, "update_s": 1.0}, sim_root)]
    return []


def secret(meter: Meter, name: str) -> str | None:
    """The credential ``name`` (password, community, auth_key, priv_key) from the variable
    ``<name>_env`` or the file ``<name>_file`` names; None where the config names neither."""
    settings = meter.settings
    if f"{name}_env" in settings:
        variable = settings[f"{name}_env"]
        value = os.environ.get(variable)
        if value is None:
            raise MeterError(f"{meter.name}: the environment variable {variable} ({name}_env) is not set")
        return value
    if f"{name}_file" in settings:
        try:
            return Path(settings[f"{name}_file"]).expanduser().read_text().strip()
        except OSError as error:
            raise MeterError(f"{meter.name}: {name}_file {settings[f'{name}_file']}: {error.strerror}") from None
    return None


# -- the answers of each kind, parsed (pure) ------------------------------------------------


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is not a number ({str(value)[:40]!r})")
    return float(value)


def shelly_reading(doc: dict) -> Reading:
    """Shelly Gen2+ ``Switch.GetStatus``: ``apower`` (W), ``aenergy.total`` (Wh)."""
    total = (doc.get("aenergy") or {}).get("total")
    return Reading(
        _number(doc.get("apower"), "apower"), None if total is None else _number(total, "aenergy.total") * J_PER_WH
    )


def tasmota_reading(doc: dict) -> Reading:
    """Tasmota ``Status 10``: ``StatusSNS.ENERGY.Power`` (W), ``ENERGY.Total`` (kWh)."""
    energy = (doc.get("StatusSNS") or {}).get("ENERGY") or {}
    power = energy.get("Power")
    if isinstance(power, list):  # a plug of several channels reports one power each: the sum
        power = sum(_number(p, "ENERGY.Power") for p in power)
    total = energy.get("Total")
    return Reading(
        _number(power, "ENERGY.Power"), None if total is None else _number(total, "ENERGY.Total") * 1000 * J_PER_WH
    )


def redfish_environment_reading(doc: dict) -> Reading:
    """Redfish ``Chassis/{id}/EnvironmentMetrics``: ``PowerWatts.Reading`` (W),
    ``EnergykWh.Reading`` (kWh)."""
    energy = (doc.get("EnergykWh") or {}).get("Reading")
    return Reading(
        _number((doc.get("PowerWatts") or {}).get("Reading"), "PowerWatts.Reading"),
        None if energy is None else _number(energy, "EnergykWh.Reading") * 1000 * J_PER_WH,
    )


def redfish_power_reading(doc: dict) -> Reading:
    """The older Redfish ``Chassis/{id}/Power``: ``PowerControl[0].PowerConsumedWatts``, the
    chassis's total (a later entry is a part of it, never added)."""
    controls = doc.get("PowerControl") or []
    if not controls:
        raise ValueError("PowerControl is empty")
    return Reading(_number(controls[0].get("PowerConsumedWatts"), "PowerControl[0].PowerConsumedWatts"))


def prometheus_value(doc: dict) -> float:
    """The one sample of an instant query's answer (``/api/v1/query``)."""
    if doc.get("status") != "success":
        raise ValueError(f"status {doc.get('status')!r}: {str(doc.get('error'))[:80]}")
    data = doc.get("data") or {}
    if data.get("resultType") == "scalar":
        return float(data["result"][1])
    result = data.get("result") or []
    if len(result) != 1:
        raise ValueError(f"the query gives {len(result)} series, not one")
    return float(result[0]["value"][1])


def checked(meter: Meter, reading: Reading) -> tuple[Reading, list[str]]:
    """The reading with what is no reading left out (negative, not finite, beyond the wall
    scope's bound), and why each value was left out."""
    reasons = []
    watts, energy = reading.watts, reading.energy_j
    if watts is not None:
        if not math.isfinite(watts):
            watts, reason = None, f"not a finite number: {watts}"
        else:
            watts, reason = plausible_watts(meter.domain, watts)
        if reason:
            reasons.append(reason)
    if energy is not None and not (math.isfinite(energy) and energy >= 0):
        reasons.append(f"energy counter not a count: {energy}")
        energy = None
    return reading._replace(watts=watts, energy_j=energy), reasons


# -- HTTP, with TLS checked before a credential is sent ----------------------------------------


def tls_context(meter: Meter) -> ssl.SSLContext:
    """Verification against the config's CA file, else the system's; a pinned fingerprint
    replaces the chain check by the certificate's own hash (checked in :func:`request`)."""
    if "fingerprint_sha256" in meter.settings:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    try:
        return ssl.create_default_context(cafile=meter.settings.get("ca_file"))
    except (OSError, ssl.SSLError) as error:
        raise MeterError(f"{meter.name}: ca_file {meter.settings.get('ca_file')}: {error}") from None


def request(
    meter: Meter, method: str, path: str, headers: dict | None = None, body: bytes | None = None, url: str = ""
) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request to the meter; ``path`` below its URL."""
    base = urllib.parse.urlsplit(url or meter.url())
    timeout = float(meter.settings.get("timeout_s", 3.0))
    if base.scheme == "https":
        connection = http.client.HTTPSConnection(base.hostname, base.port, timeout=timeout, context=tls_context(meter))
    else:
        connection = http.client.HTTPConnection(base.hostname, base.port, timeout=timeout)
    try:
        connection.connect()
        pinned = meter.settings.get("fingerprint_sha256")
        if pinned and base.scheme == "https":
            seen = hashlib.sha256(connection.sock.getpeercert(binary_form=True)).hexdigest()
            if seen != pinned.replace(":", "").lower():
                raise MeterError(f"{meter.name}: the certificate's sha256 is {seen}, not the pinned fingerprint")
        connection.request(method, base.path.rstrip("/") + path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read(1 << 20)
    except ssl.SSLError as error:
        raise MeterError(f"{meter.name}: TLS: {error.reason or error}") from None
    except (OSError, http.client.HTTPException) as error:
        raise MeterError(f"{meter.name}: does not answer ({type(error).__name__}: {error})") from None
    finally:
        connection.close()


def get_json(meter: Meter, path: str, headers: dict | None = None) -> dict:
    status, _headers, body = request(meter, "GET", path, headers)
    if status != 200:
        raise MeterError(f"{meter.name}: HTTP {status} for {path.split('?')[0]}")
    try:
        doc = json.loads(body)
    except ValueError:
        raise MeterError(f"{meter.name}: {path.split('?')[0]} did not answer JSON") from None
    if not isinstance(doc, dict):
        raise MeterError(f"{meter.name}: {path.split('?')[0]} did not answer a JSON object")
    return doc


def _parsed(meter: Meter, parse, doc) -> Reading:
    try:
        return parse(doc)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as error:
        raise MeterError(f"{meter.name}: unexpected answer: {error}") from None


# -- the readers -------------------------------------------------------------------------------


class ShellyReader:
    def __init__(self, meter: Meter):
        self.meter = meter

    def read(self) -> Reading:
        doc = get_json(self.meter, f"/rpc/Switch.GetStatus?id={int(self.meter.settings.get('channel', 0))}")
        return _parsed(self.meter, shelly_reading, doc)

    def close(self) -> None:
        pass


class TasmotaReader:
    def __init__(self, meter: Meter):
        self.meter = meter
        password = secret(meter, "password")
        self.query = {"cmnd": "Status 10"}
        if meter.settings.get("user") and password is not None:
            self.query.update(user=meter.settings["user"], password=password)

    def read(self) -> Reading:
        # the query carries the password where one is set: no message shows the path
        return _parsed(self.meter, tasmota_reading, get_json(self.meter, "/cm?" + urllib.parse.urlencode(self.query)))

    def close(self) -> None:
        pass


class PrometheusReader:
    def __init__(self, meter: Meter):
        self.meter = meter

    def _query(self, promql: str) -> float:
        doc = get_json(self.meter, "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        return _parsed(self.meter, prometheus_value, doc)

    def read(self) -> Reading:
        energy = self.meter.settings.get("energy_query")
        return Reading(self._query(self.meter.settings["query"]), None if energy is None else self._query(energy))

    def close(self) -> None:
        pass


class RedfishReader:
    """EnvironmentMetrics where the BMC has it (Redfish 2020.4 on), else the older Power
    resource; basic auth on every request, or a session (X-Auth-Token) made once, made
    again when the BMC drops it, and deleted at close."""

    def __init__(self, meter: Meter):
        self.meter = meter
        self.user = meter.settings.get("user")
        self.password = secret(meter, "password")
        if self.user and self.password is None:
            raise MeterError(f"{meter.name}: user {self.user} has no password_env or password_file")
        self.token: str | None = None
        self.session: str | None = None
        self.resource: str | None = None  # the one that answered first
        chassis = urllib.parse.quote(meter.settings.get("chassis", "1"))
        self.resources = {
            f"/redfish/v1/Chassis/{chassis}/EnvironmentMetrics": redfish_environment_reading,
            f"/redfish/v1/Chassis/{chassis}/Power": redfish_power_reading,
        }

    def _headers(self) -> dict:
        if not self.user:
            return {}
        if self.meter.settings.get("auth", "basic") == "basic":
            pair = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            return {"Authorization": f"Basic {pair}"}
        if self.token is None:
            self._log_in()
        return {"X-Auth-Token": self.token}

    def _log_in(self) -> None:
        body = json.dumps({"UserName": self.user, "Password": self.password}).encode()
        status, headers, _ = request(
            self.meter, "POST", "/redfish/v1/SessionService/Sessions", {"Content-Type": "application/json"}, body
        )
        if status not in (200, 201) or "x-auth-token" not in headers:
            raise MeterError(f"{self.meter.name}: the session was refused (HTTP {status})")
        self.token, self.session = headers["x-auth-token"], headers.get("location")

    def read(self) -> Reading:
        for path in [self.resource] if self.resource else list(self.resources):
            status, _h, body = request(self.meter, "GET", path, self._headers())
            if status == 401 and self.token is not None:  # the BMC dropped the session: once more
                self.token = None
                status, _h, body = request(self.meter, "GET", path, self._headers())
            if status == 404 and self.resource is None:
                continue
            if status != 200:
                raise MeterError(f"{self.meter.name}: HTTP {status} for {path}")
            self.resource = path
            try:
                doc = json.loads(body)
            except ValueError:
                raise MeterError(f"{self.meter.name}: {path} did not answer JSON") from None
            return _parsed(self.meter, self.resources[path], doc)
        raise MeterError(f"{self.meter.name}: the chassis has neither EnvironmentMetrics nor Power")

    def close(self) -> None:
        if self.token and self.session:
            base = urllib.parse.urlsplit(self.meter.url())
            try:  # the session's Location, from the BMC's root
                request(
                    self.meter,
                    "DELETE",
                    urllib.parse.urlsplit(self.session).path,
                    {"X-Auth-Token": self.token},
                    url=f"{base.scheme}://{base.netloc}",
                )
            except MeterError:
                pass  # the BMC ends an unused session itself
        self.token = None


SNMP_KEY_MIN = 8
SNMP_AUTH = {
    "MD5": "usmHMACMD5AuthProtocol",
    "SHA": "usmHMACSHAAuthProtocol",
    "SHA224": "usmHMAC128SHA224AuthProtocol",
    "SHA256": "usmHMAC192SHA256AuthProtocol",
    "SHA384": "usmHMAC256SHA384AuthProtocol",
    "SHA512": "usmHMAC384SHA512AuthProtocol",
}
SNMP_PRIV = {
    "DES": "usmDESPrivProtocol",
    "AES": "usmAesCfb128Protocol",
    "AES192": "usmAesCfb192Protocol",
    "AES256": "usmAesCfb256Protocol",
}


class SnmpReader:
    """One GET of the power OID (and the energy OID) per read, v2c or v3, over pysnmp's
    asyncio API on an event loop of the reader's own."""

    def __init__(self, meter: Meter):
        import asyncio

        try:
            from pysnmp.hlapi.v3arch import asyncio as snmp
        except ImportError:
            raise MeterError(f"{meter.name}: pysnmp is not installed (pip install pysnmp)") from None

        self.meter, self.snmp = meter, snmp
        settings = meter.settings
        if settings.get("version", "2c") == "2c":
            community = secret(meter, "community")
            if community is None:
                raise MeterError(f"{meter.name}: SNMP v2c needs community_env or community_file")
            self.auth = snmp.CommunityData(community, mpModel=1)
        else:
            auth_key, priv_key = secret(meter, "auth_key"), secret(meter, "priv_key")
            for name, key in (("auth_key", auth_key), ("priv_key", priv_key)):
                if key is not None and len(key) < SNMP_KEY_MIN:  # RFC 3414's passphrases: the agent refuses shorter
                    raise MeterError(f"{meter.name}: the {name} is shorter than {SNMP_KEY_MIN} characters")
            self.auth = snmp.UsmUserData(
                settings["user"],
                authKey=auth_key,
                privKey=priv_key,
                authProtocol=getattr(snmp, SNMP_AUTH[settings.get("auth_protocol", "SHA")])
                if auth_key
                else snmp.usmNoAuthProtocol,
                privProtocol=getattr(snmp, SNMP_PRIV[settings.get("priv_protocol", "AES")])
                if priv_key
                else snmp.usmNoPrivProtocol,
            )
        self.loop = asyncio.new_event_loop()
        self.engine = snmp.SnmpEngine()
        self.oids = [settings["oid_power"].lstrip(".")] + (
            [settings["oid_energy"].lstrip(".")] if "oid_energy" in settings else []
        )

    async def _get(self):
        snmp, settings = self.snmp, self.meter.settings
        target = await snmp.UdpTransportTarget.create(
            (settings["host"], int(settings.get("port", 161))), timeout=float(settings.get("timeout_s", 3.0)), retries=0
        )
        return await snmp.get_cmd(
            self.engine,
            self.auth,
            target,
            snmp.ContextData(contextName=settings.get("context", "")),
            *(snmp.ObjectType(snmp.ObjectIdentity(oid)) for oid in self.oids),
        )

    def read(self) -> Reading:
        try:
            indication, status, _index, bindings = self.loop.run_until_complete(self._get())
        except Exception as error:  # pysnmp raises its own kinds for an unresolvable host, a bad key
            raise MeterError(f"{self.meter.name}: {type(error).__name__}: {str(error)[:120]}") from None
        if indication:
            raise MeterError(f"{self.meter.name}: does not answer ({indication})")
        if status:
            raise MeterError(f"{self.meter.name}: {status.prettyPrint()}")
        values, wraps = [], []
        for oid, value in bindings:
            wraps.append(2.0**32 if isinstance(value, self.snmp.Counter32) else None)  # 64 bits never wrap
            try:
                values.append(float(value))
            except (TypeError, ValueError):
                shown = value.prettyPrint()[:40]
                raise MeterError(f"{self.meter.name}: {oid.prettyPrint()} is no number ({shown})") from None
        settings = self.meter.settings
        watts = values[0] * float(settings.get("power_scale", 1.0))
        if len(values) < 2:
            return Reading(watts)
        scale = float(settings.get("energy_scale", J_PER_WH))
        return Reading(watts, values[1] * scale, None if wraps[1] is None else wraps[1] * scale)

    def close(self) -> None:
        import asyncio

        self.engine.close_dispatcher()
        pending = asyncio.all_tasks(self.loop)  # the dispatcher's timer, cancelled: ended before the loop
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.wait(pending))
        self.loop.close()


READERS = {
    "redfish": RedfishReader,
    "shelly": ShellyReader,
    "tasmota": TasmotaReader,
    "prometheus": PrometheusReader,
    "snmp": SnmpReader,
}


def reader(meter: Meter):
    """The reader of the meter's kind (credentials read here; MeterError where one is missing,
    or where the library refuses one: an SNMPv3 key shorter than 8 characters)."""
    try:
        return READERS[meter.kind](meter)
    except MeterError:
        raise
    except Exception as error:  # pysnmp's own kinds; its messages name no key
        raise MeterError(f"{meter.name}: {type(error).__name__}: {str(error)[:120]}") from None


def probe(meter: Meter) -> str | None:
    """None where the meter gives a reading now, else the one line that says why not."""
    try:
        meter_reader = reader(meter)
        try:
            meter_reader.read()
        finally:
            meter_reader.close()
    except MeterError as error:
        return str(error)
    return None
