"""The stages of rules/phase.smk: the idle baseline and one phase job (patch, restart,
ready, then per level of load: load with probe, cool down).  The rules' scripts are one
call into here; the monitor around them is ``monitor``, what the load asks every second
``interlock``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from thermab.contracts import BaselineRecord, PhaseRecord, PhaseValidity, Preflight
from thermab.errors import StageFailed
from thermab.experiment import events, guardian, plan, progress, server
from thermab.experiment.cluster import ClusterRun
from thermab.experiment.interlock import Interlock, MarkForwarder, telemetry_holes
from thermab.experiment.monitor import bring_up
from thermab.load.runner import LoadAborted, LoadSpec, run_load
from thermab.telemetry import deploy, power, server_metrics, wall_poll


def _sleep_with_progress(run: ClusterRun, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        run.progress(f"{what}: {seconds - left:.0f}/{seconds:.0f} s, head {_hottest(run)}")
        time.sleep(min(left, 10))


def _hottest(run: ClusterRun) -> str:
    return progress.hottest(deploy.latest(run.head, run.session, "thermal"))


def _run_status(run: ClusterRun, window: plan.Phase, look_repeats: int, started: float) -> Callable[[], str]:
    """Where the run stands (experiment.progress) for the progress lines of a window's load
    and cooldown, also written to status.json for ``python -m thermab status``;
    ``started``: the load's start (time.monotonic)."""

    def hint() -> str:
        elapsed = time.monotonic() - started
        try:
            readings = {host.name: deploy.latest(host, run.session, "thermal") for host in run.hosts}
            events_so_far = events.read(run.run_dir)
            where = progress.position(run.config, run.order, look_repeats, window.id, elapsed, events_so_far)
            progress.write_status(run.files.status, where, window.arm, elapsed, readings)
        except Exception as error:  # a display aid: a failing read must not stop the phase
            return f"where the run stands is unknown now: {error!r}"
        return progress.line(where, run.config, window.arm, readings, run.cluster.head)

    return hint


def baseline(run: ClusterRun, out_path: Path) -> None:
    bring_up(run)
    start = run.event("baseline_start")["t"]
    _sleep_with_progress(run, run.config.timings.baseline_s, "baseline (idle)")
    end = run.event("baseline_end")["t"]
    BaselineRecord(t_start=start, t_end=end).write(out_path)


POWER_TAIL_ROWS = 2000  # of each of the head's power files: far more than IDLE_BEFORE_S of its readings


def head_power(run: ClusterRun, seconds: float) -> float | None:
    """W: the head's total power over the last ``seconds`` of its readings (None where it has
    no total domain or no reading there), read as the run goes: its meters at the wall where
    it has any (the controller's, on its clock), else its agent's."""
    rows = wall_poll.tail_rows(run.run_dir, run.head.name, POWER_TAIL_ROWS) or deploy.tail_power_rows(
        run.head, run.session, POWER_TAIL_ROWS
    )
    watts = power.recent_total_watts(rows, seconds)
    return None if math.isnan(watts) else round(watts, 3)


def _restart(run: ClusterRun, rep: int, arm: str) -> str:
    setting = run.config.setting
    value = run.config.arms[arm].value
    env = {}
    if setting.method == "file":
        patchers = [run.patcher(host) for host in run.hosts]
        for patcher in patchers:  # every original before any write: hosts sharing one file keep its unpatched bytes
            patcher.keep_original()
        for host, patcher in zip(run.hosts, patchers, strict=False):
            run.event("patch_applied", rep=rep, arm=arm, host=host.name, detail=patcher.apply(value))
    else:
        env = {setting.env_var: value}
        run.event("patch_applied", rep=rep, arm=arm, detail={"env": env})
    run.event("restart_start", rep=rep, arm=arm)
    server.restart_servers(run.hosts, run.cluster, env)
    return server.wait_ready(run.cluster.endpoint, run.config.timings.startup_timeout_s, progress=run.progress)


# Below the platform's lowest trip point by this much, a zone is taken not to throttle: what
# a speed-only phase waits for, where the hosts report trip points.
THROTTLE_MARGIN_C = 5.0


def cooldown_target(run: ClusterRun) -> tuple[float, str]:
    """The head zones' temperature a cooldown waits for, and why: ``timings.cooldown_below_c``,
    which equalises the arms' start temperatures for the heat questions; in a speed-only
    phase (no heat question open) only what speed needs, no throttling: THROTTLE_MARGIN_C
    under the lowest trip point preflight found (the heat cooldown where it found none)."""
    if run.speed_only:
        trip = Preflight.read(run.files.preflight).safety.lowest_trip_point_c
        if trip is not None:
            target = trip - THROTTLE_MARGIN_C
            return target, f"speed-only phase: under the lowest trip point {trip:g} °C − {THROTTLE_MARGIN_C:g}"
    return run.config.timings.cooldown_below_c, ""


def _cooldown(run: ClusterRun, rep: int, arm: str, level: dict, status: Callable[[], str]) -> dict:
    """``level``: the window's level as its events carry it (``_level_marks``)."""
    below, why = cooldown_target(run)
    cap = run.config.timings.cooldown_max_s
    start = time.monotonic()
    interval = float(run.config.monitor.intervals.thermal)
    while True:
        time.sleep(interval)
        zones = deploy.latest(run.head, run.session, "thermal")
        waited = time.monotonic() - start
        hottest = max(zones.values()) if zones else float("nan")
        if zones and hottest < below:
            reason = f"every head zone below {below:g} °C" + (f" ({why})" if why else "")
            break
        if waited >= cap:
            reason = f"time cap {cap:.0f} s reached " + (
                f"(hottest {hottest:.1f} °C)" if zones else "(no thermal zone on the head to wait for)"
            )
            break
        if int(waited) % 10 < interval:
            run.progress(f"cooldown: {waited:.0f}/{cap:.0f} s | {status()}")
    run.event("cooldown_end", rep=rep, arm=arm, **level, detail={"reason": reason})
    return {"reason": reason, "seconds": round(time.monotonic() - start, 1)}


def phase(run: ClusterRun, rep: int, arm: str) -> list[PhaseRecord]:
    """Patch, restart, ready, then for each level of load (one when ``load.users`` is a
    number; plan.job_phases orders them) a load with probe and a cool down: the phase job
    ``rep{rep}-{arm}``.  Each window's files lie in its own phase directory (layout)."""
    look_repeats = progress.look_repeats(run.config, run.order, rep)
    bring_up(run)
    chosen = run.config.arms[arm]
    run.progress(f"phase rep{rep}-{arm} ({chosen.label}, {run.config.setting.name} = {chosen.value})")
    # how idle the head is before its restart: the end of the cooldown before, or of the baseline
    idle_w_before = head_power(run, power.IDLE_BEFORE_S)
    model = _restart(run, rep, arm)
    run.event("server_ready", rep=rep, arm=arm, detail={"model": model})
    idle_s = run.config.timings.idle_s
    if idle_s:  # each arm at rest, its server up (docs/design.md, "Each arm at rest")
        run.event("idle_start", rep=rep, arm=arm)
        _sleep_with_progress(run, idle_s, f"rep{rep}-{arm} at rest (server up)")
        run.event("idle_end", rep=rep, arm=arm)
    return [
        _window(run, window, model, idle_w_before, look_repeats)
        for window in plan.job_phases(rep, arm, plan.levels(run.config.load))
    ]


def _level_marks(window: plan.Phase) -> dict:
    """What the events of a window in a run of levels carry: its ``users`` and its
    ``load_level`` (the label; docs/design.md, "Levels of load"); nothing in a run of one."""
    return {} if window.level is None else {"users": window.level.users, "load_level": window.level.label}


def _window(
    run: ClusterRun, window: plan.Phase, model: str, idle_w_before: float | None, look_repeats: int
) -> PhaseRecord:
    """One load window of a phase job, then the cooldown that the next one starts after.
    ``idle_w_before``: the head's power before the job's one restart, for every level (as
    analysis/washout.py reads it from the restart mark)."""
    rep, arm, files = window.rep, window.arm, run.files.phase(window.id)
    level = _level_marks(window)
    if window.level is not None:
        run.progress(f"phase {window.id}: {window.level.label}")
    marks = MarkForwarder(run, files.marks, rep, arm, level)
    interlock = Interlock(run, marks)
    # every zone as the load begins: did the arms start alike (analysis/washout.py)?
    start_zones = {host.name: deploy.latest(host, run.session, "thermal") for host in run.hosts}
    spec = LoadSpec.from_config(run.config, model)
    status = _run_status(run, window, look_repeats, time.monotonic())
    if window.level is not None:
        spec = spec.at(window.level)
    try:
        validity = _load(run, window, spec, interlock, status)
    except LoadAborted as error:
        marks.poll()
        run.progress(f"ABORT {error}: restoring and stopping every host now")
        run.shutdown(str(error), t=interlock.fired_at, rep=rep, arm=arm, **level)
        guardian.release(run.run_dir)  # everything is already put back
        raise StageFailed(f"phase {window.id} aborted: {error}") from None
    marks.poll()
    failed = validity["requests"]["load"] - validity["requests"]["load_ok"]
    if failed > run.config.load.max_failed or not validity["requests"]["load_ok"]:
        reason = (
            f"{failed} of {validity['requests']['load']} load requests failed (load.max_failed = "
            f"{run.config.load.max_failed}), first: {validity['errors']['first']}"
        )
        run.event("abort", rep=rep, arm=arm, **level, detail={"reason": reason})
        raise StageFailed(
            f"phase {window.id} failed: {reason}; records kept in "
            f"{files.records}, Locust's log in {run.files.locust_log(window.id)}"
        )
    load_window = validity["window"]
    holes = telemetry_holes(run, load_window)
    if holes:
        reason = "; ".join(holes)
        run.event("abort", rep=rep, arm=arm, **level, detail={"reason": reason})
        raise StageFailed(f"phase {window.id} failed: {reason} (see the agent's log on that host)")
    cooldown = _cooldown(run, rep, arm, level, status)
    result = PhaseRecord(
        phase=window.id,
        order=run.order,
        rep=rep,
        arm=arm,
        users=spec.users,
        load_level=spec.level.label,
        label=run.config.arms[arm].label,
        value=run.config.arms[arm].value,
        model=model,
        load_start=load_window["start"],
        load_end=load_window["end"],
        validity=validity,
        cooldown=cooldown,
        start_zones_c=start_zones,
        idle_w_before=idle_w_before,
        load_s=spec.duration_s,
    )
    result.write(files.phase_json)
    return result


def _load(
    run: ClusterRun, window: plan.Phase, spec: LoadSpec, interlock: Interlock, status: Callable[[], str]
) -> PhaseValidity:
    files = run.files.phase(window.id)
    scrape = server_metrics.Scraper(
        run.cluster.endpoint, files.server_metrics, run.config.monitor.intervals.server, progress=run.progress
    )
    with scrape:  # the server's own view of the load, beside the client's
        return run_load(
            run.cluster.endpoint,
            files.requests,
            spec,
            order=run.order,
            rep=window.rep,
            arm=window.arm,
            log_path=run.files.locust_log(window.id),
            progress=run.progress,
            status_hint=status,
            interlock=interlock,
        )
