"""sysfs trees of ARM servers and SoCs as their kernels lay out power telemetry, for the agent's
power sources.  Each builder names its sources; values are in the drivers' units (µW, mV, mA).

Sources:
- ACPI power meters (``ACPI000D``): the kernel's drivers/hwmon/acpi_power_meter.c and
  Documentation/hwmon/acpi_power_meter.rst (``power1_average`` in µW, ``power1_oem_info``,
  ``power1_model_number``, ``power1_serial_number``, ``power1_is_battery``, a ``measures/``
  directory).  Registered with ``hwmon_device_register``, the driver creates ``name`` and its
  attributes on the ACPI device, so they are in ``hwmonN/device/`` (the listing of
  ``/sys/class/hwmon/hwmon1/device/`` in lm-sensors/lm-sensors#460); registered with
  ``hwmon_device_register_with_info``, they are in ``hwmonN`` itself.  A meter with no reading
  returns 0xFFFFFFFF mW, which the driver shows as 4294967295000 µW ("4.29 MW" in
  lm-sensors/lm-sensors#130 and #460).
- What NVIDIA's meters cover, by their ``power1_oem_info``: "Module Power Socket N" the whole
  Grace Hopper module (GPU, HBM, CPU, DRAM and regulator loss; GH200 only), "Grace Power
  Socket N" the Grace socket, "CPU Power Socket N" its CPU rail, "SysIO Power Socket N" its SoC
  rail (the Alumet grace-hopper plugin's table, after NVIDIA's Grace Performance Tuning Guide,
  "Power and thermal management"; sustainable-computing-io/kepler#1884).  On GH200 the GPU's
  own energy counter covers the module too (ml-energy/zeus#172).  GB200 trays report their
  Grace sockets through the same meters (SemiAnalysisAI/InferenceX#3296: "Grace Power Socket
  0/1" rows per host); their module power is an NVML reading (NVIDIA/k8s-test-infra#676).
- INA3221 (Jetson AGX Orin): the kernel's Documentation/hwmon/ina3221.rst (``in[123]_label``,
  ``in[123]_input`` bus voltage in mV, ``curr[123]_input`` in mA, ``in[456]_input`` shunt
  voltage in µV, ``curr4_input`` the sum) and the Jetson Linux Developer Guide (r35/r36),
  "Jetson Orin ... Power Monitor": at 0x40 VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0; at 0x41
  VDDQ_VDD2_1V8AO on channel 2, under ``/sys/bus/i2c/drivers/ina3221/1-004X/hwmon/hwmonN``.
- Ampere Altra: drivers/hwmon/xgene-hwmon.c (chip ``apm_xgene``, ACPI IDs APMC0D29 and
  APMC0D8A; ``temp1`` "SoC Temperature", ``power1`` "CPU power", ``power2`` "IO power", µW)
  and the sensors output on AmpereComputing/ampere-lts-kernel's wiki, "hwmon drivers" (one
  chip per socket).
- GB10 (DGX Spark, ASUS Ascent GX10): no ACPI power meter, no powercap and no hwmon power in
  the stock kernel: NVIDIA's forum answer that there is "no method to monitor CPU power" on
  DGX Spark (quoted by the out-of-tree SPBM hwmon driver, antheas/spark_hwmon); ``nvidia-smi``
  reports the GPU's power with no cap ("4W / N/A", niklasfrick/spark-dashboard#35); seven
  ACPI thermal zones (tildahh/dgx_dashboard).
"""

from __future__ import annotations

import os
from pathlib import Path

ACPI_UNKNOWN_UW = 0xFFFFFFFF * 1000


def _link_class(root: Path, number: int, chip: Path) -> None:
    link = root / "sys/class/hwmon" / f"hwmon{number}"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(chip, link.parent))


def acpi_meter(root: Path, number: int, index: int, oem_info: str, microwatts: int, in_device: bool) -> Path:
    """One ``ACPI000D:NN`` meter as hwmon chip ``hwmonN``; ``in_device``: its files on the ACPI
    device (``hwmonN/device/``), else in ``hwmonN``.  Returns the ``power1_average`` file."""
    device = root / "sys/devices/LNXSYSTM:00/LNXSYBUS:00" / f"ACPI000D:{index:02d}"
    chip = device / "hwmon" / f"hwmon{number}"
    chip.mkdir(parents=True)
    (chip / "device").symlink_to("../..")
    (device / "measures").mkdir(exist_ok=True)
    (device / "hid").write_text("ACPI000D\n")
    (device / "path").write_text(f"\\_SB_.PMT{index}\n")
    where = device if in_device else chip
    for name, text in {
        "name": "power_meter",
        "power1_average": str(microwatts),
        "power1_average_interval": "50",
        "power1_accuracy": "95.0%",
        "power1_is_battery": "0",
        "power1_model_number": "",
        "power1_serial_number": "",
        "power1_oem_info": oem_info,
    }.items():
        (where / name).write_text(text + "\n")
    (chip / "uevent").write_text("")
    _link_class(root, number, chip)
    return where / "power1_average"


GRACE_METERS = ("Grace Power Socket {}", "CPU Power Socket {}", "SysIO Power Socket {}")
GH200_METERS = ("Module Power Socket {}",) + GRACE_METERS


def nvidia_acpi_meters(root: Path, sockets: int, names, watts: dict, in_device: bool) -> dict[str, Path]:
    """NVIDIA's ACPI meters of ``sockets`` sockets, each meter ``names`` per socket; ``watts``:
    its kind ("Module", "Grace", "CPU", "SysIO") -> W.  Returns oem_info -> power1_average."""
    files, number = {}, 0
    for socket in range(sockets):
        for name in names:
            oem = name.format(socket)
            kind = oem.split()[0]
            files[oem] = acpi_meter(root, number, number, oem, int(watts[kind] * 1e6), in_device)
            number += 1
    return files


def gh200(root: Path, sockets: int = 4, in_device: bool = True) -> dict[str, Path]:
    """A GH200 node (four superchips, as a quad GH200 blade): 16 meters."""
    return nvidia_acpi_meters(
        root, sockets, GH200_METERS, {"Module": 650.0, "Grace": 180.0, "CPU": 120.0, "SysIO": 30.0}, in_device
    )


def grace(root: Path, in_device: bool = True) -> dict[str, Path]:
    """A Grace CPU Superchip (two Grace sockets, no GPU): 6 meters, no module."""
    return nvidia_acpi_meters(root, 2, GRACE_METERS, {"Grace": 250.0, "CPU": 190.0, "SysIO": 35.0}, in_device)


def gb200(root: Path) -> dict[str, Path]:
    """A GB200 compute tray's host (two Grace sockets, four Blackwell GPUs seen by nvidia-smi):
    the Grace meters, in ``hwmonN`` as a newer kernel has them."""
    return nvidia_acpi_meters(root, 2, GRACE_METERS, {"Grace": 200.0, "CPU": 150.0, "SysIO": 32.0}, False)


ORIN_RAILS = {"1-0040": {1: "VDD_GPU_SOC", 2: "VDD_CPU_CV", 3: "VIN_SYS_5V0"}, "1-0041": {2: "VDDQ_VDD2_1V8AO"}}


def ina3221(root: Path, number: int, address: str, rails: dict[int, tuple[str, int, int]]) -> Path:
    """One INA3221 at ``address`` on I2C bus 1: ``rails`` channel -> (label, mV, mA); a channel
    not listed is disconnected, and the driver shows none of its files.  Returns the chip."""
    device = root / "sys/devices/platform/bus@0/c240000.i2c/i2c-1" / address
    chip = device / "hwmon" / f"hwmon{number}"
    chip.mkdir(parents=True)
    (chip / "device").symlink_to("../..")
    (chip / "name").write_text("ina3221\n")
    for channel, (label, millivolts, milliamps) in rails.items():
        (chip / f"in{channel}_label").write_text(label + "\n")
        (chip / f"in{channel}_input").write_text(f"{millivolts}\n")
        (chip / f"curr{channel}_input").write_text(f"{milliamps}\n")
        (chip / f"curr{channel}_crit").write_text("6000\n")
        (chip / f"in{channel + 3}_input").write_text(f"{milliamps * 5}\n")  # shunt µV over 5 mΩ
    (chip / "curr4_input").write_text(f"{sum(r[2] for r in rails.values())}\n")
    (chip / "curr4_crit").write_text("12000\n")
    _link_class(root, number, chip)
    return chip


def jetson_agx_orin(root: Path) -> dict[str, Path]:
    """Jetson AGX Orin's two INA3221 monitors (values of a busy module)."""
    readings = {"VDD_GPU_SOC": (4984, 1600), "VDD_CPU_CV": (4992, 800), "VIN_SYS_5V0": (5000, 640)}
    readings["VDDQ_VDD2_1V8AO"] = (4996, 240)
    chips = {}
    for number, (address, rails) in enumerate(ORIN_RAILS.items()):
        chips[address] = ina3221(root, number, address, {ch: (label,) + readings[label] for ch, label in rails.items()})
    return chips


def ampere_altra(root: Path, sockets: int = 2) -> dict[str, Path]:
    """An Ampere Altra host: one ``apm_xgene`` chip per socket.  Returns its power1 files."""
    files = {}
    for socket in range(sockets):
        chip = root / "sys/devices/platform" / f"APMC0D8A:{socket:02d}" / "hwmon" / f"hwmon{socket}"
        chip.mkdir(parents=True)
        (chip / "device").symlink_to("../..")
        for name, text in {
            "name": "apm_xgene",
            "temp1_label": "SoC Temperature",
            "temp1_input": "40000",
            "power1_label": "CPU power",
            "power1_input": str(14_760_000 + socket * 13_320_000),
            "power2_label": "IO power",
            "power2_input": str(31_070_000 + socket * 30_000),
        }.items():
            (chip / name).write_text(text + "\n")
        _link_class(root, socket, chip)
        files[f"APMC0D8A:{socket:02d}"] = chip / "power1_input"
    return files


def gb10(root: Path) -> None:
    """A GB10 (DGX Spark) node's sysfs as far as power goes: seven ACPI thermal zones and
    cpufreq policies, an ``nvme`` hwmon chip and no power channel, no powercap."""
    for number in range(7):
        zone = root / f"sys/class/thermal/thermal_zone{number}"
        zone.mkdir(parents=True)
        (zone / "type").write_text("acpitz\n")
        (zone / "temp").write_text(f"{45000 + number * 1000}\n")
    for policy in (0, 10):
        directory = root / f"sys/devices/system/cpu/cpufreq/policy{policy}"
        directory.mkdir(parents=True)
        (directory / "cpuinfo_avg_freq").write_text("3900000\n")
    chip = root / "sys/devices/pci0000:00/0000:00:00.0/0000:01:00.0/nvme/nvme0/hwmon/hwmon0"
    chip.mkdir(parents=True)
    (chip / "device").symlink_to("../..")
    (chip / "name").write_text("nvme\n")
    (chip / "temp1_label").write_text("Composite\n")
    (chip / "temp1_input").write_text("41850\n")
    _link_class(root, 0, chip)
