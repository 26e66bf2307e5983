"""What the load asks every second while it runs (``Interlock``), and the checks around a
load window: the load's own marks forwarded to events.jsonl, the telemetry holes."""

from __future__ import annotations

import time
from pathlib import Path

from thermab.config import sensor_silence_s
from thermab.contracts import Preflight
from thermab.experiment.cluster import ClusterRun
from thermab.jsonl import JsonlTail
from thermab.telemetry import deploy
from thermab.telemetry.agent import ProcessCpu, ThermalZones

AGENT_CHECK_S = 5.0


class MarkForwarder:
    """Copies the load's own marks (load_start, probe_*, load_end, written by the
    locustfile as they happen) into events.jsonl while the load runs."""

    def __init__(self, run: ClusterRun, marks_path: Path, rep: int, arm: str, level: dict | None = None):
        self.run, self.rep, self.arm = run, rep, arm
        # the window's users and load_level, on each mark (docs/design.md, "Levels of load")
        self.level = level or {}
        self.tail = JsonlTail(marks_path)
        self.seen: dict[str, float] = {}  # each mark forwarded so far, with its time

    def poll(self) -> None:
        self.tail.poll()
        for mark in self.tail.new:
            self.run.event(mark["event"], t=mark["t"], rep=self.rep, arm=self.arm, **self.level)
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
        preflight = Preflight.read(run.files.preflight)
        self.abort_at = preflight.safety.abort_at_c
        self.offsets = preflight.clock_offset_s
        self.watched = preflight.watched
        self.silence_s = sensor_silence_s(run.config)
        cap = run.config.safety.max_load_minutes
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
        return f"safety.max_load_minutes: the load has run {elapsed:.0f} s without ending, past {self.cap_s / 60:g} min"

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
        silent = (
            "no thermal reading at all" if newest is None else (f"no thermal reading for {time.time() - newest:.0f} s")
        )
        return (
            f"blind: host {host.name} has given {silent} (safety.max_sensor_silence_s "
            f"{self.silence_s:g} s): its zones cannot be watched"
        )

    def _thermal(self) -> str | None:
        for host in self.run.hosts:
            readings = deploy.latest_readings(host, self.run.session, "thermal")
            for zone, (_t, value) in readings.items():
                if value >= self.abort_at:
                    return (
                        f"thermal interlock: host {host.name} zone {zone} at {value:.1f} °C "
                        f">= safety.abort_at_c {self.abort_at:.1f} °C"
                    )
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
    preflight = Preflight.read(run.files.preflight)
    offsets, watched = preflight.clock_offset_s, preflight.watched
    holes = []
    for host in run.hosts:
        offset = offsets.get(host.name, 0.0)
        expected = [(ProcessCpu.name, ProcessCpu.sensor)]
        if host.name in watched:
            expected.append((ThermalZones.name, None))
        for source, sensor in expected:
            if not deploy.count_readings(
                host, run.session, source, window["start"] + offset, window["end"] + offset, sensor
            ):
                holes.append(f"host {host.name} has no {source} sample in the load window")
    return holes
