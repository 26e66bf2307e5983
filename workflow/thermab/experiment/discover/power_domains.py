"""The power domains the agent's discovery found on a host, each with its scope and source,
the host's total and what it holds, and what could not be read with why and the fix
(docs/power.md)."""

from __future__ import annotations

from thermab.telemetry.agent import SOURCES, domain_scope
from thermab.telemetry.power import container, total_scope

POWER_SOURCES = tuple(source.name for source in SOURCES if source.kind == "power")
ROOT_ONLY_RAPL = (
    "energy_uj is readable by root alone (powercap made it so in Linux 5.10): run the agent as"
    " root, or make the counters readable at boot, e.g. a udev rule or a systemd-tmpfiles line"
    " `z /sys/class/powercap/intel-rapl:*/energy_uj 0444` (docs/power.md)"
)


def _domains(found: dict) -> list[tuple[str, str, bool, str]]:
    """(domain, source and file, readable, why not) of every power domain of the sources."""
    rows = []
    for detail in (found.get("rapl") or {}).get("details") or []:
        readable = detail.get("readable", True)
        rows.append(
            (detail["domain"], f"rapl, {detail['zone']}/energy_uj", readable, "" if readable else ROOT_ONLY_RAPL)
        )
    for detail in (found.get("hwmon_power") or {}).get("details") or []:
        files = ", ".join(detail.get("files") or [])
        readable = detail.get("readable", True)
        rows.append(
            (detail["domain"], f"hwmon_power, {files}", readable, "" if readable else f"no permission: {files}")
        )
    gpu = found.get("gpu_power") or {}
    missing = gpu.get("missing") or {}
    for sensor in gpu.get("sensors") or []:
        domain = sensor.split(" ")[0]
        if domain.startswith("gpu") and domain[3:].isdigit() and not any(r[0] == domain for r in rows):
            why = missing.get(f"{domain} W", "")
            rows.append(
                (
                    domain,
                    f"gpu_power, nvidia-smi power.draw ({gpu.get('energy_counter') or 'no counter'})",
                    not why,
                    why,
                )
            )
    if found.get("ipmi"):
        rows.append(("node", f"ipmi, ipmitool dcmi power reading on {found['ipmi'].get('device')}", True, ""))
    return rows


def power_facts(found: dict) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(what, value) found and (what, why) missing: one ``power domain`` line per domain with
    its scope, what holds it and its source; the ``power total``; the unreadable domains."""
    rows = _domains(found)
    domains = [domain for domain, _, _, _ in rows]
    present, absent = [], []
    for domain, source, readable, why in rows:
        if not readable:
            absent.append((f"power domain {domain}", why))
            continue
        holder = container(domain, domains)
        scope = domain_scope(domain)[0] + (f", in {holder}" if holder else "")
        present.append(("power domain", f"{domain}: {scope} [{source}]"))
    readable = [domain for domain, _, ok, _ in rows if ok]
    summed, scopes, holds = total_scope(readable)
    if summed:
        # no board meter sees the CPU here: only a meter outside the host would
        left_out = (
            "" if "cpu" in holds else "; leaves out the CPU: a wall meter (wall_meters: a plug, PDU or BMC) holds it"
        )
        present.append(
            ("power total", f"{' + '.join(summed)} ({' + '.join(scopes)}: holds {', '.join(holds)}{left_out})")
        )
    else:
        absent.append(
            (
                "power total",
                "no domain makes up a total (node, module, CPU socket or package, DRAM, GPU)"
                + (f": only {', '.join(readable)}" if readable else ": no power domain readable")
                + " (docs/power.md says what each platform exposes)",
            )
        )
    return present, absent
