"""The stages of rules/phase.smk: the idle baseline and one phase job (patch, restart,
ready, then per level of load: load with probe, cool down).  The rules' scripts are one
call into here; the monitor around them is ``monitor``, what the load asks every second
``interlock``."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from thermab.contracts import BaselineRecord, PhaseRecord, PhaseValidity
from thermab.errors import StageFailed
from thermab.experiment import guardian, plan, server
from thermab.experiment.cluster import ClusterRun
from thermab.experiment.interlock import Interlock, MarkForwarder, telemetry_holes
from thermab.experiment.monitor import bring_up
from thermab.load.runner import LoadAborted, LoadSpec, run_load
from thermab.telemetry import deploy, power, server_metrics


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
    BaselineRecord(t_start=start, t_end=end).write(out_path)


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
        for host, patcher in zip(run.hosts, patchers, strict=False):
            run.event("patch_applied", rep=rep, arm=arm, host=host.name, detail=patcher.apply(value))
    else:
        env = {setting["env_var"]: value}
        run.event("patch_applied", rep=rep, arm=arm, detail={"env": env})
    run.event("restart_start", rep=rep, arm=arm)
    server.stop_servers(run.hosts)
    server.start_servers(run.hosts, env)
    return server.wait_ready(run.cluster.endpoint, run.config["timings"]["startup_timeout_s"], progress=run.progress)


def _cooldown(run: ClusterRun, rep: int, arm: str, users: int | None) -> dict:
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
            reason = f"time cap {cap:.0f} s reached " + (
                f"(hottest {hottest:.1f} °C)" if zones else "(no thermal zone on the head to wait for)"
            )
            break
        if int(waited) % 10 < interval:
            run.progress(f"cooldown: {waited:.0f}/{cap:.0f} s, head {_hottest(run)}")
    run.event("cooldown_end", rep=rep, arm=arm, users=users, detail={"reason": reason})
    return {"reason": reason, "seconds": round(time.monotonic() - start, 1)}


def phase(run: ClusterRun, rep: int, arm: str) -> list[PhaseRecord]:
    """Patch, restart, ready, then for each level of load (one when ``load.users`` is a
    number; plan.job_phases orders them) a load with probe and a cool down: the phase job
    ``rep{rep}-{arm}``.  Each window's files lie in its own phase directory (layout)."""
    bring_up(run)
    label = run.config["arms"][arm]["label"]
    run.progress(
        f"phase rep{rep}-{arm} ({label}, {run.config['setting']['name']} = {run.config['arms'][arm]['value']})"
    )
    # how idle the head is before its restart: the end of the cooldown before, or of the baseline
    idle_w_before = head_power(run, power.IDLE_BEFORE_S)
    model = _restart(run, rep, arm)
    run.event("server_ready", rep=rep, arm=arm, detail={"model": model})
    return [
        _window(run, window, model, idle_w_before)
        for window in plan.job_phases(rep, arm, plan.levels(run.config["load"]["users"]))
    ]


def _window(run: ClusterRun, window: plan.Phase, model: str, idle_w_before: float | None) -> PhaseRecord:
    """One load window of a phase job, then the cooldown that the next one starts after.
    ``idle_w_before``: the head's power before the job's one restart, for every level (as
    analysis/washout.py reads it from the restart mark)."""
    rep, arm, files = window.rep, window.arm, run.files.phase(window.id)
    if window.users is not None:
        run.progress(f"phase {window.id}: {window.users} users")
    marks = MarkForwarder(run, files.marks, rep, arm, window.users)
    interlock = Interlock(run, marks)
    # every zone as the load begins: did the arms start alike (analysis/washout.py)?
    start_zones = {host.name: deploy.latest(host, run.session, "thermal") for host in run.hosts}
    spec = LoadSpec.from_config(run.config, model)
    if window.users is not None:
        spec = dataclasses.replace(spec, users=window.users)
    try:
        validity = _load(run, window, spec, interlock)
    except LoadAborted as error:
        marks.poll()
        run.progress(f"ABORT {error}: restoring and stopping every host now")
        run.shutdown(str(error), t=interlock.fired_at, rep=rep, arm=arm)
        guardian.release(run.run_dir)  # everything is already put back
        raise StageFailed(f"phase {window.id} aborted: {error}") from None
    marks.poll()
    failed = validity["requests"]["load"] - validity["requests"]["load_ok"]
    if failed > run.config["load"]["max_failed"] or not validity["requests"]["load_ok"]:
        reason = (
            f"{failed} of {validity['requests']['load']} load requests failed (load.max_failed = "
            f"{run.config['load']['max_failed']}), first: {validity['errors']['first']}"
        )
        run.event("abort", rep=rep, arm=arm, users=window.users, detail={"reason": reason})
        raise StageFailed(
            f"phase {window.id} failed: {reason}; records kept in "
            f"{files.records}, Locust's log in {run.files.locust_log(window.id)}"
        )
    load_window = validity["window"]
    holes = telemetry_holes(run, load_window)
    if holes:
        reason = "; ".join(holes)
        run.event("abort", rep=rep, arm=arm, users=window.users, detail={"reason": reason})
        raise StageFailed(f"phase {window.id} failed: {reason} (see the agent's log on that host)")
    cooldown = _cooldown(run, rep, arm, window.users)
    result = PhaseRecord(
        phase=window.id,
        order=run.order,
        rep=rep,
        arm=arm,
        users=spec.users,
        label=run.config["arms"][arm]["label"],
        value=run.config["arms"][arm]["value"],
        model=model,
        load_start=load_window["start"],
        load_end=load_window["end"],
        validity=validity,
        cooldown=cooldown,
        start_zones_c=start_zones,
        idle_w_before=idle_w_before,
    )
    result.write(files.phase_json)
    return result


def _load(run: ClusterRun, window: plan.Phase, spec: LoadSpec, interlock: Interlock) -> PhaseValidity:
    files = run.files.phase(window.id)
    scrape = server_metrics.Scraper(
        run.cluster.endpoint, files.server_metrics, run.config["monitor"]["intervals"]["server"], progress=run.progress
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
            status_hint=lambda: f"head {_hottest(run)}",
            interlock=interlock,
        )
