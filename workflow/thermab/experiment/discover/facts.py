"""What discover found, each with its source, and what it did not, with why: the facts,
the words a failed read is told in, the agent's own discovery summarised, and the table."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from thermab.experiment.discover.power_domains import POWER_SOURCES, power_facts
from thermab.hosts.transport import Result
from thermab.telemetry import deploy
from thermab.telemetry.agent import CpuFrequency


@dataclass(frozen=True)
class Fact:
    host: str
    what: str
    value: str
    source: str = ""  # where it came from; empty for what was not found (value says why)


def why(result: Result, command: str) -> str:
    """Why a read failed, in the words the table uses."""
    lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
    tail = lines[-1][:200] if lines else ""
    program = command.split()[0]
    if result.exited == 127:
        return f"no such command: {program}"
    if "No such file or directory" in tail:
        return "no such file"
    if re.search(r"permission denied|not permitted", tail, re.IGNORECASE):
        return f"no permission: {tail}"
    return f"{program} failed (exit {result.exited}): {tail}"


def summarize_agent(found: dict) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The agent's ``--discover`` output as (what, value) found and (what, why) missing, for
    every source it reports, known or not (a new source shows up without a change here)."""
    present: list[tuple[str, str]] = []
    absent: list[tuple[str, str]] = []
    for name, facts in sorted(found.items()):
        if name == "gpu":
            continue  # GPUs are listed from nvidia-smi itself, with their names
        if name in POWER_SOURCES and isinstance(facts, dict) and "error" not in facts:
            continue  # every power domain is listed below, with its scope, whichever source it is from
        if facts is None:
            absent.append((name, "not on this host (the agent's source finds nothing to read)"))
        elif isinstance(facts, dict) and "error" in facts:
            absent.append((name, f"unreadable: {facts['error']}"))
        elif name == "processes":
            present.append(("vLLM processes", deploy.describe_processes(facts)))
        elif name == "thermal":
            zones = facts.get("details") or []
            if not zones:
                absent.append(("thermal zones", "/sys/class/thermal has no zones"))
            else:
                present.append(
                    (
                        "thermal zones",
                        ", ".join(
                            f"{z['name']} (trip {z['trip_point_c']:g} °C)"
                            if z.get("trip_point_c") is not None
                            else f"{z['name']} (no trip point)"
                            for z in zones
                        ),
                    )
                )
        elif name == "freq":
            policies, unread = facts.get("policies") or {}, facts.get("unread") or []
            if policies:
                present.append(("cpufreq", describe_policies(policies)))
            if unread:  # there, but no value will come from them: a gap the user should see
                absent.append(
                    (
                        "cpufreq",
                        f"{len(unread)} of {len(policies) + len(unread)} policies unread, "
                        f"without any of {', '.join(CpuFrequency.FILES)}: {', '.join(unread)}",
                    )
                )
            if not policies and not unread:
                absent.append(("cpufreq", "/sys/devices/system/cpu/cpufreq has no policies"))
        elif name == "hwmon":
            sensors = facts.get("sensors") or []
            present.append(
                (
                    "hwmon",
                    f"{len(sensors)} sensors"
                    + (f": {', '.join(sensors[:8])}" if sensors else "")
                    + (" …" if len(sensors) > 8 else ""),
                )
            )
        elif not facts:
            present.append((name, "available (read when sampling)"))
        else:
            present.append((name, json.dumps(facts, sort_keys=True)[:300]))
    if any(name in found for name in POWER_SOURCES):
        power_present, power_absent = power_facts(found)
        present += power_present
        absent += power_absent
    return present, absent


def describe_policies(policies: dict[str, str]) -> str:
    """``20 policies; cpuinfo_avg_freq on 10 (cpu5, ...); scaling_cur_freq on 10 (cpu0, ...)``:
    which file each policy is read from (the agent's order of preference)."""
    parts = []
    for file in CpuFrequency.FILES:
        cpus = [cpu for cpu, source in policies.items() if source == file]
        if cpus:
            parts.append(f"{file} on " + ("all" if len(cpus) == len(policies) else f"{len(cpus)} ({', '.join(cpus)})"))
    return f"{len(policies)} policies; " + "; ".join(parts)


def render_table(found: list[Fact], missing: list[Fact]) -> str:
    """What was found, each with its source in brackets; then what was not, with why."""
    out = []
    for title, facts in (("found [source]:", found), ("not found:", missing)):
        if facts:
            host_w, what_w = max(len(f.host) for f in facts), max(len(f.what) for f in facts)
            out += (
                ([""] if out else [])
                + [title]
                + [
                    f"  {f.host:<{host_w}}  {f.what:<{what_w}}  {f.value}" + (f"  [{f.source}]" if f.source else "")
                    for f in facts
                ]
            )
    return "\n".join(out)
