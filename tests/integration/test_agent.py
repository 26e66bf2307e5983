"""The telemetry agent on fixture sysfs trees, run for real as a detached process."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.node_trees import GB10_ZONES, csv_rows, fake_process, hand_out, make_gb10
from support.paths import DATA
from support.processes import processes_in, wait_until
from thermab.config import HostSpec
from thermab.contracts import Preflight
from thermab.hosts.host import Host
from thermab.telemetry import deploy, ingest
from thermab.telemetry.agent import CpuFrequency, ProcessCpu, ThermalZones, parse_millidegrees, zone_name


def test_zone_names_follow_the_device_path():
    assert zone_name("\\_TZ_.TSOC", "acpitz", 0, {}) == "TSOC"
    assert zone_name("", "x86_pkg_temp", 3, {}) == "x86_pkg_temp"
    assert zone_name("", "acpitz", 4, {"acpitz": "..."}) == "acpitz_1", "an ordinal, not the kernel's number"
    assert zone_name("", "acpitz", 4, {"acpitz": "...", "acpitz_1": "..."}) == "acpitz_2"
    assert zone_name("", "iwlwifi_1", 9, {"iwlwifi_1": "..."}, "0000:00:14.3") == "iwlwifi_1@0000:00:14.3"


@pytest.mark.parametrize(
    "text, value, reason",
    [
        ("89600", 89.6, ""),
        ("garbage", None, "not a number"),
        ("-273000", None, "implausible"),
        ("151000", None, "implausible"),
    ],
)
def test_bad_readings_become_missing_with_a_reason(text, value, reason):
    parsed, why = parse_millidegrees(text)
    assert parsed == value and reason in why


def test_gb10_tree_discovery_and_samples(tmp_path):
    make_gb10(tmp_path, {"TSOC": 89600})
    (tmp_path / "sys/class/thermal/thermal_zone1/temp").write_text("n/a\n")
    zones = ThermalZones(str(tmp_path))
    found = zones.discover()
    assert found["zones"] == sorted(GB10_ZONES) and found["trip_points_c"]["TSOC"] == 104.8
    samples = {name: (value, reason) for name, value, reason in zones.sample()}
    assert samples["TSOC"] == (89.6, "")
    assert samples["TS0E"][0] is None and "not a number" in samples["TS0E"][1]
    freq = CpuFrequency(str(tmp_path))
    policies = freq.discover()["policies"]
    assert policies["cpu0"] == "scaling_cur_freq" and policies["cpu5"] == "cpuinfo_avg_freq"
    assert dict((s, v) for s, v, _ in freq.sample())["cpu15"] == 3978.0


def test_process_cpu_counts_a_busy_process(tmp_path):
    marker = f"thermab-test-burner-{os.getpid()}"
    burner = subprocess.Popen([sys.executable, "-c", "import sys\nwhile True: pass", marker])
    try:
        source = ProcessCpu(marker)
        deadline = time.monotonic() + 10
        while not source.matching_pids() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the child has exec'd and carries the marker
        source.sample()
        before, start = stat_ticks(burner.pid), time.time()
        time.sleep(1.5)
        rows = dict((s, v) for s, v, _ in source.sample())
        after, elapsed = stat_ticks(burner.pid), time.time() - start
    finally:
        burner.kill()
        burner.wait()
    assert rows["vllm_processes"] == 1
    # the share the busy loop got of a core (on a loaded machine far from all of it), read
    # on its own around the same interval
    independent = 100.0 * (after - before) / os.sysconf("SC_CLK_TCK") / elapsed
    assert rows["vllm_cpu_pct"] > 0
    assert rows["vllm_cpu_pct"] == pytest.approx(independent, abs=max(5.0, 0.2 * independent))


def stat_ticks(pid: int) -> int:
    """utime+stime of a process from /proc, read without the agent."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def test_agent_runs_detached_appends_on_restart_and_is_ingested(tmp_path):
    root = tmp_path / "node"
    make_gb10(root)
    spec = HostSpec("head", "t", "local", {}, root, simulated="head")
    host = Host(spec)
    settings = {"process_pattern": "no-such-process-xyz", "intervals": {"thermal": 0.2, "cpu": 0.2, "freq": 0.5}}
    pid = deploy.start_agent(host, "t-AB", settings)
    try:
        assert deploy.start_agent(host, "t-AB", settings) == pid, "a running agent is reused"
        time.sleep(1.0)
        assert deploy.latest(host, "t-AB", "thermal")["TSOC"] == 50.0
    finally:
        deploy.stop_agent(host, "t-AB")
    assert deploy.agent_pid(host, "t-AB") is None
    directory = Path(deploy.session_dir(host, "t-AB"))
    rows_first = len((directory / "thermal.csv").read_text().splitlines())
    pid2 = deploy.start_agent(host, "t-AB", settings)
    time.sleep(0.6)
    deploy.stop_agent(host, "t-AB")
    assert pid2 != pid
    text = (directory / "thermal.csv").read_text().splitlines()
    assert text[0] == "t,sensor,value,reason" and text.count(text[0]) == 1, "restart appends, one header"
    assert len(text) > rows_first
    starts = [line for line in (directory / "agent_events.csv").read_text().splitlines() if ",agent_start," in line]
    assert len(starts) == 2, "the restart (and so the gap) is marked"
    pulled = deploy.pull(host, "t-AB", tmp_path / "run/monitor/head")
    assert {p.name for p in pulled} >= {"thermal.csv", "freq.csv", "agent.json"}
    tidy, dropped = ingest.telemetry(tmp_path / "run/monitor", {"head": 0.0})
    assert set(tidy["kind"]) >= {"thermal", "freq"}
    assert set(tidy[tidy["kind"] == "thermal"]["sensor"]) == set(GB10_ZONES)
    assert list(tidy.columns) == ["t", "host", "kind", "sensor", "value"]
    assert json.loads((directory / "agent.json").read_text())["pid"] == pid2


def test_ingest_follows_a_clock_that_drifts(tmp_path):
    """Offsets +0 s at preflight (controller t = 1000) and +10 s at the end (t = 2000): a
    sample between is moved by the offset of its time, not by the mean of the two."""
    host_dir = tmp_path / "monitor/head"
    host_dir.mkdir(parents=True)
    (host_dir / "thermal.csv").write_text("t,sensor,value,reason\n900.0,TSOC,1,\n1505.0,TSOC,2,\n2100.0,TSOC,3,\n")
    clocks = ingest.host_offsets(
        Preflight(t=1000.0, clock_offset_s={"head": 0.0}), {"t": 2000.0, "clock_offset_end_s": {"head": 10.0}}
    )
    tidy, _dropped = ingest.telemetry(tmp_path / "monitor", clocks)
    assert list(tidy["t"]) == [900.0, 1500.0, 2090.0], "interpolated between, the nearest held outside"
    assert clocks["head"].record() == {"at_s": [1000.0, 2000.0], "offset_s": [0.0, 10.0]}
    without_times = ingest.host_offsets(Preflight(clock_offset_s={"head": 0.0}), {"clock_offset_end_s": {"head": 10.0}})
    assert list(ingest.telemetry(tmp_path / "monitor", without_times)[0]["t"]) == [895.0, 1500.0, 2095.0]


def test_ingest_counts_malformed_rows_and_events_out_of_order(tmp_path):
    host_dir = tmp_path / "monitor/head"
    host_dir.mkdir(parents=True)
    (host_dir / "thermal.csv").write_text(
        "t,sensor,value,reason\n"
        "100.0,TSOC,80.5,\n"
        "101.0,TSOC,,unreadable: Permission denied\n"
        "102.0,TSOC,not-a-number\n"  # a row cut short by a crash
        "103.0,TSOC,81.0,,extra,fields\n"
        "xx,TSOC,82.0,\n"
        "103.5,TSOC,inf,\n"
        "inf,TSOC,82.0,\n"
        "104.0,TSOC,82.5,\n"
    )
    tidy, dropped = ingest.telemetry(tmp_path / "monitor", {"head": 10.0})
    assert list(tidy["value"]) == [80.5, 82.5] and list(tidy["t"]) == [90.0, 94.0]
    assert dropped["head/thermal: not a finite number"] == 2
    assert dropped["head/thermal: unreadable: Permission denied"] == 1
    assert dropped["head/thermal: wrong number of fields"] == 1
    assert dropped["head/thermal: malformed row"] == 2
    from thermab.experiment.events import read_checked

    (tmp_path / "events.jsonl").write_text(
        '{"t": 5, "event": "load_start"}\n{"t": 3, "event": "run_start"}\n'
        '{"t": 9, "ev\n\n{"t": 7, "event": "load_end"}\n'
    )
    records, problems = read_checked(tmp_path / "events.jsonl")
    assert [r["event"] for r in records] == ["load_start", "run_start", "load_end"]
    assert problems == {"malformed_lines": 1, "out_of_order": 1}


def make_x86(root: Path) -> None:
    """An x86 server: coretemp and nvme through hwmon, no ACPI thermal zones."""
    coretemp = root / "sys/class/hwmon/hwmon1"
    coretemp.mkdir(parents=True)
    (coretemp / "name").write_text("coretemp\n")
    for index, (label, milli) in enumerate([("Package id 0", 61000), ("Core 0", 58000)], start=1):
        (coretemp / f"temp{index}_input").write_text(f"{milli}\n")
        (coretemp / f"temp{index}_label").write_text(f"{label}\n")
    nvme = root / "sys/class/hwmon/hwmon2"
    nvme.mkdir(parents=True)
    (nvme / "name").write_text("nvme\n")
    (nvme / "temp1_input").write_text("39850\n")
    (root / "sys/class/thermal").mkdir(parents=True)


def test_x86_host_reads_hwmon_and_has_no_zones(tmp_path):
    from thermab.telemetry.agent import Hwmon

    make_x86(tmp_path)
    assert ThermalZones(str(tmp_path)).discover()["zones"] == []
    hwmon = Hwmon(str(tmp_path))
    assert hwmon.available()
    assert hwmon.discover()["sensors"] == ["coretemp/Core 0", "coretemp/Package id 0", "nvme/temp1"]
    assert dict((s, v) for s, v, _ in hwmon.sample()) == {
        "coretemp/Core 0": 58.0,
        "coretemp/Package id 0": 61.0,
        "nvme/temp1": 39.85,
    }


def test_a_zone_appearing_mid_run_is_picked_up(tmp_path):
    make_gb10(tmp_path)
    zones = ThermalZones(str(tmp_path))
    zones.discover()
    extra = tmp_path / "sys/class/thermal/thermal_zone7"
    extra.mkdir()
    (extra / "type").write_text("nvme\n")
    (extra / "temp").write_text("41000\n")
    assert dict((s, v) for s, v, _ in zones.sample())["nvme"] == 41.0
    import shutil

    shutil.rmtree(extra)
    assert "nvme" not in dict((s, v) for s, v, _ in zones.sample())


def test_nvidia_smi_output_is_parsed_with_missing_fields():
    from thermab.telemetry.agent import parse_nvidia_smi

    rows = parse_nvidia_smi("0, 45, 1980, 72.31, 88\n1, 51, [N/A], [N/A], 0\n")
    values = {s: (v, r) for s, v, r in rows}
    assert values["gpu0_temp_c"] == (45.0, "") and values["gpu0_power_w"] == (72.31, "")
    assert values["gpu1_sm_clock_mhz"][0] is None and "N/A" in values["gpu1_sm_clock_mhz"][1]


H200 = DATA / "nvidia-smi-h200"  # real output: see its README.md


def test_a_real_h200s_nvidia_smi_output_is_parsed(tmp_path, monkeypatch):
    """What nvidia-smi 580 printed on an H200, idle and under a matmul load, through the
    agent's parser; the same query with a header and units is no row (the agent asks
    for neither); and the refusal of the energy field, which this driver prints on
    stdout with exit 2, replayed by a stand-in nvidia-smi: the power source falls back to
    power.draw alone and names where its counter will come from."""
    from thermab.telemetry.agent import NvidiaPower, parse_nvidia_smi

    expected = {"idle": (39.0, 345.0, 79.31, 0.0), "load": (63.0, 1485.0, 689.31, 99.0)}
    for state, values in expected.items():
        rows = parse_nvidia_smi((H200 / f"nvidia-smi-{state}.csv").read_text())
        assert rows == [
            (f"gpu0_{sensor}", value, "")
            for sensor, value in zip(("temp_c", "sm_clock_mhz", "power_w", "util_pct"), values, strict=False)
        ], state
    rows = parse_nvidia_smi((H200 / "nvidia-smi-idle-units.csv").read_text())
    assert rows[0][0] == "gpu_parse_error" and rows[0][2].startswith("unexpected line: index, temperature.gpu")
    assert [r for _, _, r in rows[1:]] == ["", "not reported: 345 MHz", "not reported: 79.31 W", "not reported: 0 %"]
    refused = H200 / "power-energy-refused.txt"
    fake_nvidia_smi(
        tmp_path,
        monkeypatch,
        f'case "$1" in *total_energy_consumption*) cat "{refused}"; exit 2;; esac\necho "0, 79.31"\n',
    )
    power = NvidiaPower("/")
    found = power.discover()
    assert found["fields"] == ["index", "power.draw"] and found["sensors"] == ["gpu0 W"]
    assert found["energy_counter"] in ("NVML", None)  # NVML where this machine has the library
    assert power.rows_of(2, refused.read_text(), "") == [
        ("gpu_power_error", None, 'exit 2: Field "total_energy_consumption" is not a valid field to query.')
    ]


def test_busiest_threads_are_attributed_to_a_core(tmp_path):
    marker = f"thermab-thread-burner-{os.getpid()}"
    code = (
        "import threading\ndef spin():\n    while True: pass\n"
        "threading.Thread(target=spin, daemon=True).start()\nimport time\ntime.sleep(60)"
    )
    burner = subprocess.Popen([sys.executable, "-c", code, marker])
    try:
        source = ProcessCpu(marker)
        deadline = time.monotonic() + 10
        while not source.matching_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert wait_until(lambda: len(os.listdir(f"/proc/{burner.pid}/task")) == 2, timeout=10), "it spins"
        source.sample()
        time.sleep(1.5)
        rows = [(s, v) for s, v, _ in source.sample() if s.startswith("thread ")]
    finally:
        burner.kill()
        burner.wait()
    assert rows, "the spinning thread is listed"
    name, value = rows[0]
    assert value > 0 and re.match(r"thread \S+ \d+ cpu\d+$", name)  # its share: what the machine's load left


# -- the agent never dies of a reading ------------------------------------------------------------


def fake_nvidia_smi(tmp_path, monkeypatch, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + script)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_a_hanging_nvidia_smi_is_a_missing_value_and_delays_nothing(tmp_path, monkeypatch):
    """This machine's agent (GPUs are read only where the agent reads the machine itself)
    with an nvidia-smi that hangs: the GPU rows say so after the timeout while /proc/stat
    keeps being sampled beside it."""
    fake_nvidia_smi(tmp_path, monkeypatch, "exec sleep 600\n")
    out = tmp_path / "out"
    settings = tmp_path / "settings.json"
    settings.write_text(
        json.dumps(
            {
                "out_dir": str(out),
                "stop_file": str(tmp_path / "stop"),
                "process_pattern": "no-such-process-xyz",
                "intervals": {"gpu": 0.2, "gpu_power": 0.2, "system": 0.2},
            }
        )
    )
    agent = subprocess.Popen(
        [sys.executable, str(deploy.AGENT_SOURCE), "--config", str(settings)], stderr=subprocess.PIPE, text=True
    )
    try:
        assert wait_until(lambda: (out / "gpu.csv").exists(), timeout=60), "the timeout is recorded"
        (tmp_path / "stop").touch()
        assert agent.wait(timeout=30) == 0, agent.stderr.read()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    gpu = csv_rows(out / "gpu.csv")
    assert gpu[0]["value"] == "" and gpu[0]["reason"] == "no result: nvidia-smi timed out after 5 s"
    # a run is stamped with its middle: it hung from 2.5 s before that to 2.5 s after (timeout_s 5)
    hung_from, hung_to = float(gpu[0]["t"]) - 2.5, float(gpu[0]["t"]) + 2.5
    during = [r for r in csv_rows(out / "system.csv") if hung_from < float(r["t"]) < hung_to]
    assert len({r["t"] for r in during}) > 1, "/proc/stat was sampled while nvidia-smi hung"
    assert wait_until(lambda: processes_in(tmp_path) == []), "the hung command ends with the agent"


LOST_GPU = (
    "0, 45, 1980, 72.31, 88\n"
    "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n"
    "2, 51, 1410, 65.00, 12\n"
)


def test_a_gpu_off_the_bus_keeps_the_others_rows_and_is_named(tmp_path, monkeypatch):
    from thermab.telemetry.agent import NvidiaGpu, NvidiaPower

    fake_nvidia_smi(
        tmp_path, monkeypatch, f"printf '{LOST_GPU}'\nprintf 'see the kernel log\\nline two\\n' >&2\nexit 15\n"
    )
    rows = {s: (v, r) for _, s, v, r in NvidiaGpu("/").measure()}
    assert rows["gpu0_temp_c"] == (45.0, "") and rows["gpu2_util_pct"] == (12.0, "")
    assert rows["gpu_error 0000:3b:00.0"] == (
        None,
        "exit 15: Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error",
    )
    assert not [s for s in rows if "parse_error" in s], "the error line is the failure, not a parse error"
    power = NvidiaPower("/")
    power.fields = ("index", "power.draw")
    fake_nvidia_smi(
        tmp_path,
        monkeypatch,
        "printf '0, 72.31\\nUnable to determine the device handle for GPU00000000:3B:00.0: GPU is lost\\n'\nexit 15\n",
    )
    rows = {s: (v, r) for _, s, v, r in power.measure()}
    assert rows["gpu0 W"] == (72.31, "") and rows["gpu_power_error 00000000:3b:00.0"][0] is None


@pytest.mark.parametrize(
    "script, reason",
    [
        (
            "printf 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.\\n"
            "Make sure that the latest NVIDIA driver is installed and running.\\n'\nexit 9\n",
            "exit 9: NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.",
        ),
        ("exit 3\n", "exit 3"),
    ],
)
def test_a_failed_command_is_one_row_with_a_category_and_its_first_line(tmp_path, monkeypatch, script, reason):
    from thermab.telemetry.agent import NvidiaGpu

    fake_nvidia_smi(tmp_path, monkeypatch, script)
    assert [(s, v, r) for _, s, v, r in NvidiaGpu("/").measure()] == [("gpu_error", None, reason)]


def test_a_simulated_node_never_reads_the_machines_gpus(tmp_path, monkeypatch):
    from thermab.telemetry.agent import SOURCES, CommandSource, discover_all

    fake_nvidia_smi(tmp_path, monkeypatch, f"printf '{LOST_GPU}'\n")
    make_gb10(tmp_path / "node")
    commands = [source(str(tmp_path / "node")) for source in SOURCES if issubclass(source, CommandSource)]
    assert commands and not [source.name for source in commands if source.available()]
    found = discover_all(str(tmp_path / "node"))
    assert found["gpu"] is None and found["gpu_power"] is None
    assert found["thermal"]["zones"]


def test_cpufreq_falls_back_per_sample(tmp_path):
    make_gb10(tmp_path)
    freq = CpuFrequency(str(tmp_path))
    freq.discover()
    (tmp_path / "sys/devices/system/cpu/cpufreq/policy7/cpuinfo_avg_freq").write_text("busy\n")
    assert dict((s, v) for s, v, _ in freq.sample())["cpu7"] == 3900.0, "scaling_cur_freq stands in"
    (tmp_path / "sys/devices/system/cpu/cpufreq/policy7/cpuinfo_avg_freq").write_text("3978000\n")
    assert dict((s, v) for s, v, _ in freq.sample())["cpu7"] == 3978.0, "and only for that sample"
    (tmp_path / "sys/devices/system/cpu/cpufreq/policy7/scaling_cur_freq").write_text("\n")
    (tmp_path / "sys/devices/system/cpu/cpufreq/policy7/cpuinfo_avg_freq").write_text("\n")
    value, reason = next((v, r) for s, v, r in freq.sample() if s == "cpu7")
    assert value is None and "cpuinfo_avg_freq" in reason and "scaling_cur_freq" in reason


def test_a_zone_is_renamed_when_its_device_path_appears(tmp_path):
    make_gb10(tmp_path)
    zone = tmp_path / "sys/class/thermal/thermal_zone3"
    (zone / "device/path").unlink()
    zones = ThermalZones(str(tmp_path))
    assert "acpitz" in zones.discover()["zones"], "named after its type while it has no path"
    (zone / "device/path").write_text("\\_TZ_.TS1E\n")
    names = {s for s, _v, _r in zones.sample()}
    assert "TS1E" in names and "acpitz" not in names


def run_agent(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(deploy.AGENT_SOURCE), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_the_agent_never_overwrites_its_own_settings(tmp_path):
    settings = tmp_path / "agent.json"
    text = json.dumps({"out_dir": str(tmp_path), "intervals": {"thermal": 1}})
    settings.write_text(text)
    result = run_agent(settings, tmp_path)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "agent.json" in result.stderr and "Traceback" not in result.stderr
    assert settings.read_text() == text


@pytest.mark.parametrize(
    "settings, fragment",
    [
        ({"out_dir": ".", "process_pattern": "vllm("}, "process_pattern 'vllm(': not a regular expression"),
        ({"out_dir": ".", "intervals": {"thermal": 0}}, "intervals.thermal"),
        ({"intervals": {}}, "out_dir"),
        ("not json", "not JSON"),
    ],
)
def test_unusable_settings_stop_the_agent_once_in_one_line(tmp_path, settings, fragment):
    path = tmp_path / "settings.json"
    path.write_text(settings if isinstance(settings, str) else json.dumps(settings))
    result = run_agent(path, tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1 and fragment in result.stderr


def test_an_agent_stopping_at_start_is_reported_not_restarted(tmp_path):
    root = tmp_path / "node"
    make_gb10(root)
    host = Host(HostSpec("head", "t", "local", {}, root, simulated="head"))
    with pytest.raises(deploy.AgentError, match="host head: the agent stopped at start: .*process_pattern"):
        deploy.start_agent(host, "t-bad", {"process_pattern": "vllm(", "intervals": {"thermal": 1}})
    assert deploy.agent_pid(host, "t-bad") is None


def test_a_bad_proc_stat_is_a_missing_value_and_the_others_go_on(tmp_path):
    root = tmp_path / "node"
    make_gb10(root)
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text("cpu\n")  # too short to hold a CPU's times
    (proc / "loadavg").write_text("0.5 0.4 0.3 1/100 1\n")
    settings = tmp_path / "settings.json"
    settings.write_text(
        json.dumps(
            {
                "out_dir": str(tmp_path / "out"),
                "sys_root": str(root),
                "proc_root": str(proc),
                "stop_file": str(tmp_path / "stop"),
                "process_pattern": "x",
                "intervals": {"thermal": 0.2, "system": 0.2, "cpu": 0.2, "freq": 0.2},
            }
        )
    )
    agent = subprocess.Popen(
        [sys.executable, str(deploy.AGENT_SOURCE), "--config", str(settings)], stderr=subprocess.PIPE, text=True
    )
    try:
        assert wait_until(
            lambda: (tmp_path / "out/system.csv").exists() and len(csv_rows(tmp_path / "out/system.csv")) >= 6
        )
        (tmp_path / "stop").touch()
        assert agent.wait(timeout=30) == 0, agent.stderr.read()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    system = csv_rows(tmp_path / "out/system.csv")
    busy = [r for r in system if r["sensor"] == "busy_pct"]
    assert busy and all(r["value"] == "" and "unreadable /proc/stat" in r["reason"] for r in busy)
    assert {r["value"] for r in system if r["sensor"] == "loadavg_1m"} == {"0.500"}, "the load average still read"
    assert len({r["t"] for r in csv_rows(tmp_path / "out/thermal.csv")}) >= 3


def test_a_source_that_raises_is_recorded_and_the_agent_goes_on(tmp_path):
    from thermab.telemetry import agent as agent_module

    class Broken(agent_module.Source):
        name = "broken"

        def sample(self):
            raise IndexError("list index out of range")

    agent = agent_module.Agent({"out_dir": str(tmp_path), "intervals": {}})
    agent.record(Broken())
    agent.record(Broken())
    rows = csv_rows(tmp_path / "broken.csv")
    assert [(r["sensor"], r["value"]) for r in rows] == [("source_error", "")] * 2
    assert all("IndexError: list index out of range" in r["reason"] for r in rows)


def test_an_odd_tree_never_breaks_a_source(tmp_path):
    """Two zones with one ACPI path, a zone without temp, a policy without a number, a
    dangling hwmon link: every zone keeps a name of its own and every source answers."""
    from thermab.telemetry.agent import SOURCES, Hwmon, discover_all

    for index, (path, temp) in enumerate([("\\_TZ_.TZ00", "40000"), ("\\_TZ_.TZ00", "41000"), ("", None)]):
        zone = tmp_path / f"sys/class/thermal/thermal_zone{index}"
        (zone / "device").mkdir(parents=True)
        if path:
            (zone / "device/path").write_text(path + "\n")
        if temp:
            (zone / "temp").write_text(temp + "\n")
    policy = tmp_path / "sys/devices/system/cpu/cpufreq/policyX"
    policy.mkdir(parents=True)
    (policy / "scaling_cur_freq").write_text("1000000\n")
    (tmp_path / "sys/class/hwmon").mkdir(parents=True)
    (tmp_path / "sys/class/hwmon/hwmon0").symlink_to(tmp_path / "gone")
    found = discover_all(str(tmp_path))
    assert found["thermal"]["zones"] == ["TZ00", "TZ00_1", "zone2"]
    zones = ThermalZones(str(tmp_path))
    zones.discover()
    samples = {s: (v, r) for s, v, r in zones.sample()}
    assert samples["TZ00"][0] == 40.0 and samples["TZ00_1"][0] == 41.0
    assert samples["zone2"][0] is None and "unreadable" in samples["zone2"][1]
    freq = CpuFrequency(str(tmp_path))
    freq.discover()
    assert freq.sample() == [("cpuX", 1000.0, "")]
    hwmon = Hwmon(str(tmp_path))
    assert hwmon.discover() == {"sensors": []} and hwmon.sample() == []
    assert {source.name for source in SOURCES} >= set(found)


# -- whatever a node's tree holds, every source answers ----------------------------------------------

JUNK = [
    "",
    "\n",
    "abc\n",
    "-5\n",
    "99999999999999999999999\n",
    "nan\n",
    "inf\n",
    "1e3\n",
    " 42000 \n",
    "\x00\x01",
    "42000\n43000\n",
    "0x10\n",
    "é\n",
]
DAMAGE = ("junk", "delete", "directory", "link loop", "dangling link")


@pytest.fixture(scope="module")
def node_tree(tmp_path_factory):
    from thermab.sim.node import create_node

    root = tmp_path_factory.mktemp("template") / "node"
    create_node(root, role="head")
    return root, sorted(p.relative_to(root) for p in (root / "sys").rglob("*") if not p.is_symlink())


def damage(path: Path, how: str, junk: str) -> None:
    if not (path.exists() or path.is_symlink()):
        return
    if how == "junk" and path.is_file():
        path.write_text(junk)
        return
    if path.is_dir() and not path.is_symlink():
        import shutil

        shutil.rmtree(path)
    else:
        path.unlink()
    if how == "directory":
        path.mkdir()
    elif how == "link loop":
        path.symlink_to(path.name)
    elif how == "dangling link":
        path.symlink_to(path.name + ".gone")


def test_every_source_answers_whatever_the_tree_holds(node_tree, tmp_path_factory):
    """Files of /sys replaced by junk, removed, turned into directories, looping or dangling
    links: no source raises, and every value is a finite number or missing with a reason."""
    import shutil

    from hypothesis import HealthCheck, given, settings, strategies as st

    from thermab.telemetry import agent

    template, files = node_tree
    work = tmp_path_factory.mktemp("damaged")

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        st.lists(
            st.tuples(st.sampled_from(files), st.sampled_from(DAMAGE), st.sampled_from(JUNK)), min_size=1, max_size=4
        )
    )
    def check(changes):
        root = work / "node"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(template, root, symlinks=True)
        for relative, how, junk in changes:
            damage(root / relative, how, junk)
        for source_class in agent.SOURCES:
            if source_class is agent.ProcessCpu or issubclass(source_class, agent.CommandSource):
                continue  # /proc and commands: not in the tree
            source = source_class(str(root), str(root / "proc"))
            if not source.available():
                continue
            source.discover()
            for _ in range(2):
                for sensor, value, reason in source.sample():
                    assert isinstance(sensor, str) and sensor
                    if value is None:
                        assert reason, sensor
                    else:
                        assert isinstance(value, (int, float)) and math.isfinite(value), (sensor, value)

    check()


# -- vLLM's processes, by their titles; matched without reading every cmdline each sample ----------


def test_the_default_pattern_matches_vllms_titles_and_commands_only():
    import yaml

    from thermab.config import SCHEMA
    from thermab.experiment.discover import PROCESS_PATTERN
    from thermab.telemetry.agent import DEFAULT_PROCESS_PATTERN

    schema = yaml.safe_load(SCHEMA.read_text())
    assert (
        schema["properties"]["monitor"]["properties"]["process_pattern"]["default"]
        == DEFAULT_PROCESS_PATTERN
        == PROCESS_PATTERN
    )
    pattern = re.compile(DEFAULT_PROCESS_PATTERN)
    for command in (
        "VLLM::EngineCore",
        "VLLM::Worker_TP0",
        "VLLM::Worker_TP1_EP1",
        "VLLM::APIServer",
        "/venv/bin/python3 /venv/bin/vllm serve deepseek-ai/DeepSeek-R1 --tensor-parallel-size 2",
        "python -m vllm.entrypoints.openai.api_server --model m",
        "python -m thermab.sim.vllm serve --node /n",
    ):
        assert pattern.search(command), command
    for command in (
        "snakemake --configfile config/examples/local-vllm-cpu.yaml",
        "pytest tests/test_vllm_cpu.py",
        "vim vllm-notes.md",
    ):
        assert not pattern.search(command), command


def test_processes_are_matched_when_they_appear_take_a_title_or_exec(tmp_path):
    """A /proc of its own: the sum is that of every matching process, whether it matched
    from the start, appeared later, took vLLM's title after it started, or exec'd into
    vLLM long after (counted from its next look, at most ``rescan_s`` later)."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "uptime").write_text("1000000.0 1.0\n")
    fake_process(proc, 10, "vllm serve m", 0)
    fake_process(proc, 11, "bash", 0)  # there at start: old, looked at every rescan_s
    source = ProcessCpu(proc_root=str(proc))
    source.rescan_s = 0.5
    source.sample()
    fake_process(proc, 10, "vllm serve m", 100)
    fake_process(proc, 12, "python -c from multiprocessing.spawn import spawn_main", 0)  # vLLM's child, untitled
    assert source.matching_pids() == ["10"]
    fake_process(proc, 12, "VLLM::EngineCore", 50)  # young: looked at again soon
    fake_process(proc, 11, "vllm serve other", 30)  # an old process exec'd: not looked at yet
    assert sorted(source.matching_pids()) == ["10", "12"]
    time.sleep(0.6)
    assert sorted(source.matching_pids()) == ["10", "11", "12"], "looked at again after rescan_s"
    fake_process(proc, 12, "sleep 9", 50)
    assert sorted(source.matching_pids()) == ["10", "11"], "a match is looked at again every sample"
    fake_process(proc, 13, "vllm serve third", 0)
    assert sorted(source.matching_pids()) == ["10", "11", "13"], "a new pid is looked at"
    shutil.rmtree(proc / "10")
    assert sorted(source.matching_pids()) == ["11", "13"], "an ended process leaves the sum"
    rows = dict((s, v) for s, v, _ in source.sample())
    assert rows["vllm_processes"] == 2


def test_census_lists_the_matched_processes_with_titles_and_cpu(tmp_path):
    """A busy process that retitled itself, as vLLM titles its engine: ``--discover
    --process-pattern`` lists it by its title, and describe_processes says so in a line."""
    # not ``VLLM::…``: the real-vLLM tier, running beside this one, would count a burner so
    # titled as its server's CPU
    marker = f"thermab-test-EngineCore_{os.getpid()}"
    burner = subprocess.Popen(["bash", "-c", f'exec -a {marker} {sys.executable} -c "while True: pass"'])
    try:
        assert wait_until(lambda: ProcessCpu(marker).matching_pids(), timeout=10)
        result = subprocess.run(
            [
                sys.executable,
                str(deploy.AGENT_SOURCE),
                "--discover",
                "--sys-root",
                str(tmp_path),
                "--process-pattern",
                marker,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        burner.kill()
        burner.wait()
    found = json.loads(result.stdout)["processes"]
    assert [p["pid"] for p in found["processes"]] == [burner.pid]
    assert found["processes"][0]["title"].startswith(marker) and found["processes"][0]["cpu_pct"] > 0
    line = deploy.describe_processes(found)
    assert line.startswith("1 match") and f"{burner.pid} {marker}" in line
    from thermab.experiment.discover import summarize_agent

    assert dict(summarize_agent({"processes": found})[0])["vLLM processes"] == line
    assert "none match" in deploy.describe_processes({"pattern": "x", "processes": [], "cpu_pct": 0})


# -- values that mean "unset" are not values ----------------------------------------------------


def test_unset_trip_points_are_left_out_and_the_interlock_says_which_it_uses(tmp_path):
    make_gb10(tmp_path)
    zone = tmp_path / "sys/class/thermal/thermal_zone2"
    for index, (millic, kind) in enumerate(
        [("0", "critical"), ("-274000", "hot"), ("95000", "passive"), ("45000", "active"), ("99000", "critical")]
    ):
        (zone / f"trip_point_{index}_temp").write_text(millic + "\n")
        (zone / f"trip_point_{index}_type").write_text(kind + "\n")
    details = {z["name"]: z for z in ThermalZones(str(tmp_path)).discover()["details"]}
    assert details["TS0P"]["trip_point_c"] == 95.0 and details["TS0P"]["trip_point"] == "trip_point_2_temp (passive)"
    assert [t["trip_point"] for t in details["TS0P"]["trip_points_ignored"]] == [
        "trip_point_0_temp (critical)",
        "trip_point_1_temp (hot)",
        "trip_point_3_temp (active)",
    ]
    assert details["TSOC"]["trip_point_c"] == 104.8
    (tmp_path / "sys/class/thermal/thermal_zone0/trip_point_0_temp").write_text("0\n")
    assert ThermalZones(str(tmp_path)).discover()["details"][0]["trip_point_c"] is None, "0 is no trip point"
    line = deploy.lowest_trip_point({"head": {"zones": list(details.values())}, "worker": {}})
    assert line == "95 °C: head TS0P trip_point_2_temp (passive) (3 trip points left out as unset or a fan's step)"
    assert deploy.lowest_trip_point({"head": {"zones": []}}) is None


def test_each_die_keeps_its_counter_and_counts_once_in_the_host_total(tmp_path):
    from thermab.analysis.energy import host_total_domains
    from thermab.telemetry.agent import RaplPower

    for zone, name in [
        ("intel-rapl:0", "package-0-die-0"),
        ("intel-rapl:0:0", "dram"),
        ("intel-rapl:0:1", "core"),
        ("intel-rapl:1", "package-0-die-1"),
        ("intel-rapl:1:0", "dram"),
        ("intel-rapl:2", "psys"),
    ]:
        directory = tmp_path / "sys/class/powercap" / zone
        directory.mkdir(parents=True)
        (directory / "name").write_text(name + "\n")
        (directory / "energy_uj").write_text("1000\n")
        (directory / "max_energy_range_uj").write_text("262143328850\n")
    rapl = RaplPower(str(tmp_path))
    domains = rapl.discover()["domains"]
    assert domains == [
        "package-0-die-0",
        "dram-0-die-0",
        "package-0-die-0/core",
        "package-0-die-1",
        "dram-0-die-1",
        "psys",
    ]
    assert len(rapl.sample()) == 6, "a counter for every zone"
    assert host_total_domains(domains) == ["dram-0-die-0", "dram-0-die-1", "package-0-die-0", "package-0-die-1"]


# -- the cache of verdicts by pid: a number that changes hands, a title, an exec ----------------

UPTIME_S = 1_000_000  # the fake /proc's uptime; a process born "now" has this start time in ticks


def cpu_rows(source: ProcessCpu, seconds: float) -> dict:
    """A sample over an interval of ``seconds`` (the last sample's time set back), as a dict."""
    source.previous_t = time.time() - seconds
    return dict((s, v) for s, v, _ in source.sample())


def test_a_pid_handed_out_again_is_a_new_process_and_its_ticks_are_its_own(tmp_path):
    """A verdict is cached by pid, so a number the kernel hands out again must not keep the
    old process's: a vLLM engine under an old shell's number is summed from its first
    sample (the number passed in loadavg's last pid, or the pids wrapped at pid_max), and
    a shell under a vLLM process's old number leaves the sum at once, its ticks never
    taken as the engine's."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "uptime").write_text(f"{UPTIME_S}.0 1.0\n")
    fake_process(proc, 20, "bash", 7)
    fake_process(proc, 30, "vllm serve m", 500)
    fake_process(proc, 40, "bash", 9)
    fake_process(proc, 50, "bash", 11)
    hand_out(proc, 40)
    source = ProcessCpu(proc_root=str(proc))  # rescan_s 120: no look is due in this test
    source.sample()
    assert source.matching_pids() == ["30"]

    # 20 ends; the kernel wraps at pid_max and hands 20 to vLLM's engine, born this interval
    shutil.rmtree(proc / "20")
    fake_process(proc, 20, "VLLM::EngineCore", 40, start=UPTIME_S * 100)
    fake_process(proc, 30, "vllm serve m", 600)
    rows = cpu_rows(source, 10.0)
    assert source.matching_pids() == ["20", "30"] and rows["vllm_processes"] == 2
    assert rows["vllm_cpu_pct"] == pytest.approx((100 + 40) / 10.0, rel=0.01), "the engine's 40 ticks are new"

    # 40 changes hands with no listing between samples that shows it gone: loadavg's last
    # pid passed 40, so 40 is new: looked at (by a listing of /proc where many pids were
    # handed out, 21 -> 45; one by one where few, 45 -> 47), and it matches
    (proc / "40" / "cmdline").write_bytes(b"VLLM::Worker_TP0\0")
    hand_out(proc, 21)
    source.matching_pids()
    hand_out(proc, 45)
    assert source.matching_pids() == ["20", "30", "40"]
    (proc / "40" / "cmdline").write_bytes(b"VLLM::Worker_TP1\0")
    fake_process(proc, 46, "vllm serve m", 500, tgid=30)  # a thread of 30 took 46: no process of its own
    hand_out(proc, 47)
    assert source.matching_pids() == ["20", "30", "40"], "a match is looked at every sample; a thread is not a process"
    shutil.rmtree(proc / "46")  # a real /proc lists no thread; this one's directory would be
    # the shell 50 (there from the start, above the last pid: the pids wrapped before) ends
    # and vLLM gets 50: one of the few pids handed out (47 -> 50), looked up as new
    (proc / "50" / "cmdline").write_bytes(b"VLLM::Worker_TP2\0")
    hand_out(proc, 50)
    assert source.matching_pids() == ["20", "30", "40", "50"]

    # vLLM's api server ends and a shell gets 30: out of the sum at its first sample, and
    # its 3 ticks are not taken as a fall from 600
    source.sample()
    shutil.rmtree(proc / "30")
    fake_process(proc, 30, "bash", 3, start=UPTIME_S * 100)
    rows = cpu_rows(source, 10.0)
    assert source.matching_pids() == ["20", "40", "50"] and rows["vllm_processes"] == 3
    assert rows["vllm_cpu_pct"] == 0.0


def test_a_process_in_exec_at_the_first_scan_is_matched_at_the_next(tmp_path):
    """Right after ``Popen`` returns, a child still in exec reads an empty command line
    (the kernel closes the pipe its parent waits on before it sets the new one: 230 of 300
    children here), one just forked its parent's: a process there at the first scan is
    looked at again by its own age, so a young one is summed from the next sample, where
    taking it as old kept it out for rescan_s (the thread test's 10 s without a match).
    An old one with an empty command line (a kernel thread) waits for rescan_s."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "uptime").write_text(f"{UPTIME_S}.0 1.0\n")
    fake_process(proc, 60, "x", 0, start=UPTIME_S * 100)  # born now
    fake_process(proc, 61, "x", 0)  # born at boot
    fake_process(proc, 62, "python -m pytest tests", 0, start=UPTIME_S * 100 - 50)  # forked, not yet exec'd
    for pid in (60, 61):
        (proc / str(pid) / "cmdline").write_bytes(b"")
    source = ProcessCpu(proc_root=str(proc))
    assert source.matching_pids() == []
    for pid in (60, 61, 62):
        (proc / str(pid) / "cmdline").write_bytes(b"VLLM::EngineCore\0")
    time.sleep(0.01)
    assert source.matching_pids() == ["60"], "young: looked at again at once; old: after rescan_s"
    time.sleep(0.5)
    assert source.matching_pids() == ["60", "62"], "forked 0.5 s before the first scan: looked at again 0.5 s on"


def test_a_renamed_or_execd_process_is_summed_from_its_next_look(tmp_path):
    """A process renamed in place as setproctitle renames vLLM's engine (the command line
    and comm replaced, pid and start time kept), or one that exec'd, keeps its pid: an
    old one is looked at again within rescan_s, a young one at the next sample, and it
    is summed from that look on, its earlier ticks never counted."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "uptime").write_text(f"{UPTIME_S}.0 1.0\n")
    fake_process(proc, 50, "python -c from multiprocessing.spawn import spawn_main", 1000)  # old
    source = ProcessCpu(proc_root=str(proc))
    source.rescan_s = 0.5
    source.sample()
    fake_process(proc, 50, "VLLM::EngineCore", 1100)
    assert cpu_rows(source, 10.0)["vllm_processes"] == 0, "not looked at yet"
    time.sleep(0.6)
    rows = cpu_rows(source, 10.0)
    assert rows["vllm_processes"] == 1 and rows["vllm_cpu_pct"] == 0.0, "seen: its ticks so far are no delta"
    fake_process(proc, 50, "VLLM::EngineCore", 1150)
    assert cpu_rows(source, 10.0)["vllm_cpu_pct"] == pytest.approx(5.0, rel=0.01)
    fake_process(proc, 51, "bash -c exec vllm serve m", 0)  # a young wrapper, then its exec
    source.sample()
    fake_process(proc, 51, "/venv/bin/python3 /venv/bin/vllm serve m", 0)
    time.sleep(0.05)
    assert source.matching_pids() == ["50", "51"], "a young process is looked at again at the next sample"


def full_scan(proc: Path, previous: dict, elapsed: float) -> tuple[dict, float, int]:
    """The sum as a scan that lists /proc and reads every process's command line and stat at
    every sample would have it: (processes, vllm_cpu_pct, vllm_processes)."""
    pattern = re.compile(ProcessCpu().pattern.pattern)
    clk_tck = os.sysconf("SC_CLK_TCK")
    current = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and f"Tgid:\t{entry.name}\n" in (entry / "status").read_text():  # no thread
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            if pattern.search(cmdline):
                text = (entry / "stat").read_text()
                fields = text[text.rindex(")") + 2 :].split()
                current[entry.name] = (int(fields[11]) + int(fields[12]), int(fields[19]))
    since = float((proc / "uptime").read_text().split()[0]) * clk_tck - elapsed * clk_tck
    delta = sum(
        ticks - previous[pid][0] if previous.get(pid, (0, None))[1] == start else (ticks if start >= since else 0)
        for pid, (ticks, start) in current.items()
    )
    return current, 100.0 * delta / clk_tck / elapsed, len(current)


def test_the_incremental_sum_is_the_full_scans(tmp_path):
    """What the agent sums, reading few files per sample (new pids probed one by one or by a
    listing, verdicts kept per process, matches looked at every sample), is what reading
    every process at every sample sums: through new processes, ended ones, a pid handed
    out again (after a wrap), a thread that took a pid, and many pids at once."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "uptime").write_text(f"{UPTIME_S}.0 1.0\n")
    now = UPTIME_S * 100  # a process born this interval
    steps = [
        [(10, "vllm serve m", 100, 100), (11, "bash", 5, 100), (12, "VLLM::EngineCore", 40, 100)],
        [(10, "vllm serve m", 150, 100), (12, "VLLM::EngineCore", 70, 100), (13, "VLLM::Worker_TP0", 20, now)],
        [
            ("-", 11),
            (10, "vllm serve m", 160, 100),
            (13, "VLLM::Worker_TP0", 60, now),
            (14, "python train.py", 9, now),
            (15, "vllm serve m", 1, now, 10),
        ],  # 15: a thread of 10 (probed; a real /proc lists no thread)
        [("-", 15), ("-", 12), (12, "VLLM::Worker_TP1", 5, now)],  # the numbers wrapped at pid_max
        [(150, "vllm serve x", 7, now), (10, "vllm serve m", 200, 100)],  # many pids at once
        [("-", 10), (10, "bash", 3, now), (150, "vllm serve x", 27, now)],  # a shell under vLLM's old number
    ]
    source = ProcessCpu(proc_root=str(proc))
    previous = {}
    for number, step in enumerate(steps):
        for change in step:
            if change[0] == "-":
                shutil.rmtree(proc / str(change[1]))
            else:
                pid, cmdline, ticks, start, *tgid = change
                fake_process(proc, pid, cmdline, ticks, start=start, tgid=tgid[0] if tgid else 0)
        if number == 3:
            hand_out(proc, 12)  # the numbers wrapped at pid_max
        if number == 4:
            hand_out(proc, 150)
        rows = cpu_rows(source, 10.0) if number else dict((s, v) for s, v, _ in source.sample())
        previous, pct, count = full_scan(proc, previous, 10.0)
        if number:
            assert rows["vllm_cpu_pct"] == pytest.approx(pct, rel=1e-3), number
            assert rows["vllm_processes"] == count, number


def fake_threads(proc: Path, pid: int, comm: str, threads: dict, start: int = 100) -> None:
    """A matched process and its threads (tid -> (ticks, cpu)): the process's ticks their sum."""
    fake_process(proc, pid, comm, sum(ticks for ticks, _ in threads.values()), start=start)
    for tid, (ticks, cpu) in threads.items():
        fields = ["S"] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 6 + [str(start)] + ["0"] * 16 + [str(cpu)] + ["0"] * 3
        (proc / str(pid) / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "task" / str(tid) / "stat").write_text(f"{tid} ({comm[:15]}) " + " ".join(fields) + "\n")


def test_threads_are_read_of_the_processes_above_the_floor(tmp_path):
    """The busiest threads come from the processes that used ``thread_floor_pct`` of a core
    since the last sample (a spinning thread holds a core): one below has its threads left
    unread, and one that rises above is listed from its next sample on, from ticks of that
    span alone.  Asked for every thread (the simulated node's model), every busy process's
    are read at every sample."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "uptime").write_text(f"{UPTIME_S}.0 1.0\n")
    hand_out(proc, 30)
    ticks = {20: {20: (0, 1), 201: (0, 2), 202: (0, 3)}, 30: {30: (0, 4), 301: (0, 5)}}

    def advance(pid, tid, by):
        before, cpu = ticks[pid][tid]
        ticks[pid][tid] = (before + by, cpu)

    def write():
        fake_threads(proc, 20, "VLLM::EngineCore", ticks[20])
        fake_threads(proc, 30, "VLLM::Worker_TP0", ticks[30])

    write()
    top, every = ProcessCpu(proc_root=str(proc)), ProcessCpu(proc_root=str(proc))
    every.top_threads = None
    top.sample(), every.sample()

    def threads(source):
        return {s: round(v, 1) for s, v in cpu_rows(source, 10.0).items() if s.startswith("thread ")}

    advance(20, 201, 900), advance(20, 202, 50), advance(30, 301, 50)  # 90 % and 5 % of a core; 5 %
    write()
    assert threads(top) == {"thread VLLM::EngineCor 201 cpu2": 90.0, "thread VLLM::EngineCor 202 cpu3": 5.0}
    assert threads(every) == {
        "thread VLLM::EngineCor 201 cpu2": 90.0,
        "thread VLLM::EngineCor 202 cpu3": 5.0,
        "thread VLLM::Worker_TP 301 cpu5": 5.0,
    }
    advance(30, 301, 500)  # 30 rises above the floor; 20 is idle
    write()
    assert threads(top) == {}, "no baseline of 30's threads in the last span: listed from the next sample"
    assert threads(every) == {"thread VLLM::Worker_TP 301 cpu5": 50.0}
    advance(30, 301, 500), advance(20, 201, 1000)
    write()
    assert (
        threads(top)
        == threads(every)
        == {"thread VLLM::EngineCor 201 cpu2": 100.0, "thread VLLM::Worker_TP 301 cpu5": 50.0}
    )
