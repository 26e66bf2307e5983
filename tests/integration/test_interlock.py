"""The interlock and the phase's hole check against a real agent on a local simulated node
tree: blind when the readings stop, a dead agent restarted rather than called blind, the
load cap kept by the controller, and a window without samples named."""

import json
import os
import signal
import time

import pytest
import yaml

from support.node_trees import make_gb10
from support.paths import REPO as ROOT
from support.processes import wait_until
from thermab.config import validate, view
from thermab.experiment import events
from thermab.experiment.cluster import ClusterRun
from thermab.experiment.interlock import Interlock, MarkForwarder, telemetry_holes
from thermab.telemetry import deploy


@pytest.fixture
def run(tmp_path):
    raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    raw["monitor"] = {"process_pattern": "no-such-process-xyz", "intervals": {"thermal": 0.2, "cpu": 0.2}}
    raw["safety"] = {"max_sensor_silence_s": 1, "max_load_minutes": 1}
    raw["clusters"] = {
        "t": {
            "head": "head",
            "endpoint": "http://127.0.0.1:9",
            "end_state": "stopped",
            "hosts": {"head": {"transport": "local", "simulated": "head", "root": "node"}},
        }
    }
    run = ClusterRun(view(validate(raw, tmp_path)), "t", "A", tmp_path / "results/t/A", tmp_path)
    make_gb10(run.hosts[0].spec.root)
    (run.hosts[0].spec.root / "proc").mkdir()  # a simulated node's /proc view, here without processes
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "preflight.json").write_text(
        json.dumps(
            {
                "safety": {"abort_at_c": 95.0},
                "clock_offset_s": {"head": 0.0},
                "hosts": {"head": {"zones": [{"name": "TSOC", "trip_point_c": 104.8}]}},
            }
        )
    )
    deploy.start_agent(run.hosts[0], run.session, run.agent_settings(run.hosts[0]))
    yield run
    deploy.stop_agent(run.hosts[0], run.session)


def interlock(run: ClusterRun) -> Interlock:
    return Interlock(run, MarkForwarder(run, run.run_dir / "load_events.jsonl", 1, "A"))


def test_silent_sensors_make_the_host_blind(run):
    check = interlock(run)
    assert check() is None
    pid = deploy.agent_pid(run.hosts[0], run.session)
    os.kill(pid, signal.SIGSTOP)
    try:
        assert wait_until(lambda: check() is not None, timeout=30)
        assert check().startswith("blind: host head has given no thermal reading for")
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_dead_agent_is_restarted_not_called_blind(run):
    check = interlock(run)
    os.kill(deploy.agent_pid(run.hosts[0], run.session), signal.SIGKILL)
    time.sleep(1.5)  # longer than max_sensor_silence_s: the host is silent
    assert check() is None, "restarted, and given its own time"
    assert [e for e in events.read(run.run_dir) if e["event"] == "note"][0]["detail"]["agent_restarted"]
    assert deploy.agent_pid(run.hosts[0], run.session)


def test_the_controller_keeps_the_load_cap(run):
    check = interlock(run)
    started = time.time() - 100  # the load's own start mark, 100 s ago, and no end mark since
    (run.run_dir / "load_events.jsonl").write_text(json.dumps({"t": started, "event": "load_start"}) + "\n")
    assert check() == "safety.max_load_minutes: the load has run 100 s without ending, past 1 min"
    with open(run.run_dir / "load_events.jsonl", "a") as marks:
        marks.write(json.dumps({"t": started + 60, "event": "load_end"}) + "\n")
    assert interlock(run)() is None, "a load that ended may finish its requests in flight"


def test_a_window_without_samples_is_a_hole(run):
    start = time.time()
    assert wait_until(
        lambda: deploy.count_readings(run.hosts[0], run.session, "cpu", start, time.time() + 1, "vllm_cpu_pct") >= 2
    )
    assert telemetry_holes(run, {"start": start, "end": time.time()}) == []
    later = time.time() + 3600
    assert telemetry_holes(run, {"start": later, "end": later + 60}) == [
        "host head has no cpu sample in the load window",
        "host head has no thermal sample in the load window",
    ]
