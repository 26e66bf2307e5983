"""A node's kernel files as the agent reads them, in a directory of a test's own: a GB10's
thermal zones and cpufreq policies in sysfs, processes in a /proc; and the rows of the CSV
files the agent writes of them."""

import csv
from pathlib import Path

GB10_ZONES = ["TSOC", "TS0E", "TS0P", "TS1E", "TS1P", "TGPU", "TUNC"]


def make_gb10(root: Path, temps=None) -> None:
    for index, name in enumerate(GB10_ZONES):
        zone = root / f"sys/class/thermal/thermal_zone{index}"
        (zone / "device").mkdir(parents=True)
        (zone / "device/path").write_text(f"\\_TZ_.{name}\n")
        (zone / "type").write_text("acpitz\n")
        (zone / "temp").write_text(f"{(temps or {}).get(name, 50000 + index * 1000)}\n")
        (zone / "trip_point_0_temp").write_text("104800\n")
    for cpu in range(20):
        policy = root / f"sys/devices/system/cpu/cpufreq/policy{cpu}"
        policy.mkdir(parents=True)
        (policy / "scaling_cur_freq").write_text("3900000\n")
        if cpu >= 5:
            (policy / "cpuinfo_avg_freq").write_text("3978000\n")


def fake_process(proc: Path, pid: int, cmdline: str, ticks: int, start: int = 100, tgid: int = 0) -> None:
    """A process in a /proc of its own, as the kernel shows it; a title (``VLLM::...``) is
    what setproctitle leaves: the command line and ``comm`` both replaced.  With ``tgid``,
    a thread of that process: its /proc/TID opens as a process's does, but is not listed."""
    directory = proc / str(pid)
    if not directory.exists():  # the kernel hands out a pid; an exec or a title keeps it
        hand_out(proc, pid)
    (directory / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    (directory / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
    comm = (cmdline if cmdline.startswith("VLLM::") else "python3")[:15]
    (directory / "comm").write_text(comm + "\n")
    (directory / "status").write_text(
        f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{tgid or pid}\nNgid:\t0\nPid:\t{pid}\n"
    )
    stat = f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0 {start} 0 0"
    (directory / "stat").write_text(stat + " 0" * 20 + "\n")
    (directory / "task" / str(pid) / "stat").write_text(stat + " 0" * 20 + "\n")


def hand_out(proc: Path, last_pid: int) -> None:
    (proc / "loadavg").write_text(f"0.1 0.1 0.1 1/100 {last_pid}\n")  # the last pid the kernel handed out


def csv_rows(path: Path) -> list[dict]:
    with open(path) as handle:
        return list(csv.DictReader(handle))
