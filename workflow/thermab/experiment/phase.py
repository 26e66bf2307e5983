"""What each host-touching rule does: preflight, monitor start, baseline, one phase,
monitor stop.  The rules' scripts are one call into here."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

from thermab import guardian, lifecycle, monitor
from thermab.config import ConfigError, abort_threshold
from thermab.load import LoadAborted, run_load
from thermab.patch import PatchError, anchor_count, sha256
from thermab.run import Run, clock_offsets
from thermab.transport import TransportError

ZONES_SCRIPT = (
    'for z in {base}/thermal_zone*; do [ -r "$z/temp" ] || continue; '
    'printf "%s\\t%s\\t%s\\t%s\\n" "${{z##*/}}" "$(cat $z/device/path 2>/dev/null)" '
    '"$(cat $z/type 2>/dev/null)" "$(cat $z/trip_point_0_temp 2>/dev/null)"; done')


class PreflightError(RuntimeError):
    pass


def _zones(host) -> list[dict]:
    base = shlex.quote(host.path("/sys/class/thermal"))
    result = host.run(ZONES_SCRIPT.format(base=base), check=False)
    zones = []
    for line in result.stdout.splitlines():
        index, path, kind, trip = (line.split("\t") + ["", "", "", ""])[:4]
        zones.append({"zone": index, "device_path": path, "type": kind,
                      "trip_point_c": int(trip) / 1000 if trip.strip().isdigit() else None})
    return zones


VLLM_VERSION = "import vllm; print(vllm.__version__)"


def _check_host(run: Run, host) -> tuple[dict, list[str], list[str]]:
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
            count = anchor_count(text, setting["anchor"])
            facts.update(file=patcher.file, sha256=sha256(text.encode()), anchor_count=count)
            if count != 1:
                problems.append(f"host {host.name}: anchor {setting['anchor']!r} matches {count} times "
                                f"in {patcher.file} (must be exactly 1): nothing will be patched")
    if not host.spec.simulated:
        python = shlex.quote(host.spec.settings.get("python", "python3"))
        version = host.exec(f"{python} -c {shlex.quote(VLLM_VERSION)}", check=False)
        facts["vllm_version"] = version.stdout.strip() if version.ok else None
        if not version.ok:
            advice.append(f"host {host.name}: vllm does not import with {python} (version not recorded)")
    facts["zones"] = _zones(host)
    if not facts["zones"]:
        advice.append(f"host {host.name}: no thermal zones found: its temperatures will be missing "
                      "(hwmon sensors are sampled where present)")
    return facts, problems, advice


def _endpoint_model(endpoint: str) -> str | None:
    try:
        return lifecycle.models(endpoint)[0]
    except (OSError, ValueError, KeyError, IndexError):
        return None


def preflight(run: Run, out_path: Path, run_json: Path) -> dict:
    """Check every host before anything changes; raise naming each host and cause."""
    run.write_session()
    guardian.ensure(run.run_dir)  # from here on, whatever happens is cleaned up
    run.power_on_simulated()
    restored = run.restore_leftovers()
    if restored:
        run.say(f"restored hosts an earlier run left patched: {', '.join(restored)}")
    report: dict = {"cluster": run.cluster.name, "order": run.order, "t": time.time(),
                    "restored_leftovers": restored, "hosts": {}}
    problems: list[str] = []
    for host in run.hosts:
        facts, host_problems, advice = _check_host(run, host)
        report["hosts"][host.name] = facts
        report.setdefault("advice", []).extend(advice)
        problems += host_problems
        zones = ", ".join(z["device_path"].split(".")[-1] or z["type"] for z in facts.get("zones", []))
        run.say(f"preflight {host.name}: {'ok' if not host_problems else 'PROBLEM'}; file sha256 "
                f"{str(facts.get('sha256'))[:12]}, anchor x{facts.get('anchor_count')}, zones: {zones or 'none'}")
        for line in host_problems + advice:
            run.say(f"  {line}")
    report["endpoint"] = {"url": run.cluster.endpoint, "model": _endpoint_model(run.cluster.endpoint)}
    if report["endpoint"]["model"] is None:
        run.say(f"  {run.cluster.endpoint} does not answer yet: the first phase starts the server")
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
    run.say(f"thermal interlock: {'load stops at %.1f °C on any zone of any host' % abort_at if abort_at else 'off (no trip point found and safety.abort_at_c not set)'}")
    out_path.write_text(json.dumps(report, indent=1))
    if problems:
        raise PreflightError("preflight failed, nothing was changed:\n  " + "\n  ".join(problems))
    analysis = run.config["analysis"]
    run_json.write_text(json.dumps({
        "cluster": run.cluster.name, "order": run.order, "repeats": run.config["repeats"],
        "arms": run.config["arms"], "reference_arm": next(iter(run.config["arms"])),
        "setting": run.config["setting"]["name"], "head": run.cluster.head,
        "hosts": [h.name for h in run.hosts], "thresholds_c": analysis["thresholds_c"],
        "trip_point_c": trips[0] if trips else None, "reference_lines_c": analysis["reference_lines_c"],
        "stall_gap_s": analysis["stall_gap_s"], "timeline_zone": analysis["timeline_zone"],
        "max_tokens": run.config["load"]["max_tokens"], "load_s": run.config["timings"]["load_s"],
    }, indent=1))
    return report


def monitor_start(run: Run, out_path: Path) -> None:
    run.event("run_start", detail={"cluster": run.cluster.name})
    run.ensure_up()
    out_path.write_text(json.dumps({"session": run.session, "t": time.time(),
                                    "agents": {h.name: monitor.agent_pid(h, run.session) for h in run.hosts}},
                                   indent=1))


def _sleep_with_progress(run: Run, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        run.say(f"{what}: {seconds - left:.0f}/{seconds:.0f} s, head {_hottest(run)}")
        time.sleep(min(left, 10))


def _hottest(run: Run) -> str:
    zones = monitor.latest(run.head, run.session, "thermal")
    if not zones:
        return "no thermal sample yet"
    name = max(zones, key=zones.get)
    return f"hottest {name} {zones[name]:.1f} °C"


def baseline(run: Run, out_path: Path) -> None:
    run.ensure_up()
    start = run.event("baseline_start")["t"]
    _sleep_with_progress(run, run.config["timings"]["baseline_s"], "baseline (idle)")
    end = run.event("baseline_end")["t"]
    out_path.write_text(json.dumps({"phase": "baseline", "t_start": start, "t_end": end}, indent=1))


def _restart(run: Run, rep: int, arm: str) -> str:
    setting = run.config["setting"]
    value = run.config["arms"][arm]["value"]
    env = {}
    if setting["method"] == "file":
        for host in run.hosts:
            done = run.patcher(host).apply(value)
            run.event("patch_applied", rep=rep, arm=arm, host=host.name, detail=done)
    else:
        env = {setting["env_var"]: value}
        run.event("patch_applied", rep=rep, arm=arm, detail={"env": env})
    run.event("restart_start", rep=rep, arm=arm)
    lifecycle.stop_servers(run.hosts)
    lifecycle.start_servers(run.hosts, env)
    return lifecycle.wait_ready(run.cluster.endpoint, run.config["timings"]["startup_timeout_s"],
                                progress=run.say)


def _cooldown(run: Run, rep: int, arm: str) -> dict:
    timings = run.config["timings"]
    below, cap = timings["cooldown_below_c"], timings["cooldown_max_s"]
    start = time.monotonic()
    interval = float(run.config["monitor"]["intervals"]["thermal"])
    while True:
        time.sleep(interval)
        zones = monitor.latest(run.head, run.session, "thermal")
        waited = time.monotonic() - start
        hottest = max(zones.values()) if zones else float("nan")
        if zones and hottest < below:
            reason = f"every head zone below {below} °C"
            break
        if waited >= cap:
            reason = f"time cap {cap:.0f} s reached " + (f"(hottest {hottest:.1f} °C)" if zones else
                                                         "(no thermal zone on the head to wait for)")
            break
        if int(waited) % 10 < interval:
            run.say(f"cooldown: {waited:.0f}/{cap:.0f} s, head {_hottest(run)}")
    run.event("cooldown_end", rep=rep, arm=arm, detail={"reason": reason})
    return {"reason": reason, "seconds": round(time.monotonic() - start, 1)}


AGENT_CHECK_S = 5.0


class MarkForwarder:
    """Copies the load's own marks (load_start, probe_*, load_end, written by the
    locustfile as they happen) into events.jsonl while the load runs."""

    def __init__(self, run: Run, marks_path: Path, rep: int, arm: str):
        self.run, self.path, self.rep, self.arm = run, marks_path, rep, arm
        self.forwarded = 0

    def poll(self) -> None:
        if not self.path.exists():
            return
        # one read: judging completeness from a second read could pass on a half-written line
        text = self.path.read_text()
        complete = [line for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]
        for line in complete[self.forwarded:]:
            mark = json.loads(line)
            self.run.event(mark["event"], t=mark["t"], rep=self.rep, arm=self.arm)
        self.forwarded = max(self.forwarded, len(complete))


def _watch(run: Run, marks: MarkForwarder):
    """What the load asks every second: forward its marks to events.jsonl; the thermal
    interlock (any zone of any host at the abort limit stops the load); and, every few
    seconds, that every agent still runs (a dead one is restarted at once; its restart
    row marks the gap)."""
    abort_at = json.loads((run.run_dir / "preflight.json").read_text())["safety"]["abort_at_c"]
    next_agent_check = time.monotonic() + AGENT_CHECK_S

    def check() -> str | None:
        nonlocal next_agent_check
        marks.poll()
        if time.monotonic() >= next_agent_check:
            next_agent_check = time.monotonic() + AGENT_CHECK_S
            for host in run.hosts:
                if monitor.agent_pid(host, run.session) is None:
                    pid = monitor.start_agent(host, run.session, run.agent_settings(host))
                    run.say(f"agent on {host.name} had stopped: restarted (pid {pid})")
                    run.event("note", host=host.name, detail={"agent_restarted": pid})
        if abort_at is None:
            return None
        for host in run.hosts:
            for zone, value in monitor.latest(host, run.session, "thermal").items():
                if value >= abort_at:
                    check.fired_at = time.time()
                    return (f"thermal interlock: host {host.name} zone {zone} at {value:.1f} °C "
                            f">= safety.abort_at_c {abort_at:.1f} °C")
        return None

    check.fired_at = None
    return check


def phase(run: Run, rep: int, arm: str, out_json: Path, out_requests: Path, load_log: Path) -> dict:
    """Patch, restart, ready, load with probe, cool down: one ``rep{rep}-{arm}``."""
    run.ensure_up()
    label = run.config["arms"][arm]["label"]
    run.say(f"phase rep{rep}-{arm} ({label}, {run.config['setting']['name']} = "
            f"{run.config['arms'][arm]['value']})")
    model = _restart(run, rep, arm)
    run.event("server_ready", rep=rep, arm=arm, detail={"model": model})
    marks = MarkForwarder(run, out_requests.parent / "load_events.jsonl", rep, arm)
    watch = _watch(run, marks)
    try:
        validity = _load(run, rep, arm, out_requests, load_log, model, watch)
    except LoadAborted as error:
        marks.poll()
        run.say(f"ABORT {error}: restoring and stopping every host now")
        run.shutdown(str(error), t=watch.fired_at, rep=rep, arm=arm)
        guardian.release(run.run_dir)  # everything is already put back
        raise RuntimeError(f"phase rep{rep}-{arm} aborted: {error}") from None
    marks.poll()
    failed = validity["requests"]["load"] - validity["requests"]["load_ok"]
    if failed > run.config["load"]["max_failed"] or not validity["requests"]["load_ok"]:
        reason = (f"{failed} of {validity['requests']['load']} load requests failed (load.max_failed = "
                  f"{run.config['load']['max_failed']}), first: {validity['errors']['first']}")
        run.event("abort", rep=rep, arm=arm, detail={"reason": reason})
        raise RuntimeError(f"phase rep{rep}-{arm} failed: {reason}; records kept in "
                           f"{out_requests.with_suffix('.jsonl')}, Locust's log in {load_log}")
    window = validity["window"]
    cooldown = _cooldown(run, rep, arm)
    result = {"phase": f"rep{rep}-{arm}", "order": run.order, "rep": rep, "arm": arm, "label": label,
              "value": run.config["arms"][arm]["value"], "model": model, "load_start": window["start"],
              "load_end": window["end"], "validity": validity, "cooldown": cooldown}
    out_json.write_text(json.dumps(result, indent=1, default=str))
    return result


def _load(run: Run, rep: int, arm: str, out_requests: Path, load_log: Path, model: str, watch) -> dict:
    load = run.config["load"]
    duration = run.config["timings"]["load_s"]
    return run_load(
        run.cluster.endpoint, out_requests, order=run.order, rep=rep, arm=arm,
        users=load["users"], duration_s=round(duration), max_tokens=load["max_tokens"],
        prompt_tokens=load["prompt_tokens"], model=load["model"] or model,
        extra_body=load["extra_body"], probe=load["probe"], probe_at=load["probe_at"] * duration,
        probe_n=load["probe_n"], probe_tokens=load["probe_tokens"],
        stall_gap_s=run.config["analysis"]["stall_gap_s"], log_path=load_log,
        progress=run.say, status_hint=lambda: f"head {_hottest(run)}", interlock=watch)


def monitor_stop(run: Run, out_path: Path) -> None:
    """End of the run: restore, stop, pull every host's logs, release the guardian."""
    offsets_end = clock_offsets(run.hosts)
    problems = run.shutdown("completed")
    run.event("run_end", detail={"problems": problems})
    guardian.release(run.run_dir)
    out_path.write_text(json.dumps({"t": time.time(), "clock_offset_end_s": offsets_end,
                                    "problems": problems}, indent=1))
    if problems:
        raise RuntimeError("the run ended with problems (see above); logs pulled where possible")
