"""The controller's poller of the wall meters as a run starts and stops it: a process of its
own reading a simulated node's plug over HTTP, which goes on, row after row with the reason,
when the plug stops answering, and is gone once stopped."""

import csv
import json
import time

from thermab.sim import node, plug, power_meters as sim_power
from thermab.telemetry import power, wall_meters, wall_poll


def rows_of(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def wait_for(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_the_poller_reads_the_plug_keeps_going_without_it_and_stops(tmp_path):
    root = tmp_path / "node"
    node.create_node(root, "head")
    meter_model = sim_power.PowerMeter(root, node.load_settings(root)["power"], node.write_atomic)
    meter_model.start()  # the counters advance at the idle node's power, as the thermal daemon makes them
    server = plug.serve(root, meter_model)
    run_dir = tmp_path / "run"
    meter = wall_meters.meters_of("head", {"simulated": "head"}, root)[0]
    meter = wall_meters.Meter("head", 0, {**meter.settings, "interval_s": 0.2, "timeout_s": 0.5}, root)
    pid = wall_poll.start(run_dir, [meter])
    csv_path = run_dir / "monitor/head/wall.csv"
    try:
        assert wall_poll.start(run_dir, [meter]) == pid, "started once"
        assert wait_for(lambda: csv_path.exists() and sum(r["value"] != "" for r in rows_of(csv_path)) >= 6)
        server.shutdown()
        server.server_close()
        answered = len(rows_of(csv_path))
        assert wait_for(lambda: sum(r["reason"] != "" for r in rows_of(csv_path)[answered:]) >= 2)
    finally:
        wall_poll.stop(run_dir)
    assert wall_poll.running_pid(run_dir) is None
    rows = rows_of(csv_path)
    assert {r["sensor"] for r in rows} == {"wall-0 W", "wall-0 mJ"}
    failed = [r for r in rows if r["reason"]]
    assert failed and all(
        "host head: wall meter shelly the simulated node's plug: does not answer" in r["reason"] for r in failed
    )
    times = [float(r["t"]) for r in rows]
    assert times == sorted(times), "stamped on the controller's clock as polled"
    # what a phase reads of the head's power before its restart: the rows with a value, from the file's end
    valued = [(float(r["t"]), r["sensor"], float(r["value"])) for r in rows if r["value"]]
    assert wall_poll.tail_rows(run_dir, "head", 10_000) == valued
    assert power.recent_total_watts(valued, 60.0) > 0, "the plug's counter, turned into watts"
    record = json.loads((run_dir / "monitor/wall.json").read_text())["meters"]
    assert [(m["host"], m["domain"], m["kind"], m["feeds"]) for m in record] == [("head", "wall-0", "shelly", ["head"])]
