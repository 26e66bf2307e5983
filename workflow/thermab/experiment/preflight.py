"""Preflight: every host checked before anything changes (docs/design.md).

Records, per host, reachability, the target file (path, anchor count, sha256), the vLLM
version, the thermal zones the agent will log (found by the agent's own discovery) with
their trip points, and clock offsets; writes ``preflight.json`` and the run's plan
(``run.json``).  Problems that would make the run meaningless stop it here, naming each
host; advice that does not is printed and kept."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

from thermab.config import ConfigError, abort_threshold
from thermab.experiment import guardian, plan, server
from thermab.experiment.cluster import ClusterRun, clock_offsets
from thermab.experiment.patch import PatchError, anchor_count, patch_problems, sha256
from thermab.hosts.transport import TransportError
from thermab.telemetry import deploy


class PreflightError(RuntimeError):
    pass


def _zones(run: ClusterRun, host) -> list[dict]:
    found = deploy.discover(host, run.session).get("thermal") or {}
    return found.get("details", [])


VLLM_VERSION = "import vllm; print(vllm.__version__)"


def _check_host(run: ClusterRun, host) -> tuple[dict, list[str], list[str]]:
    """Facts about one host, the problems that stop the run, and advice that does not."""
    facts: dict = {"transport": host.spec.transport, "container": host.spec.container}
    problems: list[str] = []
    advice: list[str] = []
    try:
        facts["uname"] = host.run("uname -srm", timeout=30).stdout.strip()
        facts["reachable"] = True
    except TransportError as error:
        return {**facts, "reachable": False, "error": str(error)}, [str(error)], advice
    setting = run.config["setting"]
    if setting["method"] == "file":
        patcher = run.patcher(host)
        try:
            text = patcher.original().decode()
        except (TransportError, PatchError) as error:
            problems.append(f"host {host.name}: cannot read {setting['file']}: {error}")
        else:
            facts.update(file=patcher.file, sha256=sha256(text.encode()),
                         anchor_count=anchor_count(text, setting["anchor"]))
            values = {letter: arm["value"] for letter, arm in run.config["arms"].items()}
            problems += [f"host {host.name}: {patcher.file}: {problem}"
                         for problem in patch_problems(text, setting, values)]
    if not host.spec.simulated:
        python = shlex.quote(host.spec.settings.get("python", "python3"))
        version = host.exec(f"{python} -c {shlex.quote(VLLM_VERSION)}", check=False)
        facts["vllm_version"] = version.stdout.strip() if version.ok else None
        if not version.ok:
            advice.append(f"host {host.name}: vllm does not import with {python} (version not recorded)")
    facts["zones"] = _zones(run, host)
    if not facts["zones"]:
        advice.append(f"host {host.name}: no thermal zones found: its temperatures will be missing "
                      "(hwmon sensors are sampled where present)")
    return facts, problems, advice


def _endpoint_model(endpoint: str) -> str | None:
    try:
        return server.models(endpoint)[0]
    except (OSError, ValueError, KeyError, IndexError):
        return None


def preflight(run: ClusterRun, out_path: Path, run_json: Path) -> dict:
    """Check every host before anything changes; raise naming each host and cause."""
    run.write_session()
    guardian.ensure(run.run_dir)  # from here on, whatever happens is cleaned up
    run.power_on_simulated()
    restored = run.restore_leftovers()
    if restored:
        run.progress(f"restored hosts an earlier run left patched: {', '.join(restored)}")
    report: dict = {"cluster": run.cluster.name, "order": run.order, "t": time.time(),
                    "restored_leftovers": restored, "hosts": {}}
    problems: list[str] = []
    for host in run.hosts:
        facts, host_problems, advice = _check_host(run, host)
        report["hosts"][host.name] = facts
        report.setdefault("advice", []).extend(advice)
        problems += host_problems
        zones = ", ".join(z["name"] for z in facts.get("zones", []))
        run.progress(f"preflight {host.name}: {'ok' if not host_problems else 'PROBLEM'}; file sha256 "
                f"{str(facts.get('sha256'))[:12]}, anchor x{facts.get('anchor_count')}, zones: {zones or 'none'}")
        for line in host_problems + advice:
            run.progress(f"  {line}")
    report["endpoint"] = {"url": run.cluster.endpoint, "model": _endpoint_model(run.cluster.endpoint)}
    if report["endpoint"]["model"] is None:
        run.progress(f"  {run.cluster.endpoint} does not answer yet: the first phase starts the server")
    if not problems:
        report["clock_offset_s"] = clock_offsets(run.hosts)
    trips = [z["trip_point_c"] for z in report["hosts"].get(run.cluster.head, {}).get("zones", [])
             if z["trip_point_c"]]
    all_trips = [z["trip_point_c"] for facts in report["hosts"].values() for z in facts.get("zones", [])
                 if z["trip_point_c"]]
    try:
        abort_at = abort_threshold(run.config, all_trips)
    except ConfigError as error:
        problems.append(str(error))
        abort_at = None
    report["safety"] = {"abort_at_c": abort_at, "lowest_trip_point_c": min(all_trips, default=None)}
    run.progress(f"thermal interlock: {'load stops at %.1f °C on any zone of any host' % abort_at if abort_at else 'off (no trip point found and safety.abort_at_c not set)'}")
    out_path.write_text(json.dumps(report, indent=1))
    if problems:
        raise PreflightError("preflight failed, nothing was changed:\n  " + "\n  ".join(problems))
    config = run.config
    plan.write_run_json(run_json.parent, plan.run_plan(
        cluster=run.cluster.name, order=run.order, repeats=config["repeats"], arms=config["arms"],
        setting=config["setting"]["name"], head=run.cluster.head, hosts=[h.name for h in run.hosts],
        analysis=config["analysis"], trip_point_c=trips[0] if trips else None,
        max_tokens=config["load"]["max_tokens"], load_s=config["timings"]["load_s"],
        sample_intervals_s=config["monitor"]["intervals"],
        hosts_without_zones=[name for name, facts in report["hosts"].items() if not facts.get("zones")]))
    return report
