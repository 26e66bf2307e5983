"""Meters outside the host (telemetry/wall_meters.py, wall_poll.py): each kind's answer
parsed, what is no reading left out with its reason, the poller's rows read by ingest on the
controller's clock, the wall scope at the top of the power tree, the config's checks, and
the simulated node's plug read over HTTP as a Shelly Gen2 plug."""

import csv
import math

import numpy as np
import pandas as pd
import pytest

from thermab.analysis import energy, wall_gaps
from thermab.config import ConfigError, load
from thermab.report import evidence
from thermab.sim import node, plug, power_meters as sim_power
from thermab.telemetry import ingest, power, wall_meters, wall_poll
from thermab.telemetry.wall_meters import Meter, MeterError, Reading

CONFIG = "config/config.yaml"


def test_each_kind_answer_parsed_to_watts_and_joules():
    shelly = {"id": 0, "apower": 8.9, "aenergy": {"total": 6.532, "by_minute": [1, 2, 3]}}
    assert wall_meters.shelly_reading(shelly) == Reading(8.9, pytest.approx(6.532 * 3600))
    tasmota = {"StatusSNS": {"ENERGY": {"Power": 120, "Total": 1.5, "Today": 0.2}}}
    assert wall_meters.tasmota_reading(tasmota) == Reading(120.0, pytest.approx(1.5 * 3.6e6))
    two_channels = {"StatusSNS": {"ENERGY": {"Power": [40, 60]}}}
    assert wall_meters.tasmota_reading(two_channels) == Reading(100.0, None)
    environment = {"PowerWatts": {"Reading": 412.5}, "EnergykWh": {"Reading": 12.25}}
    assert wall_meters.redfish_environment_reading(environment) == Reading(412.5, pytest.approx(12.25 * 3.6e6))
    old = {"PowerControl": [{"PowerConsumedWatts": 344}, {"PowerConsumedWatts": 100}]}
    assert wall_meters.redfish_power_reading(old) == Reading(344.0, None), "a later entry is a part, never added"
    vector = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "97.5"]}]}}
    assert wall_meters.prometheus_value(vector) == 97.5
    assert (
        wall_meters.prometheus_value({"status": "success", "data": {"resultType": "scalar", "result": [1, "3"]}}) == 3
    )
    two = {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "1"]}, {"value": [1, "2"]}]}}
    with pytest.raises(ValueError, match="2 series, not one"):
        wall_meters.prometheus_value(two)
    with pytest.raises(ValueError, match="apower is not a number"):
        wall_meters.shelly_reading({"apower": "on"})


def test_no_reading_is_left_out_with_its_reason():
    meter = Meter("head", 0, {"kind": "shelly", "url": "http://plug"})
    for watts, why in ((-3.0, "implausible"), (math.nan, "not a finite"), (math.inf, "not a finite"), (6e4, "bound")):
        reading, reasons = wall_meters.checked(meter, Reading(watts, 100.0))
        assert reading == Reading(None, 100.0) and why in reasons[0]
    reading, reasons = wall_meters.checked(meter, Reading(50.0, -1.0))
    assert reading == Reading(50.0, None) and "energy counter" in reasons[0]
    rows = wall_poll.reading_rows(meter, 10.0, *wall_meters.checked(meter, Reading(-3.0, None)))
    assert rows == [["10.000", "wall-0 W", "", rows[0][3]]] and "implausible for a wall domain" in rows[0][3]


def test_credentials_are_read_from_the_named_variable_or_file_and_never_shown(tmp_path, monkeypatch):
    monkeypatch.setenv("THERMAB_TEST_BMC", "s3cret")
    meter = Meter(
        "head", 0, {"kind": "redfish", "url": "https://bmc", "user": "admin", "password_env": "THERMAB_TEST_BMC"}
    )
    assert wall_meters.secret(meter, "password") == "s3cret"
    (tmp_path / "pw").write_text("filed\n")
    filed = Meter("head", 0, {"kind": "tasmota", "url": "http://plug", "password_file": str(tmp_path / "pw")})
    assert wall_meters.secret(filed, "password") == "filed"
    missing = Meter("head", 0, {"kind": "redfish", "url": "https://bmc", "user": "a", "password_env": "THERMAB_NOPE"})
    with pytest.raises(MeterError, match="THERMAB_NOPE"):
        wall_meters.reader(missing)
    # a meter that does not answer is one line naming host, kind and URL, and no password
    monkeypatch.setenv("THERMAB_TEST_BMC", "s3cret")
    closed = Meter("head", 0, {**meter.settings, "url": "http://127.0.0.1:9", "timeout_s": 0.5})
    problem = wall_meters.probe(closed)
    assert problem.startswith("host head: wall meter redfish http://127.0.0.1:9: does not answer")
    assert "s3cret" not in problem and "\n" not in problem


def test_poller_rows_are_power_on_the_controllers_clock_and_the_counter_wins(tmp_path):
    meter = Meter("head", 0, {"kind": "shelly", "url": "http://plug"})
    path = tmp_path / "monitor/head/wall.csv"
    out = wall_poll.HostFile(path)
    for second, joules in enumerate([0.0, 100.0, 200.0, 260.0, 5.0, 105.0]):  # 100 W, 60 W, a reset, 100 W
        out.write(wall_poll.reading_rows(meter, 1000.0 + second, Reading(80.0, joules), []))
    out.write(wall_poll.failed_rows(meter, 1006.0, "host head: wall meter shelly http://plug: does not answer"))
    tidy, dropped = ingest.telemetry(tmp_path / "monitor", {"head": 7.0})  # the agents' offset is not the poller's
    watts = tidy[tidy["sensor"] == "wall-0"]
    assert watts["value"].round(6).tolist() == [100.0, 100.0, 60.0, 100.0]
    assert watts["t"].tolist() == [1000.5, 1001.5, 1002.5, 1004.5]
    reset = "head/power: wall-0 counter went back (reset) or implied watts outside 0-50000 W, interval skipped"
    assert dropped[reset] == 1
    assert dropped["head/power: wall-0 W readings not used (its energy counter is)"] == 6
    assert dropped["head/power: host head: wall meter shelly http://plug: does not answer"] == 1


def test_a_wall_meter_holds_the_host_and_makes_its_total():
    domains = ["gpu0", "package-0", "package-0/core", "wall-0", "wall-1"]
    assert power.host_total_domains(domains) == ["wall-0", "wall-1"], "two supplies' meters are summed"
    assert power.container("gpu0", domains) == "wall-0 + wall-1"
    assert power.container("package-0/core", domains) == "package-0", "a sub-domain stays in its parent"
    assert power.container("wall-0", domains) is None
    summed, scopes, holds = power.total_scope(["gpu0", "wall-0"])
    assert (summed, scopes) == (["wall-0"], ["wall"]) and "cpu" in holds and "the power supply's loss" in holds


def write_config(tmp_path, meters: str):
    path = tmp_path / "meters.yaml"
    path.write_text("clusters:\n  sim:\n    hosts:\n      head:\n        wall_meters:\n" + meters)
    return [CONFIG, str(path)]


@pytest.mark.parametrize(
    "meters, says",
    [
        ("          - {kind: shelly, url: 'http://plug', colour: red}\n", "wall_meters.0.colour': unknown key"),
        ("          - {kind: prometheus, url: 'http://prom:9090'}\n", "wall_meters.0.query': required but missing"),
        ("          - {kind: plug, url: 'http://plug'}\n", "wall_meters.0.kind': 'plug' is not one of"),
        ("          - {kind: shelly, url: 'http://a:b@plug'}\n", "wall_meters.0.url'"),
        (
            "          - {kind: redfish, url: 'http://bmc', user: admin, password_env: BMC}\n",
            "wall_meters.0.url': a BMC's password is not sent over plain http",
        ),
        ("          - {kind: redfish, url: 'https://bmc', user: admin}\n", "a user and a password go together"),
        ("          - {kind: snmp, host: pdu, oid_power: '1.3.6.1.4.1'}\n", "v2c needs community_env"),
        ("          - {kind: snmp, host: pdu, oid_power: '1.3.6', version: '3'}\n", "SNMP v3 needs a user"),
        ("          - {kind: shelly, url: 'http://plug', feeds: [head, nope]}\n", "'nope' is not a host"),
        ("          - {kind: shelly, url: 'http://plug', feeds: [worker]}\n", "its own host among them"),
        ("          - {kind: shelly, url: 'http://plug', interval_s: .nan}\n", "interval_s"),
    ],
)
def test_check_config_names_the_meters_key(tmp_path, meters, says):
    with pytest.raises(ConfigError) as error:
        load(write_config(tmp_path, meters))
    assert says in str(error.value)


def test_a_valid_meter_gets_its_kinds_defaults(tmp_path):
    config = load(write_config(tmp_path, "          - {kind: redfish, url: 'https://bmc'}\n"))
    meter = config["clusters"]["sim"]["hosts"]["head"]["wall_meters"][0]
    assert meter == {
        "kind": "redfish",
        "url": "https://bmc",
        "chassis": "1",
        "auth": "basic",
        "interval_s": 1,
        "timeout_s": 3,
        "update_s": 5,
    }


def test_the_simulated_plug_answers_as_a_shelly_and_its_counter_integrates_to_its_power(tmp_path):
    """The node's plug over real HTTP: Δcounter/Δt from ingest, integrated over the window,
    equals the counter's difference within 1 % (the power varies from step to step)."""
    node.create_node(tmp_path, "head")
    meter_model = sim_power.PowerMeter(tmp_path, node.load_settings(tmp_path)["power"], node.write_atomic)
    server = plug.serve(tmp_path, meter_model)
    try:
        meter = wall_meters.meters_of("head", {"simulated": "head"}, tmp_path)[0]
        assert meter.url().startswith("http://127.0.0.1:")
        shelly = wall_meters.reader(meter)
        times, counters, rows = [], [], []
        for step, (cpu, gpu) in enumerate([(0, 0), (2, 0.5), (4, 1.0), (1, 0.2), (3, 0.9), (0.5, 0.1), (2, 1)]):
            clock = iter([1000.0 + 30 * step, 1000.0 + 30 * step])  # a model clock: 30 s between polls
            t, polled = wall_poll.poll_once(meter, shelly, clock=lambda clock=clock: next(clock))
            rows += polled
            times.append(t)
            counters.append(float(next(r for r in polled if r[1] == "wall-0 mJ")[2]) / 1000)
            meter_model.advance(cpu, gpu, 30.0)
        assert float(rows[0][2]) == pytest.approx(sim_power.watts(meter_model.model, 0, 0)["wall"], abs=0.05)
    finally:
        server.shutdown()
    path = tmp_path / "monitor/head/wall.csv"
    path.parent.mkdir(parents=True)
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows([wall_poll.HEADER, *rows])
    tidy, _ = ingest.telemetry(tmp_path / "monitor", {"head": 0.0})
    watts = tidy[tidy["sensor"] == "wall-0"]
    t, value = watts["t"].to_numpy(), watts["value"].to_numpy()
    integrated = power.time_weighted_mean(t, value) * (t[-1] - t[0])
    # the counter over the same span: half the first interval, the middle ones, half the last
    steps = np.diff(counters)
    expected = steps[0] / 2 + steps[1:-1].sum() + steps[-1] / 2
    assert integrated == pytest.approx(expected, rel=0.01)


def power_rows(host, domain, times, watts):
    return pd.DataFrame(
        {"t": np.asarray(times, float), "host": host, "kind": "power", "sensor": domain, "value": watts}
    )


WINDOWS = pd.DataFrame(
    {"order": "AB", "rep": [1, 1], "arm": ["A", "B"], "load_start": [100.0, 300.0], "load_end": [160.0, 360.0]}
).assign(window_s=60.0)


def test_energy_per_token_at_the_wall_and_on_board_side_by_side():
    seconds = np.arange(0.0, 400.0, 1.0)
    telemetry = pd.concat(
        [
            power_rows("head", "wall-0", seconds, 200.0),
            power_rows("head", "gpu0", seconds, 120.0),  # a GB10: its GPU alone on board
            power_rows("worker", "wall-0", seconds, 150.0),
            power_rows("worker", "package-0", seconds, 60.0),
            power_rows("worker", "dram-0", seconds, 10.0),
        ],
        ignore_index=True,
    )
    table = energy.energy_table(telemetry, WINDOWS, pd.DataFrame(), None, ["head", "worker"])
    rows = table.set_index(["arm", "host", "domain"])
    assert rows.loc[("A", "all", "total"), "mean_w"] == pytest.approx(350.0), "the walls, never the boards beside"
    assert rows.loc[("A", "all", "onboard"), "mean_w"] == pytest.approx(190.0)
    assert rows.loc[("A", "all", "total"), "scope"] == "head: wall; worker: wall"
    assert rows.loc[("A", "all", "onboard"), "scope"] == "head: gpu; worker: cpu + dram"
    assert rows.loc[("A", "head", "gpu0"), "scope"] == "gpu in wall-0"
    said = "\n".join(evidence.energy_scope(table))
    assert "head: at the wall (wall-0), on board gpu" in said and "leaves out the CPU" not in said
    recomputed = energy.energy_table(
        telemetry[telemetry["sensor"] != "wall-0"], WINDOWS, pd.DataFrame(), None, ["head", "worker"]
    )
    assert "onboard" not in set(recomputed["domain"]), "no wall meter: one total, as before"
    assert "**Energy per token leaves out the CPU of head (gpu)**" in "\n".join(evidence.energy_scope(recomputed))


def test_a_wall_meter_silent_in_a_window_is_named_in_that_phases_validity():
    seconds = np.arange(0.0, 400.0, 1.0)
    silent = seconds[(seconds < 320.0) | (seconds >= 335.0)]  # 15 s without a reading in phase B
    telemetry = pd.concat([power_rows("head", "wall-0", silent, 200.0), power_rows("head", "gpu0", seconds, 9.0)])
    gaps = wall_gaps.wall_gaps(telemetry, WINDOWS)
    assert gaps == ["", "head wall-0: no reading for 16.0 s from 19.0 s into the load window"]
    validity = pd.DataFrame({"warnings": ["", "short"]})
    assert wall_gaps.with_wall_gaps(validity, telemetry, WINDOWS)["warnings"].tolist() == ["", "short; " + gaps[1]]


def test_a_meter_feeding_two_hosts_is_their_total_and_neither_board_is_added_to_it():
    record = {"host": "head", "domain": "wall-0", "kind": "snmp", "where": "snmp://pdu:161", "update_s": 5}
    preflight = {"hosts": {"head": {"wall_meters": [{**record, "feeds": ["head", "worker"]}]}, "worker": {}}}
    meters = energy.wall_meter_records(preflight)
    seconds = np.arange(0.0, 400.0, 1.0)
    telemetry = pd.concat(
        [
            power_rows("head", "wall-0", seconds, 300.0),
            power_rows("head", "gpu0", seconds, 100.0),
            power_rows("worker", "gpu0", seconds, 90.0),
        ],
        ignore_index=True,
    )
    table = energy.energy_table(telemetry, WINDOWS, pd.DataFrame(), None, ["head", "worker"], meters)
    rows = table.set_index(["arm", "host", "domain"])
    assert rows.loc[("B", "all", "total"), "mean_w"] == pytest.approx(300.0)
    assert rows.loc[("B", "all", "total"), "scope"] == "head: wall; worker: in the wall meter of head"
    assert rows.loc[("B", "all", "onboard"), "mean_w"] == pytest.approx(190.0)
    assert energy.total_hosts(table) == {"head": ["wall-0"]}
    assert rows.loc[("B", "head", "wall-0"), "scope"] == (
        "wall (snmp snmp://pdu:161, its reading refreshed every 5 s, feeds head + worker)"
    )


def test_a_counter32_that_wraps_is_added_back_not_skipped(tmp_path):
    meter = Meter("head", 0, {"kind": "snmp", "host": "pdu", "oid_power": "1.3.6.1"})
    wrap_j = 2.0**32 * 0.1  # a Counter32 of 0.1 J
    out = wall_poll.HostFile(tmp_path / "monitor/head/wall.csv")
    for second, joules in enumerate([wrap_j - 250.0, wrap_j - 50.0, 150.0, 350.0]):  # 200 W, across the wrap
        out.write(wall_poll.reading_rows(meter, 1000.0 + second, Reading(200.0, joules, wrap_j), []))
    tidy, dropped = ingest.telemetry(tmp_path / "monitor", {"head": 0.0})
    assert tidy[tidy["sensor"] == "wall-0"]["value"].round(3).tolist() == [200.0] * 3
    assert not any("reset" in key for key in dropped)


def test_an_snmpv3_key_too_short_for_the_agent_is_named_not_sent(monkeypatch):
    monkeypatch.setenv("THERMAB_TEST_AUTH", "short")
    meter = Meter(
        "head",
        0,
        {"kind": "snmp", "host": "127.0.0.1", "version": "3", "user": "u", "auth_key_env": "THERMAB_TEST_AUTH"}
        | {"oid_power": "1.3.6.1", "timeout_s": 0.3},
    )
    problem = wall_meters.probe(meter)
    assert problem == "host head: wall meter snmp snmp://127.0.0.1:161: the auth_key is shorter than 8 characters"
