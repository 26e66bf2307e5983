"""Power telemetry: the agent's power sources on fixture trees, counters to watts at ingest
(wrap, reset, counter over readings), and the simulated node's powercap tree and meter."""

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, strategies as st

from support import power_trees
from thermab.sim import node, power_meters as sim_power
from thermab.telemetry import agent, ingest, power

RAPL_MAX = 262143328850


def zone(root: Path, entry: str, name: str, energy_uj, wrap=RAPL_MAX) -> Path:
    directory = root / "sys/class/powercap" / entry
    directory.mkdir(parents=True)
    (directory / "name").write_text(name + "\n")
    (directory / "max_energy_range_uj").write_text(f"{wrap}\n")
    (directory / "energy_uj").write_text(f"{energy_uj}\n")
    return directory


def make_rapl(root: Path) -> None:
    """Two packages (the first with core, uncore and DRAM sub-zones), psys, and the MMIO
    copy of package 0 that must not be read twice."""
    zone(root, "intel-rapl:0", "package-0", 1000)
    zone(root, "intel-rapl:0:0", "core", 400)
    zone(root, "intel-rapl:0:1", "uncore", 100)
    zone(root, "intel-rapl:0:2", "dram", 50)
    zone(root, "intel-rapl:1", "package-1", 2000)
    zone(root, "intel-rapl:2", "psys", 9000)
    zone(root, "intel-rapl-mmio:0", "package-0", 1000)
    (root / "sys/class/powercap/intel-rapl").mkdir()  # the control type, not a zone


def test_rapl_domains_and_raw_counters(tmp_path):
    make_rapl(tmp_path)
    source = agent.RaplPower(str(tmp_path))
    assert source.available()
    assert source.discover()["domains"] == [
        "package-0",
        "package-0/core",
        "package-0/uncore",
        "dram-0",
        "package-1",
        "psys",
    ]
    rows = {sensor: (value, reason) for sensor, value, reason in source.sample()}
    assert rows[f"package-0 uJ:max={RAPL_MAX}"] == (1000, "")
    assert rows[f"package-0/core uJ:max={RAPL_MAX}"] == (400, "")
    assert rows[f"dram-0 uJ:max={RAPL_MAX}"] == (50, "")
    assert len(rows) == 6, "the MMIO zone repeats package-0 and is not read"


def test_rapl_unreadable_counter_is_empty_with_a_reason(tmp_path):
    directory = zone(tmp_path, "intel-rapl:0", "package-0", 0)
    (directory / "energy_uj").unlink()
    (directory / "energy_uj").mkdir()  # unreadable for root too (energy_uj is 0400 since 2020)
    source = agent.RaplPower(str(tmp_path))
    source.discover()
    [(sensor, value, reason)] = source.sample()
    assert value is None and reason.startswith("unreadable")


def test_hwmon_power_and_energy_with_labels(tmp_path):
    """A driver with labels and an energy counter in ``hwmonN`` (as the simulated meter)."""
    chip = tmp_path / "sys/class/hwmon/hwmon3"
    chip.mkdir(parents=True)
    (chip / "name").write_text("meter\n")
    (chip / "power1_input").write_text("231500000\n")
    (chip / "power1_label").write_text("board\n")
    (chip / "energy1_input").write_text("123456789\n")
    (chip / "temp1_input").write_text("45000\n")
    source = agent.HwmonPower(str(tmp_path))
    assert source.discover()["sensors"] == ["hwmon/meter/board W", "hwmon/meter/energy1 uJ"]
    assert dict((s, v) for s, v, _ in source.sample()) == {
        "hwmon/meter/board W": 231.5,
        "hwmon/meter/energy1 uJ": 123456789,
    }


def meter_domain(index: int, oem: str) -> str:
    return f"hwmon/power_meter@ACPI000D:{index:02d}/{oem}"


@pytest.mark.parametrize("in_device", [True, False], ids=["files in hwmonN/device", "files in hwmonN"])
def test_gh200_acpi_meters_are_found_in_either_driver_layout_and_named_by_oem_info(tmp_path, in_device):
    files = power_trees.gh200(tmp_path, in_device=in_device)
    source = agent.HwmonPower(str(tmp_path))
    found = source.discover()
    expected = [meter_domain(i, oem) for i, oem in enumerate(files)]
    assert found["sensors"] == sorted(f"{d} W" for d in expected)
    assert {d["domain"]: d["scope"] for d in found["details"]}[meter_domain(0, "Module Power Socket 0")] == "module"
    rows = {s: (v, r) for s, v, r in source.sample()}
    assert rows[f"{meter_domain(0, 'Module Power Socket 0')} W"] == (650.0, "")
    assert rows[f"{meter_domain(13, 'Grace Power Socket 3')} W"] == (180.0, "")
    assert len(rows) == 16
    total, scopes, holds = power.total_scope([d for d in expected] + ["gpu0", "gpu1", "gpu2", "gpu3"])
    assert total == [meter_domain(i, f"Module Power Socket {i // 4}") for i in (0, 4, 8, 12)]
    assert scopes == ["module"] and "cpu" in holds and "gpu" in holds
    assert power.container("gpu1", expected + ["gpu1"]) == meter_domain(4, "Module Power Socket 1")
    assert power.container(meter_domain(2, "CPU Power Socket 0"), expected) == meter_domain(1, "Grace Power Socket 0")


def test_acpi_unknown_and_implausible_readings_are_missing_with_their_reason(tmp_path):
    files = power_trees.grace(tmp_path)
    files["Grace Power Socket 0"].write_text(f"{power_trees.ACPI_UNKNOWN_UW}\n")
    files["Grace Power Socket 1"].write_text("4294967295\n")  # the same sentinel, unscaled
    files["CPU Power Socket 0"].write_text("1800000000\n")  # 1.8 kW on one CPU rail
    files["SysIO Power Socket 1"].write_text("-5000000\n")
    source = agent.HwmonPower(str(tmp_path))
    source.discover()
    rows = {s.split("/")[-1]: (v, r) for s, v, r in source.sample()}
    assert rows["Grace Power Socket 0 W"] == (None, "no reading: 0xFFFFFFFF (ACPI's unknown)")
    assert rows["Grace Power Socket 1 W"][0] is None
    assert (
        rows["CPU Power Socket 0 W"][0] is None
        and "implausible for a rail domain: 1800.0 W" in rows["CPU Power Socket 0 W"][1]
    )
    assert rows["SysIO Power Socket 1 W"][0] is None and "implausible" in rows["SysIO Power Socket 1 W"][1]
    assert rows["CPU Power Socket 1 W"] == (190.0, "")
    assert agent.parse_gpu_power("0, 4294967.295, 1000\n")[0] == (
        "gpu0 W",
        None,
        "implausible for a gpu domain: 4294967.3 W (bound 0-2000 W)",
    )


def test_grace_and_gb200_totals_add_sockets_and_gpus_never_their_rails(tmp_path):
    grace = [f"hwmon/power_meter@ACPI000D:{i:02d}/{oem}" for i, oem in enumerate(power_trees.grace(tmp_path / "g"))]
    total, scopes, holds = power.total_scope(grace)
    assert [d.split("/")[-1] for d in total] == ["Grace Power Socket 0", "Grace Power Socket 1"]
    assert scopes == ["cpu"] and holds == ["cpu"]
    source = agent.HwmonPower(str(tmp_path / "b"))
    power_trees.gb200(tmp_path / "b")
    domains = [s[: -len(" W")] for s in source.discover()["sensors"]] + [f"gpu{i}" for i in range(4)]
    total, scopes, holds = power.total_scope(domains)
    assert [d.split("/")[-1] for d in total] == [f"gpu{i}" for i in range(4)] + [
        "Grace Power Socket 0",
        "Grace Power Socket 1",
    ]
    assert scopes == ["cpu", "gpu"] and holds == ["cpu", "gpu"]


def test_jetson_agx_orin_rails_are_volts_times_amps_named_by_label(tmp_path):
    power_trees.jetson_agx_orin(tmp_path)
    source = agent.HwmonPower(str(tmp_path))
    found = source.discover()
    assert found["sensors"] == [
        "hwmon/ina3221@1-0040/VDD_CPU_CV W",
        "hwmon/ina3221@1-0040/VDD_GPU_SOC W",
        "hwmon/ina3221@1-0040/VIN_SYS_5V0 W",
        "hwmon/ina3221@1-0041/VDDQ_VDD2_1V8AO W",
    ], "the shunt voltages (in4-in6) and the current sum (curr4) are no rails"
    assert {d["scope"] for d in found["details"]} == {"rail"}
    rows = {s: v for s, v, _ in source.sample()}
    assert rows["hwmon/ina3221@1-0040/VDD_GPU_SOC W"] == pytest.approx(4.984 * 1.6)
    assert rows["hwmon/ina3221@1-0041/VDDQ_VDD2_1V8AO W"] == pytest.approx(4.996 * 0.24)
    assert power.host_total_domains([s[:-2] for s in rows]) == [], "rails only: no total of the node"
    assert power.host_total_domains(["hwmon/ina3221@1-0040/VDD_IN", "hwmon/ina3221@1-0040/VDD_CPU_GPU_CV"]) == [
        "hwmon/ina3221@1-0040/VDD_IN"
    ], "an Orin NX or Nano's VDD_IN is its module's input"


def test_ampere_altra_sockets_make_the_total(tmp_path):
    power_trees.ampere_altra(tmp_path)
    source = agent.HwmonPower(str(tmp_path))
    domains = [s[:-2] for s in source.discover()["sensors"]]
    assert domains == [
        "hwmon/apm_xgene@APMC0D8A:00/CPU power",
        "hwmon/apm_xgene@APMC0D8A:00/IO power",
        "hwmon/apm_xgene@APMC0D8A:01/CPU power",
        "hwmon/apm_xgene@APMC0D8A:01/IO power",
    ]
    assert power.total_scope(domains) == (domains, ["cpu"], ["cpu"])
    assert dict((s, v) for s, v, _ in source.sample())["hwmon/apm_xgene@APMC0D8A:01/CPU power W"] == 28.08
    assert agent.Hwmon(str(tmp_path)).discover()["sensors"] == [
        "apm_xgene@APMC0D8A:00/SoC Temperature",
        "apm_xgene@APMC0D8A:01/SoC Temperature",
    ]


def test_gb10_has_no_cpu_power_and_its_total_is_the_gpus(tmp_path):
    power_trees.gb10(tmp_path)
    assert agent.HwmonPower(str(tmp_path)).discover()["sensors"] == []
    assert not agent.RaplPower(str(tmp_path)).available()
    assert power.total_scope(["gpu0"]) == (["gpu0"], ["gpu"], ["gpu"])


def test_nvidia_smi_and_ipmi_parsers():
    rows = {s: (v, r) for s, v, r in agent.parse_gpu_power("0, 72.31, 123456789\n1, [N/A], [N/A]\n")}
    assert rows["gpu0 W"] == (72.31, "") and rows["gpu0 mJ"] == (123456789, "")
    assert rows["gpu1 W"][0] is None and "N/A" in rows["gpu1 W"][1]
    assert agent.parse_gpu_power("0, 72.31\n", ("index", "power.draw")) == [("gpu0 W", 72.31, "")]
    reading = (
        "    Instantaneous power reading:                   220 Watts\n"
        "    Power reading state is:                   activated\n"
    )
    assert agent.parse_dcmi_power(reading) == [("node W", 220.0, "")]
    off = agent.parse_dcmi_power("    Instantaneous power reading: 0 Watts\n    Power reading state is: deactivated\n")
    assert off[0][1] is None and "deactivated" in off[0][2], "a deactivated meter reads empty, not 0 W"
    assert agent.parse_dcmi_power("Error: no response")[0][1] is None
    zero = agent.parse_dcmi_power("    Instantaneous power reading:  0 Watts\n")
    assert zero[0][1] is None and "0 W" in zero[0][2], "a BMC without a reading says 0 W: empty, not zero"


class Slow(agent.CommandSource):
    """A command that takes a while, then prints one GPU line."""

    timeout_s = 30.0

    def __init__(self, seconds):
        agent.CommandSource.__init__(self)
        self.seconds = seconds

    def command(self):
        return [sys.executable, "-c", f"import time; time.sleep({self.seconds}); print('0, 50.5, 1000')"]

    def parse(self, stdout):
        return agent.parse_gpu_power(stdout)


def wait_for_rows(source, attempts=400):
    for _ in range(attempts):
        rows = source.sample()
        if rows:
            return rows
        source.poller.thread.join(0.05)
    pytest.fail("the poller never delivered")


def test_polled_source_returns_at_once_and_stamps_its_rows():
    source = Slow(0.3)
    assert source.sample() == [], "the first sample only starts the command"
    rows = wait_for_rows(source)
    assert [(s, v) for _, s, v, _ in rows] == [("gpu0 W", 50.5), ("gpu0 mJ", 1000)]
    assert len({t for t, _, _, _ in rows}) == 1, "one measurement, one time"


def test_polled_command_that_hangs_is_timed_out_empty():
    source = Slow(60)
    source.timeout_s = 0.2
    source.failed_sensor = "gpu0 W"
    source.sample()
    [(t, sensor, value, reason)] = wait_for_rows(source)
    assert value is None and "timed out" in reason


def test_sources_are_registered_as_power():
    power_sources = [s for s in agent.SOURCES if s.kind == "power"]
    assert [s.name for s in power_sources] == ["rapl", "hwmon_power", "gpu_power", "ipmi"]
    assert ingest.KIND_OF_FILE["rapl"] == "power"
    assert not agent.NvidiaPower("/some/node").available(), "a simulated node never reads the host's GPUs"


# ---- counters to watts -----------------------------------------------------------------


def test_counter_wrap_is_added_back():
    wrap = 1000
    t = np.array([0.0, 1.0, 2.0, 3.0])
    raw = np.array([800, 950, 99, 249])  # +150, then past 1000 to 99: 1001 - 950 + 99 = 150, +150
    middle, watts, resets = power.counter_power(t, raw, 1.0, wrap)
    assert middle.tolist() == [0.5, 1.5, 2.5] and watts.tolist() == [150, 150, 150] and resets == 0


def test_counter_without_range_going_back_is_a_reset_not_energy():
    middle, watts, resets = power.counter_power(
        np.array([0.0, 1.0, 2.0, 3.0]), np.array([5e6, 6e6, 1e3, 1e6 + 1e3]), 1e-3, None
    )
    assert watts.tolist() == [1000.0, 1000.0] and middle.tolist() == [0.5, 2.5] and resets == 1


def test_power_rows_counter_wins_over_readings_and_names_are_checked():
    frame = pd.DataFrame(
        {
            "t": [10.0, 11.0, 12.0, 10.0, 11.0, 12.0, 10.0, 11.0, 11.0],
            "host": "h",
            "kind": "power",
            "sensor": ["gpu0 mJ", "gpu0 mJ", "gpu0 mJ", "gpu0 W", "gpu0 W", "gpu0 W", "node W", "node W", "odd"],
            "value": [0.0, 300e3, 600e3, 290.0, 310.0, 305.0, 500.0, 520.0, 1.0],
        }
    )
    rows, notes = power.power_rows(frame)
    gpu = rows[rows["sensor"] == "gpu0"]
    assert gpu["value"].tolist() == [300.0, 300.0] and gpu["t"].tolist() == [10.5, 11.5]
    assert rows[rows["sensor"] == "node"]["value"].tolist() == [500.0, 520.0]
    assert set(rows["kind"]) == {"power"}
    assert notes == {
        "h/power: not a power sensor name": 1,
        "h/power: gpu0 W readings not used (its energy counter is)": 3,
    }


def test_a_hosts_recent_total_power_sums_its_total_domains_over_the_window():
    # as a phase reads it before its restart: the agent's own rows, host time, the last 10 s
    rows = []
    for second in range(30):
        t = 1000.0 + second
        # package-0 draws 10 W, then 30 W over the last 10 s
        rows.append((t, "package-0 uJ", sum(10.0 if s < 20 else 30.0 for s in range(second)) * 1e6))
        rows.append((t, "package-0/core uJ", second * 5e6))  # a sub-domain: inside package-0, never added
        rows.append((t, "dram-0 W", 2.0))
    assert power.recent_total_watts(rows, 9.5) == pytest.approx(32.0)
    assert power.recent_total_watts(rows + [(1029.5, "node W", 70.0)], 5.0) == 70.0  # a node domain is the total
    # a domain without a reading in the window makes the total unknown, not smaller
    stale = [row for row in rows if not (row[1] == "dram-0 W" and row[0] > 1015)]
    assert math.isnan(power.recent_total_watts(stale, 9.5))
    assert math.isnan(power.recent_total_watts([], 10.0))
    assert math.isnan(power.recent_total_watts([(1.0, "psys W", 5.0)], 10.0))  # no total domain
    assert power.host_total_domains(["package-0", "package-0/core", "dram-0", "psys"]) == ["dram-0", "package-0"]


def test_ingest_turns_a_wrapping_rapl_file_into_watts_and_keeps_missing_empty(tmp_path):
    host_dir = tmp_path / "monitor/head"
    host_dir.mkdir(parents=True)
    wrap = 4294967295
    lines = ["t,sensor,value,reason"]
    energy = {"package-0": wrap - 150_000_000, "package-0/core": 0}
    for second in range(6):
        for domain in ("package-0", "package-0/core"):
            if second == 3 and domain == "package-0/core":
                lines.append(f"{1000 + second}.000,{domain} uJ:max={wrap},,unreadable: Permission denied")
                continue
            lines.append(f"{1000 + second}.000,{domain} uJ:max={wrap},{energy[domain]},")
        for domain, step_w in (("package-0", 100), ("package-0/core", 40)):
            energy[domain] = (energy[domain] + step_w * 1_000_000) % (wrap + 1)
    (host_dir / "rapl.csv").write_text("\n".join(lines) + "\n")
    tidy, dropped = ingest.telemetry(tmp_path / "monitor", {"head": 0.0})
    package = tidy[tidy["sensor"] == "package-0"]
    assert package["value"].round(6).tolist() == [100.0] * 5, "the wrap after the second reading is added back"
    core = tidy[tidy["sensor"] == "package-0/core"]
    assert core["value"].round(6).tolist() == [40.0] * 4, "the missing reading lengthens an interval, never 0 W"
    assert core["t"].tolist() == [1000.5, 1001.5, 1003.0, 1004.5]
    assert (tidy["value"] > 0).all()
    assert dropped == {"head/power: unreadable: Permission denied": 1}


# ---- the simulated node ------------------------------------------------------------------


def test_simulated_node_power_follows_its_heat_input(tmp_path):
    node.create_node(tmp_path, "head")
    domains = agent.RaplPower(str(tmp_path)).discover()["domains"]
    assert domains == ["package-0", "package-0/core", "package-0/uncore", "dram-0"]
    meter_source = agent.HwmonPower(str(tmp_path))
    assert meter_source.discover()["sensors"] == ["hwmon/power_meter/node W"]
    model = node.load_settings(tmp_path)["power"]
    meter = sim_power.PowerMeter(tmp_path, model, node.write_atomic)
    rapl = agent.RaplPower(str(tmp_path))
    rapl.discover()
    before = {s: v for s, v, _ in rapl.sample()}
    for _ in range(10):
        meter.advance(1.1, 0.8, 0.5)  # the stock arm's head: 1.1 cores, GPU 80 % busy, 5 s
    after = {s: v for s, v, _ in rapl.sample()}
    expected = sim_power.watts(model, 1.1, 0.8)
    wrap = sim_power.WRAP_UJ + 1
    for sensor, name in (
        (f"package-0 uJ:max={sim_power.WRAP_UJ}", "package-0"),
        (f"package-0/core uJ:max={sim_power.WRAP_UJ}", "core"),
    ):
        assert ((after[sensor] - before[sensor]) % wrap) / 1e6 / 5.0 == pytest.approx(expected[name], abs=1e-5)
    assert dict((s, v) for s, v, _ in meter_source.sample())["hwmon/power_meter/node W"] == pytest.approx(
        expected["node"], abs=1e-3
    )
    assert expected["package-0"] == pytest.approx(expected["core"] + expected["uncore"] + model["package_rest_w"])
    busier = sim_power.watts(model, 2.0, 0.8)
    assert busier["package-0"] - expected["package-0"] == pytest.approx(0.9 * model["w_per_core"])


def test_simulated_counters_continue_after_a_restart(tmp_path):
    node.create_node(tmp_path, "worker")
    model = node.load_settings(tmp_path)["power"]
    sim_power.PowerMeter(tmp_path, model, node.write_atomic).advance(0.5, 0.5, 2.0)
    reading = (tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj").read_text()
    node.create_node(tmp_path, "worker")  # re-created at the next run: the counter is kept
    restarted = sim_power.PowerMeter(tmp_path, model, node.write_atomic)
    assert restarted.energy_uj["intel-rapl:0"] == int(reading) > 0
    assert os.access(tmp_path / "sys/class/hwmon/hwmon0/power1_input", os.R_OK)


def test_thermal_daemon_drives_the_counters(tmp_path):
    node.create_node(tmp_path, "head")
    counter = tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj"
    command = [sys.executable, "-m", "thermab.sim.thermal", "--node", str(tmp_path), "--detach"]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)
    try:
        for _ in range(200):  # until the first ticks have added their idle energy
            if int(counter.read_text()) > 0:
                break
            time.sleep(0.05)
        assert int(counter.read_text()) > 0
    finally:
        assert node.stop(tmp_path, "thermal")


# ---- scope: properties ------------------------------------------------------------------

METER = "hwmon/power_meter@ACPI000D:0{}/{} Power Socket {}"
DOMAINS = st.sampled_from(
    ["node", "package-0", "package-1", "package-0/core", "dram-0", "gpu0", "gpu1", "gpu-2", "psys"]
    + [
        METER.format(i, kind, socket)
        for i, (kind, socket) in enumerate(
            [("Module", 0), ("Grace", 0), ("CPU", 0), ("SysIO", 0), ("Module", 1), ("Grace", 1)]
        )
    ]
    + ["hwmon/ina3221@1-0040/VDD_IN", "hwmon/ina3221@1-0040/VDD_GPU_SOC", "hwmon/apm_xgene@APMC0D8A:00/CPU power"]
)


@given(st.text(max_size=60), st.floats(allow_nan=True, allow_infinity=True))
def test_any_domain_has_a_scope_and_any_reading_is_a_value_in_bounds_or_a_reason(domain, watts):
    scope, socket = agent.domain_scope(domain)
    assert scope in agent.PLAUSIBLE_W and (socket is None or socket >= 0)
    value, reason = agent.plausible_watts(domain, watts)
    assert (value is None) == bool(reason)
    assert value is None or 0.0 <= value <= agent.PLAUSIBLE_W[scope]


@given(st.lists(DOMAINS, unique=True, max_size=12))
def test_a_host_total_never_holds_a_domain_and_what_holds_it(domains):
    summed, scopes, holds = power.total_scope(domains)
    assert set(summed) <= set(domains)
    for domain in summed:
        assert power.container(domain, domains) not in summed, "counted twice"
        assert agent.domain_scope(domain)[0] in ("node", "module", "cpu", "dram", "gpu")
    if "node" in domains:
        assert summed == ["node"] and "cpu" in holds
