"""The host-touching stages after preflight: monitor start, the idle baseline, one phase
(patch, restart, ready, load with probe, cool down) and monitor stop.  The rules'
scripts are one call into here."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from thermab.config import sensor_silence_s
from thermab.errors import StageFailed
from thermab.experiment import guardian, server
from thermab.experiment.cluster import ClusterRun, clock_offsets, offsets_record
from thermab.hosts import clock
from thermab.jsonl import JsonlTail
from thermab.layout import PhaseDir
from thermab.load.runner import LoadAborted, LoadSpec, run_load
from thermab.telemetry import deploy, power, server_metrics
from thermab.telemetry.agent import ProcessCpu, ThermalZones


def bring_up(run: ClusterRun) -> None:
    """A guardian watching this Snakemake first, then hardware and agents: from here on,
    whatever happens is cleaned up."""
    run.write_session()
    guardian.ensure(run.run_dir)
    run.ensure_up()


def monitor_start(run: ClusterRun, out_path: Path) -> None:
    run.event("run_start", detail={"cluster": run.cluster.name})
    bring_up(run)
    out_path.write_text(json.dumps({"session": run.session, "t": time.time(),
                                    "agents": {h.name: deploy.agent_pid(h, run.session) for h in run.hosts}},
                                   indent=1))


def _sleep_with_progress(run: ClusterRun, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        run.progress(f"{what}: {seconds - left:.0f}/{seconds:.0f} s, head {_hottest(run)}")
        time.sleep(min(left, 10))


def _hottest(run: ClusterRun) -> str:
    zones = deploy.latest(run.head, run.session, "thermal")
    if not zones:
        return "no thermal sample yet"
    name = max(zones, key=zones.get)
    return f"hottest {name} {zones[name]:.1f} °C"


def baseline(run: ClusterRun, out_path: Path) -> None:
    bring_up(run)
    start = run.event("baseline_start")["t"]
    _sleep_with_progress(run, run.config["timings"]["baseline_s"], "baseline (idle)")
    end = run.event("baseline_end")["t"]
    out_path.write_text(json.dumps({"phase": "baseline", "t_start": start, "t_end": end}, indent=1))


POWER_TAIL_ROWS = 2000  # of each of the head's power files: far more than IDLE_BEFORE_S of its readings


def head_power(run: ClusterRun, seconds: float) -> float | None:
    """W: the head's total power over the last ``seconds`` of its agent's readings (None
    where it has no total domain or no reading there), read as the run goes."""
    watts = power.recent_total_watts(deploy.tail_power_rows(run.head, run.session, POWER_TAIL_ROWS), seconds)
    return None if math.isnan(watts) else round(watts, 3)


def _restart(run: ClusterRun, rep: int, arm: str) -> str:
    setting = run.config["setting"]
    value = run.config["arms"][arm]["value"]
    env = {}
    if setting["method"] == "file":
        patchers = [run.patcher(host) for host in run.hosts]
        for patcher in patchers:  # every original before any write: hosts sharing one file keep its unpatched bytes
            patcher.keep_original()
        for host, patcher in zip(run.hosts, patchers):
            run.event("patch_applied", rep=rep, arm=arm, host=host.name, detail=patcher.apply(value))
    else:
        env = {setting["env_var"]: value}
        run.event("patch_applied", rep=rep, arm=arm, detail={"env": env})
    run.event("restart_start", rep=rep, arm=arm)
    server.stop_servers(run.hosts)
    server.start_servers(run.hosts, env)
    return server.wait_ready(run.cluster.endpoint, run.config["timings"]["startup_timeout_s"],
                                progress=run.progress)


def _cooldown(run: ClusterRun, rep: int, arm: str) -> dict:
    timings = run.config["timings"]
    below, cap = timings["cooldown_below_c"], timings["cooldown_max_s"]
    start = time.monotonic()
    interval = float(run.config["monitor"]["intervals"]["thermal"])
    while True:
        time.sleep(interval)
        zones = deploy.latest(run.head, run.session, "thermal")
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
            run.progress(f"cooldown: {waited:.0f}/{cap:.0f} s, head {_hottest(run)}")
    run.event("cooldown_end", rep=rep, arm=arm, detail={"reason": reason})
    return {"reason": reason, "seconds": round(time.monotonic() - start, 1)}


AGENT_CHECK_S = 5.0


class MarkForwarder:
    """Copies the load's own marks (load_start, probe_*, load_end, written by the
    locustfile as they happen) into events.jsonl while the load runs."""

    def __init__(self, run: ClusterRun, marks_path: Path, rep: int, arm: str):
        self.run, self.rep, self.arm = run, rep, arm
        self.tail = JsonlTail(marks_path)
        self.seen: dict[str, float] = {}  # each mark forwarded so far, with its time

    def poll(self) -> None:
        self.tail.poll()
        for mark in self.tail.new:
            self.run.event(mark["event"], t=mark["t"], rep=self.rep, arm=self.arm)
            self.seen.setdefault(mark["event"], mark["t"])


CAP_SLACK_S = 5.0  # the load's own end mark may take this long to reach the controller


class Interlock:
    """What the load asks every second; called, it answers the reason to stop, or None.

    - forward the load's marks to events.jsonl;
    - every few seconds, check every agent still runs: a dead one is restarted at once
      (its restart row marks the gap); one that cannot start stops the load;
    - the thermal interlock: any zone of any host at ``abort_at_c`` stops the load;
    - fail safe: a host whose zones were found at preflight and that has given no fresh
      thermal reading for ``safety.max_sensor_silence_s`` is blind, and stops the load;
    - ``safety.max_load_minutes``, kept by the controller itself: a load still running
      (no load_end mark) that long after its start is stopped."""

    def __init__(self, run: ClusterRun, marks: MarkForwarder):
        self.run, self.marks = run, marks
        preflight = json.loads(run.files.preflight.read_text())
        self.abort_at = preflight["safety"]["abort_at_c"]
        self.offsets = preflight.get("clock_offset_s", {})
        self.watched = {name for name, facts in preflight["hosts"].items() if facts.get("zones")}
        self.silence_s = sensor_silence_s(run.config)
        cap = run.config["safety"]["max_load_minutes"]
        self.cap_s = cap * 60 if cap is not None else None
        self.started = time.time()
        self.restarted: dict[str, float] = {}  # host -> when its agent was last restarted
        self.next_agent_check = time.monotonic() + AGENT_CHECK_S
        self.fired_at: float | None = None

    def _restart_dead_agents(self) -> str | None:
        run = self.run
        self.next_agent_check = time.monotonic() + AGENT_CHECK_S
        for host in run.hosts:
            if deploy.agent_pid(host, run.session) is None:
                try:
                    pid = deploy.start_agent(host, run.session, run.agent_settings(host))
                except deploy.AgentError as error:
                    return f"blind: host {host.name}'s agent stopped and cannot start again: {error}"
                self.restarted[host.name] = time.time()
                run.progress(f"agent on {host.name} had stopped: restarted (pid {pid})")
                run.event("note", host=host.name, detail={"agent_restarted": pid})
        return None

    def _over_time(self) -> str | None:
        if self.cap_s is None or "load_end" in self.marks.seen:
            return None
        elapsed = time.time() - self.marks.seen.get("load_start", self.started)
        if elapsed <= self.cap_s + CAP_SLACK_S:
            return None
        return (f"safety.max_load_minutes: the load has run {elapsed:.0f} s without ending, past "
                f"{self.cap_s / 60:g} min")

    def _blind(self, host, readings: dict) -> str | None:
        """Whether a watched host has gone without a fresh reading too long: its silence
        counts from its newest reading (on the controller's clock), the start of the load,
        or its agent's restart, whichever is last."""
        newest = max((t - self.offsets.get(host.name, 0.0) for t, _value in readings.values()), default=None)
        since = max(newest or 0.0, self.started, self.restarted.get(host.name, 0.0))
        if time.time() - since <= self.silence_s:
            return None
        # a dead agent is restarted first, and its first readings are given the same time
        reason = self._restart_dead_agents()
        if reason or self.restarted.get(host.name, 0.0) > since:
            return reason
        silent = "no thermal reading at all" if newest is None else (
            f"no thermal reading for {time.time() - newest:.0f} s")
        return (f"blind: host {host.name} has given {silent} (safety.max_sensor_silence_s "
                f"{self.silence_s:g} s): its zones cannot be watched")

    def _thermal(self) -> str | None:
        for host in self.run.hosts:
            readings = deploy.latest_readings(host, self.run.session, "thermal")
            for zone, (_t, value) in readings.items():
                if value >= self.abort_at:
                    return (f"thermal interlock: host {host.name} zone {zone} at {value:.1f} °C "
                            f">= safety.abort_at_c {self.abort_at:.1f} °C")
            if host.name in self.watched:
                reason = self._blind(host, readings)
                if reason:
                    return reason
        return None

    def __call__(self) -> str | None:
        self.marks.poll()
        reason = None
        if time.monotonic() >= self.next_agent_check:
            reason = self._restart_dead_agents()
        reason = reason or self._over_time()
        if reason is None and self.abort_at is not None:
            reason = self._thermal()
        if reason:
            self.fired_at = time.time()
        return reason


def telemetry_holes(run: ClusterRun, window: dict) -> list[str]:
    """Hosts expected to report (their agent runs; zones found at preflight for thermal)
    with no sample of a source in the load window: a phase without them has a silent hole."""
    preflight = json.loads(run.files.preflight.read_text())
    offsets = preflight.get("clock_offset_s", {})
    holes = []
    for host in run.hosts:
        offset = offsets.get(host.name, 0.0)
        expected = [(ProcessCpu.name, ProcessCpu.sensor)]
        if preflight["hosts"].get(host.name, {}).get("zones"):
            expected.append((ThermalZones.name, None))
        for source, sensor in expected:
            if not deploy.count_readings(host, run.session, source, window["start"] + offset,
                                         window["end"] + offset, sensor):
                holes.append(f"host {host.name} has no {source} sample in the load window")
    return holes


def phase(run: ClusterRun, rep: int, arm: str, out_json: Path, out_requests: Path, load_log: Path) -> dict:
    """Patch, restart, ready, load with probe, cool down: one ``rep{rep}-{arm}``."""
    bring_up(run)
    label = run.config["arms"][arm]["label"]
    run.progress(f"phase rep{rep}-{arm} ({label}, {run.config['setting']['name']} = "
            f"{run.config['arms'][arm]['value']})")
    # how idle the head is before its restart: the end of the cooldown before, or of the baseline
    idle_w_before = head_power(run, power.IDLE_BEFORE_S)
    model = _restart(run, rep, arm)
    run.event("server_ready", rep=rep, arm=arm, detail={"model": model})
    marks = MarkForwarder(run, PhaseDir(out_requests.parent).marks, rep, arm)
    interlock = Interlock(run, marks)
    # every zone as the load begins: did the arms start alike (analysis/washout.py)?
    start_zones = {host.name: deploy.latest(host, run.session, "thermal") for host in run.hosts}
    try:
        validity = _load(run, rep, arm, out_requests, load_log, model, interlock)
    except LoadAborted as error:
        marks.poll()
        run.progress(f"ABORT {error}: restoring and stopping every host now")
        run.shutdown(str(error), t=interlock.fired_at, rep=rep, arm=arm)
        guardian.release(run.run_dir)  # everything is already put back
        raise StageFailed(f"phase rep{rep}-{arm} aborted: {error}") from None
    marks.poll()
    failed = validity["requests"]["load"] - validity["requests"]["load_ok"]
    if failed > run.config["load"]["max_failed"] or not validity["requests"]["load_ok"]:
        reason = (f"{failed} of {validity['requests']['load']} load requests failed (load.max_failed = "
                  f"{run.config['load']['max_failed']}), first: {validity['errors']['first']}")
        run.event("abort", rep=rep, arm=arm, detail={"reason": reason})
        raise StageFailed(f"phase rep{rep}-{arm} failed: {reason}; records kept in "
                           f"{PhaseDir(out_requests.parent).records}, Locust's log in {load_log}")
    window = validity["window"]
    holes = telemetry_holes(run, window)
    if holes:
        reason = "; ".join(holes)
        run.event("abort", rep=rep, arm=arm, detail={"reason": reason})
        raise StageFailed(f"phase rep{rep}-{arm} failed: {reason} (see the agent's log on that host)")
    cooldown = _cooldown(run, rep, arm)
    result = {"phase": f"rep{rep}-{arm}", "order": run.order, "rep": rep, "arm": arm, "label": label,
              "value": run.config["arms"][arm]["value"], "model": model, "load_start": window["start"],
              "load_end": window["end"], "validity": validity, "cooldown": cooldown,
              "start_zones_c": start_zones, "idle_w_before": idle_w_before}
    out_json.write_text(json.dumps(result, indent=1, default=str))
    return result


def _load(run: ClusterRun, rep: int, arm: str, out_requests: Path, load_log: Path, model: str,
          interlock: Interlock) -> dict:
    scrape = server_metrics.Scraper(run.cluster.endpoint, PhaseDir(out_requests.parent).server_metrics,
                                    run.config["monitor"]["intervals"]["server"], progress=run.progress)
    with scrape:  # the server's own view of the load, beside the client's
        return run_load(run.cluster.endpoint, out_requests, LoadSpec.from_config(run.config, model),
                        order=run.order, rep=rep, arm=arm, log_path=load_log, progress=run.progress,
                        status_hint=lambda: f"head {_hottest(run)}", interlock=interlock)


def clock_drift(run: ClusterRun, offsets_end: dict[str, clock.Offset]) -> dict[str, float]:
    """Hosts whose clock moved against the controller's during the run by more than the
    two measurements' uncertainties explain (ingest corrects with the mean of the two)."""
    start = json.loads(run.files.preflight.read_text())
    uncertainty = start.get("clock_offset_uncertainty_s", {})
    drifts = {}
    for name, end in offsets_end.items():
        if name in uncertainty:
            moved = clock.drift(clock.Offset(start["clock_offset_s"][name], uncertainty[name], 0), end)
            if moved is not None:
                drifts[name] = moved
                run.progress(f"WARNING clock of {name} moved {moved * 1000:+.1f} ms against the controller "
                             f"during the run (more than the ± {(uncertainty[name] + end.uncertainty_s) * 1000:.1f} ms "
                             "the two measurements allow); its samples are placed with the mean offset")
    return drifts


def monitor_stop(run: ClusterRun, out_path: Path) -> None:
    """End of the run: restore, stop, pull every host's logs, release the guardian."""
    offsets_end, clock_problems = clock_offsets(run.hosts)
    problems = run.shutdown("completed")
    run.event("run_end", detail={"problems": problems})
    guardian.release(run.run_dir)
    for problem in clock_problems.values():
        run.progress(f"WARNING clock offset at the end not measured: {problem}")
    out_path.write_text(json.dumps({"t": time.time(), **offsets_record(offsets_end, "clock_offset_end"),
                                    "clock_drift_s": clock_drift(run, offsets_end),
                                    "problems": problems}, indent=1))
    if problems:
        raise StageFailed("the run ended with problems (see above); logs pulled where possible")
