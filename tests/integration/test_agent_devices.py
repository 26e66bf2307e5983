"""The agent on sysfs trees whose devices come and go while it runs: a device removed and
another registered under its number (hwmonN, thermal_zoneN, intel-rapl:N, policyN), and a
device coming back under another number.  Every device reads a value of its own, so each
row written shows whether it came from the device its name says."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import power_trees
from support.node_trees import csv_rows
from support.processes import wait_until
from thermab.telemetry import deploy
from thermab.telemetry.agent import CpuFrequency, Hwmon, HwmonPower, RaplPower, ThermalZones


def register_hwmon(root: Path, number: int, device: str, driver: str, millic: int, label: str = "") -> None:
    """A chip as the kernel registers it: its directory inside the device's, a ``device``
    link up to the device, and ``/sys/class/hwmon/hwmonN`` a link down to it."""
    chip = root / "sys/devices" / device / "hwmon" / f"hwmon{number}"
    chip.mkdir(parents=True)
    (chip / "device").symlink_to("../..")
    (chip / "name").write_text(driver + "\n")
    (chip / "temp1_input").write_text(f"{millic}\n")
    (chip / "power1_input").write_text(f"{millic * 1000}\n")  # µW: the same number, in W
    if label:
        (chip / "temp1_label").write_text(label + "\n")
    link = root / "sys/class/hwmon" / f"hwmon{number}"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(chip, link.parent))


def unregister_hwmon(root: Path, number: int) -> None:
    link = root / "sys/class/hwmon" / f"hwmon{number}"
    chip = link.resolve()
    link.unlink()
    shutil.rmtree(chip)


def register_zone(root: Path, number: int, zone_type: str, millic: int) -> None:
    zone = root / f"sys/class/thermal/thermal_zone{number}"
    zone.mkdir(parents=True)
    (zone / "type").write_text(zone_type + "\n")
    (zone / "temp").write_text(f"{millic}\n")


def register_rapl(root: Path, number: int, name: str, counter: int) -> None:
    zone = root / f"sys/class/powercap/intel-rapl:{number}"
    zone.mkdir(parents=True)
    (zone / "name").write_text(name + "\n")
    (zone / "energy_uj").write_text(f"{counter}\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")


NVME0 = "pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0"
NVME1 = "pci0000:00/0000:00:1d.4/0000:3e:00.0/nvme/nvme1"


def test_a_second_chip_of_a_driver_is_named_by_its_device(tmp_path):
    register_hwmon(tmp_path, 1, NVME0, "nvme", 40000, "Composite")
    register_hwmon(tmp_path, 2, NVME1, "nvme", 41000, "Composite")
    register_hwmon(tmp_path, 3, "platform/coretemp.0", "coretemp", 60000, "Package id 0")
    hwmon = Hwmon(str(tmp_path))
    assert hwmon.discover()["sensors"] == [
        "coretemp@coretemp.0/Package id 0",
        "nvme@nvme0/Composite",
        "nvme@nvme1/Composite",
    ]
    assert HwmonPower(str(tmp_path)).discover()["sensors"][0] == "hwmon/coretemp@coretemp.0/power1 W"


def test_a_renumbered_chip_keeps_its_name_and_never_lends_it(tmp_path):
    """nvme0 goes away, an amdgpu registers as its hwmon1, nvme0 comes back as hwmon3."""
    register_hwmon(tmp_path, 1, NVME0, "nvme", 40000, "Composite")
    register_hwmon(tmp_path, 2, NVME1, "nvme", 41000, "Composite")
    hwmon = Hwmon(str(tmp_path))
    hwmon.discover()
    unregister_hwmon(tmp_path, 1)
    assert dict((s, v) for s, v, _ in hwmon.sample()) == {"nvme@nvme1/Composite": 41.0}
    register_hwmon(tmp_path, 1, "pci0000:00/0000:00:01.1/0000:03:00.0", "amdgpu", 70000, "edge")
    assert dict((s, v) for s, v, _ in hwmon.sample()) == {
        "amdgpu@0000:03:00.0/edge": 70.0,
        "nvme@nvme1/Composite": 41.0,
    }
    register_hwmon(tmp_path, 3, NVME0, "nvme", 40000, "Composite")
    assert dict((s, v) for s, v, _ in hwmon.sample())["nvme@nvme0/Composite"] == 40.0, "read again once back"


def test_zones_policies_and_rapl_zones_follow_their_devices(tmp_path):
    register_zone(tmp_path, 0, "x86_pkg_temp", 50000)
    register_zone(tmp_path, 1, "nvme", 40000)
    register_rapl(tmp_path, 0, "package-0", 1000)
    register_rapl(tmp_path, 1, "package-1", 2000)
    for cpu in (0, 1):
        policy = tmp_path / f"sys/devices/system/cpu/cpufreq/policy{cpu}"
        policy.mkdir(parents=True)
        (policy / "scaling_cur_freq").write_text(f"{(cpu + 1) * 1000000}\n")
    zones, rapl, freq = ThermalZones(str(tmp_path)), RaplPower(str(tmp_path)), CpuFrequency(str(tmp_path))
    for source in (zones, rapl, freq):
        source.discover()
    shutil.rmtree(tmp_path / "sys/class/thermal/thermal_zone1")
    register_zone(tmp_path, 1, "iwlwifi_1", 45000)
    assert dict((s, v) for s, v, _ in zones.sample()) == {"x86_pkg_temp": 50.0, "iwlwifi_1": 45.0}
    shutil.rmtree(tmp_path / "sys/class/powercap/intel-rapl:0")
    shutil.rmtree(tmp_path / "sys/class/powercap/intel-rapl:1")
    register_rapl(tmp_path, 0, "package-1", 2001)  # the driver reloaded, numbering anew
    assert [(s.split()[0], v) for s, v, _ in rapl.sample()] == [("package-1", 2001)]
    shutil.rmtree(tmp_path / "sys/devices/system/cpu/cpufreq/policy1")  # CPU 1 offline
    assert freq.sample() == [("cpu0", 1000.0, "")]


def run_agent(root: Path, out: Path, intervals: dict) -> subprocess.Popen:
    (root / "proc").mkdir(exist_ok=True)
    settings = root / "settings.json"
    settings.write_text(
        json.dumps(
            {
                "out_dir": str(out),
                "sys_root": str(root),
                "proc_root": str(root / "proc"),
                "stop_file": str(root / "stop"),
                "process_pattern": "no-such-process-xyz",
                "intervals": intervals,
            }
        )
    )
    return subprocess.Popen(
        [sys.executable, str(deploy.AGENT_SOURCE), "--config", str(settings)], stderr=subprocess.PIPE, text=True
    )


def test_devices_swapped_under_a_running_agent_never_trade_names(tmp_path):
    """A real agent sampling every 50 ms while, one after another, the device under hwmon1
    and thermal_zone1 is replaced by a new one, each reading a value of its own; at the end
    the first device comes back under another number.  Every row's value is its device's."""
    root, out = tmp_path / "node", tmp_path / "out"
    expected_hwmon = {"nvme@nvme1/Composite": 41.0}
    expected_zone = {"x86_pkg_temp": 50.0}
    register_hwmon(root, 2, NVME1, "nvme", 41000, "Composite")
    register_zone(root, 0, "x86_pkg_temp", 50000)
    agent = run_agent(root, out, {"hwmon": 0.05, "hwmon_power": 0.05, "thermal": 0.05, "cpu": 5, "freq": 5})
    try:
        for k in range(12):
            millic = 60000 + k * 1000
            register_hwmon(root, 1, f"pci0000:00/0000:00:01.1/0000:{k + 3:02x}:00.0", "amdgpu", millic, "edge")
            expected_hwmon[f"amdgpu@0000:{k + 3:02x}:00.0/edge"] = millic / 1000
            register_zone(root, 1, f"dev{k}", millic)
            expected_zone[f"dev{k}"] = millic / 1000
            time.sleep(0.12)
            unregister_hwmon(root, 1)
            shutil.rmtree(root / "sys/class/thermal/thermal_zone1")
        register_hwmon(root, 3, NVME0, "nvme", 40000, "Composite")
        expected_hwmon["nvme@nvme0/Composite"] = 40.0
        assert wait_until(
            lambda: (
                (out / "hwmon.csv").exists()
                and any(r["sensor"] == "nvme@nvme0/Composite" for r in csv_rows(out / "hwmon.csv"))
            ),
            timeout=30,
        )
        (root / "stop").touch()
        assert agent.wait(timeout=30) == 0, agent.stderr.read()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    chips = {sensor.split("/")[0]: value for sensor, value in expected_hwmon.items()}
    for stem, expected, name_of in (
        ("hwmon", chips, lambda s: s.split("/")[0]),
        ("hwmon_power", chips, lambda s: s.split("/")[1]),
        ("thermal", expected_zone, lambda s: s),
    ):
        rows = [r for r in csv_rows(out / f"{stem}.csv") if r["value"]]
        for row in rows:
            assert float(row["value"]) == pytest.approx(expected[name_of(row["sensor"])]), (stem, row)
        assert len({r["sensor"] for r in rows}) > 3, f"{stem}: the swapped devices were read"


def test_cpufreq_without_the_scaling_file_reads_the_hardwares_or_says_why(tmp_path):
    """A driver without ``scaling_cur_freq`` (nor GB10's ``cpuinfo_avg_freq``): the
    hardware's ``cpuinfo_cur_freq`` is read, and where it cannot be (root's alone) the value
    is missing with the reason; a policy with none of the files is named, not dropped."""
    base = tmp_path / "sys/devices/system/cpu/cpufreq"
    for number, files in [
        (0, {"cpuinfo_cur_freq": "2100000"}),
        (1, {"cpuinfo_cur_freq": "2200000"}),
        (2, {"scaling_governor": "performance"}),
    ]:
        (base / f"policy{number}").mkdir(parents=True)
        for name, text in files.items():
            (base / f"policy{number}" / name).write_text(text + "\n")
    freq = CpuFrequency(str(tmp_path))
    assert freq.discover() == {
        "policies": {"cpu0": "cpuinfo_cur_freq", "cpu1": "cpuinfo_cur_freq"},
        "unread": ["policy2"],
    }
    (base / "policy1/cpuinfo_cur_freq").chmod(0)
    rows = {sensor: (value, reason) for sensor, value, reason in freq.sample()}
    assert rows["cpu0"] == (2100.0, "")
    if os.geteuid() != 0:  # root reads a file of mode 0 all the same
        assert rows["cpu1"][0] is None and "Permission denied" in rows["cpu1"][1]


def unregister_meter(root: Path, number: int) -> None:
    """The driver lets go of an ACPI meter: its hwmon chip and the attributes on the device go."""
    link = root / "sys/class/hwmon" / f"hwmon{number}"
    device = link.resolve().parent.parent
    link.unlink()
    shutil.rmtree(device)


def test_acpi_meters_faulting_and_renumbered_under_a_running_agent(tmp_path):
    """A GH200 node's meters (files in hwmonN/device/) under a real agent sampling every 50 ms:
    the module meter reads ACPI's unknown for a while, the Grace meter's driver lets go and
    binds again under another number, and another meter takes the freed number.  Every value
    written is its own meter's; the unknown reading is empty with its reason."""
    root, out = tmp_path / "node", tmp_path / "out"
    files = power_trees.gh200(root, sockets=1)
    module = "hwmon/power_meter@ACPI000D:00/Module Power Socket 0"
    grace = "hwmon/power_meter@ACPI000D:01/Grace Power Socket 0"
    other = "hwmon/power_meter@ACPI000D:09/Grace Power Socket 1"
    expected = {module: 650.0, grace: 180.0, other: 111.0}
    expected["hwmon/power_meter@ACPI000D:02/CPU Power Socket 0"] = 120.0
    expected["hwmon/power_meter@ACPI000D:03/SysIO Power Socket 0"] = 30.0
    process = run_agent(root, out, {"hwmon_power": 0.05, "hwmon": 5, "thermal": 5, "cpu": 5, "freq": 5})
    try:
        assert wait_until(lambda: (out / "hwmon_power.csv").exists(), timeout=30)
        files["Module Power Socket 0"].write_text(f"{power_trees.ACPI_UNKNOWN_UW}\n")
        unregister_meter(root, 1)
        power_trees.acpi_meter(root, 1, 9, "Grace Power Socket 1", 111_000_000, in_device=True)
        time.sleep(0.3)
        power_trees.acpi_meter(root, 7, 1, "Grace Power Socket 0", 180_000_000, in_device=True)
        files["Module Power Socket 0"].write_text("650000000\n")
        assert wait_until(
            lambda: (
                sum(r["sensor"] == f"{grace} W" and bool(r["value"]) for r in csv_rows(out / "hwmon_power.csv")) > 3
            ),
            timeout=30,
        )
        (root / "stop").touch()
        assert process.wait(timeout=30) == 0, process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    rows = csv_rows(out / "hwmon_power.csv")
    for row in rows:
        if row["value"]:
            assert float(row["value"]) == pytest.approx(expected[row["sensor"][: -len(" W")]]), row
    reasons = {r["reason"] for r in rows if r["sensor"] == f"{module} W" and not r["value"]}
    assert "no reading: 0xFFFFFFFF (ACPI's unknown)" in reasons
    assert {r["sensor"] for r in rows if r["value"]} >= {f"{module} W", f"{grace} W", f"{other} W"}


def test_jetson_rails_with_faults_between_samples(tmp_path):
    """A Jetson AGX Orin's rails: a current that is not a number, a current beyond any rail,
    then the second monitor unbound (its rail gone, the others read on)."""
    chips = power_trees.jetson_agx_orin(tmp_path)
    source = HwmonPower(str(tmp_path))
    source.discover()
    gpu, ddr = "hwmon/ina3221@1-0040/VDD_GPU_SOC W", "hwmon/ina3221@1-0041/VDDQ_VDD2_1V8AO W"
    (chips["1-0040"] / "curr1_input").write_text("garbage\n")
    rows = {s: (v, r) for s, v, r in source.sample()}
    assert rows[gpu] == (None, "not a number: 'garbage'")
    (chips["1-0040"] / "curr1_input").write_text("400000\n")  # 400 A at 5 V: 2 kW on one rail
    assert "implausible for a rail domain" in dict((s, r) for s, _, r in source.sample())[gpu]
    (chips["1-0040"] / "curr1_input").write_text("1600\n")
    link = tmp_path / "sys/class/hwmon/hwmon1"
    link.unlink()
    shutil.rmtree(chips["1-0041"].parent.parent)
    rows = {s: (v, r) for s, v, r in source.sample()}
    assert ddr not in rows and rows[gpu] == (pytest.approx(4.984 * 1.6), "")


def test_altra_and_gb200_chips_renumbered_and_faulting_between_samples(tmp_path):
    """An Ampere Altra's second socket reads an impossible IO power, then binds again under
    another number; a GB200 host's Grace meter (files in hwmonN) fails a read."""
    altra, gb200 = tmp_path / "altra", tmp_path / "gb200"
    files = power_trees.ampere_altra(altra)
    source = HwmonPower(str(altra))
    source.discover()
    io = "hwmon/apm_xgene@APMC0D8A:01/IO power W"
    (files["APMC0D8A:01"].parent / "power2_input").write_text("4500000000\n")  # 4.5 kW on one socket's IO
    assert "implausible for a cpu domain: 4500.0 W" in dict((s, r) for s, _, r in source.sample())[io]
    chip = files["APMC0D8A:01"].parent
    (altra / "sys/class/hwmon/hwmon1").unlink()
    moved = chip.parent / "hwmon5"
    chip.rename(moved)
    (moved / "power2_input").write_text("31100000\n")
    (altra / "sys/class/hwmon/hwmon5").symlink_to(os.path.relpath(moved, altra / "sys/class/hwmon"))
    assert dict((s, v) for s, v, _ in source.sample())[io] == 31.1, "the same socket under another number"
    meters = power_trees.gb200(gb200)
    source = HwmonPower(str(gb200))
    grace1 = "hwmon/power_meter@ACPI000D:03/Grace Power Socket 1 W"
    assert grace1 in source.discover()["sensors"]
    meters["Grace Power Socket 1"].unlink()
    meters["Grace Power Socket 1"].mkdir()  # a read that fails (EISDIR) while the meter stays
    rows = {s: (v, r) for s, v, r in source.sample()}
    assert rows[grace1][0] is None and rows[grace1][1].startswith("unreadable")
    assert rows["hwmon/power_meter@ACPI000D:00/Grace Power Socket 0 W"] == (200.0, "")
    meters["Grace Power Socket 1"].rmdir()
    meters["Grace Power Socket 1"].write_text("205000000\n")
    assert dict((s, v) for s, v, _ in source.sample())[grace1] == 205.0
