"""Preflight: every host checked before anything changes (docs/design.md).

Records, per host, reachability, the target file (path, anchor count, sha256), the vLLM
version, the thermal zones the agent will log (found by the agent's own discovery) with
their trip points, and clock offsets; writes ``preflight.json`` and the run's plan
(``run.json``).  Problems that would make the run meaningless stop it here, naming each
host; advice that does not is printed and kept."""

from __future__ import annotations

import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from thermab.config import ConfigError, abort_threshold, thaw
from thermab.contracts import Preflight, Safety
from thermab.errors import StageFailed
from thermab.experiment import lease, plan, server
from thermab.experiment.cluster import ClusterRun, clock_offsets, offsets_record
from thermab.experiment.patch import PatchError, anchor_count, patch_problems, sha256
from thermab.hosts.transport import TransportError
from thermab.telemetry import agent, deploy, wall_meters


class PreflightError(StageFailed):
    """A host is not fit for the run; the message names each host and cause."""


POWER_SOURCES = tuple(source.name for source in agent.SOURCES if source.kind == "power")


def _discovered(run: ClusterRun, host, change: bool) -> dict:
    """The zones the agent will log, the processes its vLLM CPU will sum now, and the power
    sources it found (RAPL zones each with whether its counter is readable)."""
    pattern = run.agent_settings(host)["process_pattern"]
    # a run installs the agent in its session directory; a check only reads
    found = deploy.discover(host, run.session, pattern) if change else deploy.discover_read_only(host, pattern)
    return {
        "zones": (found.get("thermal") or {}).get("details", []),
        "processes": found.get("processes"),
        "power": {name: found[name] for name in POWER_SOURCES if found.get(name) is not None},
    }


VLLM_VERSION = "import vllm; print(vllm.__version__)"
AGENT_PYTHON = "import sys; print(sys.executable); print(sys.version_info >= (3, 8)); print(sys.version.split()[0])"


def _check_host(
    run: ClusterRun, host, change: bool = True, unreached: str | None = None
) -> tuple[dict, list[str], list[str]]:
    """Facts about one host, the problems that stop the run, and advice that does not.
    ``change=False`` changes nothing on the host: a file an earlier run left patched is
    named, not restored, and the agent's discovery installs nothing.  ``unreached``: why
    the host was not reached when its lease was taken (it is not tried again, so never
    changed without its lease).

    Simulated nodes take the same path: reached first, then built (files only, on this
    machine)."""
    facts: dict = {"transport": host.spec.transport, "container": host.spec.container}
    if host.spec.simulated:  # so that every answer built on it can say so
        facts["simulated"] = True
    if unreached is not None:
        return {**facts, "reachable": False, "error": unreached}, [unreached], []
    try:
        facts["uname"] = host.run("uname -srm", timeout=30).stdout.strip()
    except TransportError as error:
        return {**facts, "reachable": False, "error": str(error)}, [str(error)], []
    facts["reachable"] = True
    try:
        return _check_reachable(run, host, facts, change)
    except (TransportError, PatchError) as error:  # lost mid-check, or a leftover that would not restore
        return {**facts, "error": str(error)}, [str(error)], []


def _check_reachable(run: ClusterRun, host, facts: dict, change: bool) -> tuple[dict, list[str], list[str]]:
    problems: list[str] = []
    advice: list[str] = []
    if host.spec.simulated:
        run.build_simulated(host)
    patcher = run.patcher(host)
    if patcher.is_patched and change:  # an earlier run died without cleaning up
        facts["restored_leftover"] = patcher.restore()
    elif patcher.is_patched:
        advice.append(
            f"host {host.name}: an earlier run left {patcher.file} patched; a run restores it first "
            "(python -m thermab restore does it now)"
        )
    found = host.run(f"{shlex.quote(host.agent_python)} -c {shlex.quote(AGENT_PYTHON)}", check=False)
    executable, recent, agent_version = (found.stdout.splitlines() + ["", "", ""])[:3]
    agent_runs = found.ok and recent == "True"
    if agent_runs:
        facts["agent_python"] = f"{executable} {agent_version}"
    else:
        problems.append(
            f"host {host.name}: the agent's Python ({host.agent_python}) "
            f"{'is older than 3.8' if found.ok else 'does not run: ' + found.stderr.strip()[-200:]}; "
            "set agent_python for this host"
        )
    setting = run.config.setting
    if setting.method == "file":
        try:
            text = patcher.original().decode()
        except (TransportError, PatchError) as error:
            reason = str(error).removeprefix(f"host {host.name}: ")
            said = reason if reason.startswith(setting.file) else f"cannot read {setting.file}: {reason}"
            problems.append(f"host {host.name}: config key 'setting.file': {said}")
        else:
            facts.update(
                file=patcher.file, sha256=sha256(text.encode()), anchor_count=anchor_count(text, setting.anchor)
            )
            values = {letter: arm.value for letter, arm in run.config.arms.items()}
            problems += [
                f"host {host.name}: {patcher.file}: {problem}" for problem in patch_problems(text, setting, values)
            ]
    if not host.spec.simulated:
        python = shlex.quote(host.spec.settings.get("python", "python3"))
        version = host.exec(f"{python} -c {shlex.quote(VLLM_VERSION)}", check=False)
        facts["vllm_version"] = version.stdout.strip() if version.ok else None
        if not version.ok:
            advice.append(f"host {host.name}: vllm does not import with {python} (version not recorded)")
    if not agent_runs:  # the zones are found by the agent itself
        return facts, problems, advice
    facts.update(_discovered(run, host, change))
    if not facts["zones"]:
        advice.append(
            f"host {host.name}: no thermal zones found: its temperatures will be missing "
            "(hwmon sensors are sampled where present)"
        )
    return facts, problems, advice


def _wall_meters(run: ClusterRun, report: Preflight) -> list[str]:
    """Each configured wall meter read once (a simulated node's plug starts with the node,
    later); its record kept with its host's facts, a meter that gives no reading a problem
    naming host, kind and URL."""
    problems = []
    for meter in run.wall_meters:
        report.hosts.setdefault(meter.host, {}).setdefault("wall_meters", []).append(meter.record())
        problem = None if meter.sim_root is not None else wall_meters.probe(meter)
        if problem:
            problems.append(problem)
        run.progress("  " + (problem or f"{meter.name}: {'starts with the node' if meter.sim_root else 'ok'}"))
    return problems


def _endpoint_model(endpoint: str) -> str | None:
    try:
        return server.models(endpoint)[0]
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _interlock_line(abort_at: float | None, unread: list[str]) -> str:
    if abort_at is not None:
        return f"thermal interlock: load stops at {abort_at:.1f} °C on any zone of any host"
    if unread:
        return (
            f"thermal interlock: off for now: the zones of {', '.join(unread)} could not be read "
            "(see the problems below)"
        )
    return "thermal interlock: off (no trip point found on any host and safety.abort_at_c not set)"


def inspect(
    run: ClusterRun, change: bool = True, unreached: dict[str, str] | None = None
) -> tuple[Preflight, list[str]]:
    """Every host checked as a run checks it, each found printed with ``run.progress``;
    the report and the problems that would stop a run.  ``change=False`` (check-config
    --hosts) changes nothing on any host (``_check_host``); ``unreached``: the hosts whose
    lease could not be taken, by name, with why."""
    report = Preflight(cluster=run.cluster.name, order=run.order, t=time.time())
    problems: list[str] = []
    unreached = unreached or {}
    # hosts checked side by side, so unreachable ones wait out their timeouts together
    with ThreadPoolExecutor(len(run.hosts)) as pool:
        checks = list(pool.map(lambda host: _check_host(run, host, change, unreached.get(host.name)), run.hosts))
    for host, (facts, host_problems, advice) in zip(run.hosts, checks, strict=False):
        report.hosts[host.name] = facts
        report.advice.extend(advice)
        problems += host_problems
        if not facts["reachable"]:
            run.progress(f"preflight {host.name}: UNREACHABLE")
        else:
            zones = ", ".join(z["name"] for z in facts.get("zones", []))
            run.progress(
                f"preflight {host.name}: {'ok' if not host_problems else 'PROBLEM'}; file sha256 "
                f"{str(facts.get('sha256'))[:12]}, anchor x{facts.get('anchor_count')}, "
                f"zones: {zones or 'none'}, agent Python {facts.get('agent_python')}"
            )
            if "processes" in facts:
                run.progress(f"  vLLM CPU of {host.name} sums: {deploy.describe_processes(facts['processes'])}")
        if "restored_leftover" in facts:
            run.progress(f"  restored {host.name}, which an earlier run left patched")
        for line in advice:
            run.progress(f"  {line}")
    problems += _wall_meters(run, report)
    report.restored_leftovers = [name for name, f in report.hosts.items() if "restored_leftover" in f]
    report.endpoint = {"url": run.cluster.endpoint, "model": _endpoint_model(run.cluster.endpoint)}
    if report.endpoint["model"] is None:
        run.progress(f"  {run.cluster.endpoint} does not answer yet: the first phase starts the server")
    if not problems:
        offsets, clock_problems = clock_offsets(run.hosts)
        problems += clock_problems.values()
        for key, values in offsets_record(offsets, "clock_offset").items():
            setattr(report, key, values)
        for name, offset in offsets.items():
            run.progress(
                f"clock of {name}: {offset.offset_s * 1000:+.1f} ± {offset.uncertainty_s * 1000:.1f} ms "
                f"against the controller (best of {offset.samples} round trips)"
            )
    all_trips = [z["trip_point_c"] for name in report.hosts for z in report.zones(name) if z["trip_point_c"]]
    lowest = deploy.lowest_trip_point(report.hosts)
    try:
        abort_at = abort_threshold(run.config, all_trips)
    except ConfigError as error:
        problems.append(str(error))
        abort_at = None
    report.safety = Safety(
        abort_at_c=abort_at, lowest_trip_point_c=min(all_trips, default=None), lowest_trip_point=lowest
    )
    run.progress(_interlock_line(abort_at, [name for name, f in report.hosts.items() if "zones" not in f]))
    if lowest:
        run.progress(f"  lowest trip point: {lowest}")
    return report, problems


def preflight(run: ClusterRun, out_path: Path, run_json: Path, invocation: dict | None = None) -> Preflight:
    """Take every host's lease and the endpoint's, then check every host before anything
    changes; raise naming each host and cause.

    The leases come first, all of them: a host or the endpoint another run holds (or whose
    lease is damaged) stops the run there, in one line naming the holder, and no host is changed
    (``lease.take_all`` gives back those it took).  A preflight that fails gives back the
    leases it took.  Preflight patches nothing and starts nothing (it only builds a
    simulated node's files and puts back what a dead run left patched), so no guardian
    watches it: a failed preflight leaves nothing to undo and no host is touched again.
    The guardian starts with the first job that does change something
    (``monitor.bring_up``).  ``invocation``: how Snakemake was started (``plan.invocation``),
    recorded in run.json."""
    run.write_session()
    taken, unreached = lease.take_all(run.lease_sites, run.run_dir)
    try:
        return _checked(run, out_path, run_json, unreached, invocation or {})
    except BaseException:
        lease.give_back(taken, lease.run_id(run.run_dir))
        raise


def _checked(run: ClusterRun, out_path: Path, run_json: Path, unreached: dict[str, str], invocation: dict) -> Preflight:
    failed_record = run.files.preflight_failed
    report, problems = inspect(run, unreached=unreached)
    trips = [z["trip_point_c"] for z in report.zones(run.cluster.head) if z["trip_point_c"]]
    if problems:
        # Snakemake deletes a failed job's outputs: the diagnosis is kept beside its log
        failed_record.parent.mkdir(parents=True, exist_ok=True)
        report.write(failed_record, problems=problems)
        raise PreflightError(
            f"preflight failed, nothing was changed ({failed_record} has the details):\n  " + "\n  ".join(problems)
        )
    failed_record.unlink(missing_ok=True)
    report.write(out_path)
    config = run.config
    load = config.load
    plan.write_run_json(  # the config's values thawed: run.json holds its lists and mappings
        run_json.parent,
        plan.run_plan(
            cluster=run.cluster.name,
            order=run.order,
            repeats=config.repeats,
            arms=thaw(config.arms),
            setting=config.setting.name,
            head=run.cluster.head,
            hosts=[h.name for h in run.hosts],
            analysis=thaw(config.analysis),
            questions=thaw(config.questions),
            until=config.until,
            max_repeats=config.max_repeats,
            budget_hours=config.budget_hours,
            time_scale=config.timings.time_scale,
            trip_point_c=min(trips, default=None),
            max_tokens=load.max_tokens,
            load_s=config.timings.load_s,
            min_load_s=config.timings.min_load_s,
            cooldown_max_s=config.timings.cooldown_max_s,
            users=thaw(load.users),
            rate=load.rate,
            burstiness=load.burstiness,
            think_s=load.think_s,
            wakeup_gaps_s=thaw(load.wakeup_gaps_s),
            slo=thaw(load.slo),
            idle_s=config.timings.idle_s,
            prompt_tokens=load.prompt_tokens,
            probe_n=load.probe_n if load.probe else 0,
            sample_intervals_s=thaw(config.monitor.intervals),
            hosts_without_zones=[name for name in report.hosts if not report.zones(name)],
            **invocation,
        ),
    )
    return report
