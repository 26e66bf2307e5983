"""The files stages hand each other (thermab.contracts): written with exactly their keys, and
read back from the files of earlier versions, which lack some."""

import json

import pytest

from thermab import metric_names as names
from thermab.contracts import BaselineRecord, PhaseRecord, Preflight, Safety, validity_key
from thermab.errors import UserError

PREFLIGHT_KEYS = [
    "cluster",
    "order",
    "t",
    "hosts",
    "advice",
    "restored_leftovers",
    "endpoint",
    "clock_offset_s",
    "clock_offset_uncertainty_s",
    "safety",
]


def test_preflight_is_written_with_its_keys_and_read_back(tmp_path):
    zones = [{"name": "TSOC", "trip_point_c": 104.8}]
    report = Preflight(
        cluster="sim",
        order="AB",
        t=1.0,
        hosts={"head": {"zones": zones}, "worker": {"zones": []}},
        clock_offset_s={"head": 0.01},
        safety=Safety(abort_at_c=95.0),
    )
    report.write(tmp_path / "preflight.json")
    raw = json.loads((tmp_path / "preflight.json").read_text())
    assert list(raw) == PREFLIGHT_KEYS
    assert list(raw["safety"]) == ["abort_at_c", "lowest_trip_point_c", "lowest_trip_point"]
    assert Preflight.read(tmp_path / "preflight.json") == report
    assert report.watched == {"head"} and report.zones("nowhere") == []
    report.write(tmp_path / "failed.json", problems=["host worker: unreachable"])
    assert json.loads((tmp_path / "failed.json").read_text())["problems"] == ["host worker: unreachable"]


def test_an_earlier_preflight_without_times_and_uncertainties_still_reads(tmp_path):
    """A file written before ``t``, ``clock_offset_uncertainty_s`` and the lowest trip point
    in words were kept (and with a key no longer written)."""
    (tmp_path / "preflight.json").write_text(
        json.dumps(
            {
                "cluster": "gb10",
                "order": "ABBA",
                "hosts": {"head": {"reachable": True, "zones": [{"name": "TSOC"}]}},
                "clock_offset_s": {"head": -0.002},
                "safety": {"abort_at_c": None, "lowest_trip_point_c": 104.8},
                "retired": 1,
            }
        )
    )
    old = Preflight.read(tmp_path / "preflight.json")
    assert old.t is None and old.clock_offset_uncertainty_s == {} and old.safety.lowest_trip_point is None
    assert old.safety.abort_at_c is None and old.watched == {"head"} and old.clock_offset_s == {"head": -0.002}


def test_a_phase_record_keeps_the_keys_of_phase_json(tmp_path):
    record = PhaseRecord(
        phase="rep1-A",
        order="AB",
        rep=1,
        arm="A",
        users=4,
        load_level="4 users",
        label="stock",
        value=1.0,
        model="m",
        load_start=1.0,
        load_end=2.0,
        validity={},
        cooldown={"reason": "r", "seconds": 1},
        start_zones_c={"head": {"TSOC": 40.0}},
        idle_w_before=None,
        load_s=40,
    )
    record.write(tmp_path / "phase.json")
    raw = json.loads((tmp_path / "phase.json").read_text())
    assert list(raw) == [
        "phase",
        "order",
        "rep",
        "arm",
        "users",
        "load_level",
        "label",
        "value",
        "model",
        "load_start",
        "load_end",
        "validity",
        "cooldown",
        "start_zones_c",
        "idle_w_before",
        "load_s",
    ]
    assert PhaseRecord.read(tmp_path / "phase.json") == record and record.window_asked_s == 40
    # a file written before the key: the load's own duration_s holds the window it was asked
    raw.pop("load_s")
    (tmp_path / "phase.json").write_text(json.dumps({**raw, "validity": {"duration_s": 60}}))
    assert PhaseRecord.read(tmp_path / "phase.json").window_asked_s == 60
    BaselineRecord(t_start=1.0, t_end=2.0).write(tmp_path / "baseline.json")
    assert json.loads((tmp_path / "baseline.json").read_text()) == {"phase": "baseline", "t_start": 1.0, "t_end": 2.0}


def test_a_validity_report_names_its_phase_or_is_a_user_error(tmp_path):
    path = tmp_path / "validity.json"
    assert validity_key({"order": "AB", "rep": 1, "arm": "A"}, path) == ("AB", 1, "A", None, None), "before levels"
    assert validity_key({"order": "AB", "rep": 1, "arm": "A", "users": 8}, path) == ("AB", 1, "A", 8, None)
    mixed = {"order": "AB", "rep": 1, "arm": "A", "users": 4, "load_level": "0.5 req/s ≤4"}
    assert validity_key(mixed, path) == ("AB", 1, "A", 4, "0.5 req/s ≤4")
    for broken in (
        {"order": "AB", "rep": True, "arm": "A"},
        {"order": "AB", "arm": "A"},
        {"order": "AB", "rep": 1, "arm": "A", "users": 1.5},
        {"order": "AB", "rep": 1, "arm": "A", "users": 4, "load_level": 4},
    ):
        with pytest.raises(UserError, match="validity.json: key"):
            validity_key(broken, path)


def test_metric_names_say_which_host_they_belong_to():
    assert names.host_of(names.zone_mean("worker", "TSOC")) == "worker"
    assert names.host_of(names.cpu_median("head")) == "head"
    assert all(names.host_of(name) is None for name in names.RUN_METRICS + ("head TSOC median", "head two words mean"))
