"""Writes small synthetic run directories (the contracts of docs/design.md) for the analysis tests."""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from thermab import load_levels
from thermab.analysis.model import Plan
from thermab.experiment import plan
from thermab.load import validity
from thermab.load.shapes import Shape

ARMS = {"A": {"label": "stock", "value": "1"}, "B": {"label": "patched", "value": "0.002"}}
PHASE_S = 300.0
GAP_S = 120.0
USERS = 4
MAX_TOKENS = 400
PROBE_TOKENS = 256
BASELINE = (5.0, 55.0)  # seconds after run_start


def plan_view(**keys) -> Plan:
    """A run's plan as the analysis reads it: run_plan's, for a synthetic run of ARMS on one
    host unless ``keys`` say otherwise."""
    whole = {"cluster": "synthetic", "order": "AB", "repeats": 1, "arms": ARMS, "setting": "setting"}
    return Plan(plan.run_plan(**{**whole, "head": "head", "hosts": ["head"], **keys}))


def write_synthetic_run(
    path,
    order="AB",
    arms=ARMS,
    reps=1,
    temperature=None,
    cpu=None,
    tok_s=None,
    stalls=None,
    loop_share=None,
    probe_arrivals=None,
    aborted_first=False,
    requests=True,
    seed=0,
    t0=1.7e9,
    power=None,
    power_interval_s=5.0,
    levels=None,
    level_temperature=None,
) -> Path:
    """A run of ``reps`` × ``order`` phases of PHASE_S seconds after an idle baseline
    ``[t0 + BASELINE[0], t0 + BASELINE[1])``: the head TSOC sits at
    ``temperature[arm]`` during load (N(0, 0.3) noise), 50 °C otherwise; CPU at ``cpu[arm]``;
    a closed loop of USERS users with requests of MAX_TOKENS tokens at ``tok_s[arm]``, each user
    busy ``loop_share[arm]`` of the time (default 1: the loop is closed); three probes whose
    tokens arrive in ``probe_arrivals[arm]`` bursts (default one per token, 17 tok/s). With
    ``requests``, tidy/requests.parquet and each phase's validity.json as the load stage writes
    them.  ``power``: {(host, domain): {arm: watts under load, "idle": watts}}, sampled every
    ``power_interval_s`` as kind ``power``.  ``aborted_first``: the first phase has an aborted
    attempt (load_start, abort) before
    its retry.  ``levels``: ``load.users`` as a list of levels (numbers or mappings of a shape,
    load_levels): each (rep, arm) restarts once, then runs a window per level in the run's
    order, its marks, requests and validity.json carrying ``users`` and ``load_level`` as the
    load stage writes them (an open loop's or a think-time loop's requests with the timing its
    shape's rule reads, so that each window is valid by its own rule);
    ``level_temperature``: {label: {arm: °C}} in place of ``temperature`` at those levels."""
    temperature = temperature or {"A": 90.0, "B": 80.0}
    cpu = cpu or {"A": 398.0, "B": 212.0}
    tok_s = tok_s or {"A": 85.0, "B": 92.0}
    stalls = stalls or {}
    rng = np.random.default_rng(seed)
    path = Path(path)
    (path / "tidy").mkdir(parents=True, exist_ok=True)
    events = [
        {"t": t0, "event": "run_start"},
        {"t": t0 + BASELINE[0], "event": "baseline_start", "order": order},
        {"t": t0 + BASELINE[1], "event": "baseline_end", "order": order},
    ]
    every = None if levels is None else load_levels.parse({"users": levels})
    windows, t = [], t0 + 60
    for rep in range(1, reps + 1):
        for arm in order:
            keys = {"order": order, "rep": rep, "arm": arm}
            events.append({"t": t, "event": "restart_start", **keys})
            if aborted_first and not windows:
                events += [{"t": t + 10, "event": "load_start", **keys}, {"t": t + 20, "event": "abort", **keys}]
                t += 30
            events.append({"t": t + 10, "event": "server_ready", **keys})
            t += 15
            for one in [None] if every is None else load_levels.in_order(every, rep):
                marks = {**keys} if one is None else {**keys, "users": one.users, "load_level": one.label}
                events += [
                    {"t": t, "event": "load_start", **marks},
                    {"t": t + PHASE_S, "event": "load_end", **marks},
                    {"t": t + PHASE_S + GAP_S, "event": "cooldown_end", **marks},
                ]
                windows.append((keys, t, t + PHASE_S, one))
                t += PHASE_S + GAP_S
    events.append({"t": t, "event": "run_end"})

    def level(times, values, idle, by_level=None):
        out = np.full(len(times), idle, dtype=float)
        for keys, start, end, one in windows:
            at = (by_level or {}).get(None if one is None else one.label, values)
            out[(times >= start) & (times < end)] = at[keys["arm"]]
        return out

    thermal_t = np.arange(t0, t, 15.0)
    cpu_t = np.arange(t0, t, 6.0)
    head_tsoc = level(thermal_t, temperature, 50, level_temperature) + rng.normal(0, 0.3, len(thermal_t))
    parts = [
        _series(thermal_t, "head", "thermal", "TSOC", head_tsoc),
        _series(thermal_t, "head", "thermal", "TS0P", level(thermal_t, temperature, 50) - 15),
        _series(thermal_t, "worker", "thermal", "TSOC", np.full(len(thermal_t), 77.0)),
        _series(cpu_t, "head", "cpu", "vllm_cpu_pct", level(cpu_t, cpu, 5) + rng.normal(0, 2, len(cpu_t))),
        _series(cpu_t, "worker", "cpu", "vllm_cpu_pct", level(cpu_t, {a: 208.0 for a in arms}, 5)),
    ]
    power_t = np.arange(t0, t, power_interval_s)
    for (host, domain), watts in (power or {}).items():
        parts.append(_series(power_t, host, "power", domain, level(power_t, watts, watts["idle"])))
    pd.concat(parts, ignore_index=True).sort_values("t").to_parquet(path / "tidy" / "telemetry.parquet", index=False)
    if requests:
        phases = [
            _phase_requests(
                keys,
                start,
                end,
                tok_s[keys["arm"]],
                stalls.get(keys["arm"], 0),
                (loop_share or {}).get(keys["arm"], 1.0),
                (probe_arrivals or {}).get(keys["arm"], PROBE_TOKENS),
                one,
            )
            for keys, start, end, one in windows
        ]
        pd.concat(phases, ignore_index=True).to_parquet(path / "tidy" / "requests.parquet", index=False)
        for (keys, start, end, one), frame in zip(windows, phases, strict=False):
            shape = Shape(USERS) if one is None else Shape(one.users, **one.shape)
            report = validity.validity_report(
                frame,
                (start, end),
                users=shape.users,
                max_tokens=MAX_TOKENS,
                prompt_tokens=1400,
                probe_n=3,
                stall_gap_s=1.0,
                shape=shape,
            )
            phase_dir = path / "phases" / (f"rep{keys['rep']}-{keys['arm']}" + ("" if one is None else f"-{one.slug}"))
            phase_dir.mkdir(parents=True, exist_ok=True)
            level_keys = {"users": USERS} if one is None else {"users": one.users, "load_level": one.label}
            (phase_dir / "validity.json").write_text(json.dumps({**keys, **level_keys, **report}), encoding="utf-8")
    run = {
        "cluster": "synthetic",
        "order": order,
        "repeats": reps,
        "arms": arms,
        "reference_arm": next(iter(arms)),
        "setting": "busy_loop_s",
        "head": "head",
        "hosts": ["head", "worker"],
        "thresholds_c": [85, 90, 92, 95],
        "trip_point_c": 104.8,
        "reference_lines_c": [96, 87],
        "stall_gap_s": 1.0,
        "timeline_zone": "TSOC",
        "users": USERS if levels is None else levels,
    }
    (path / "run.json").write_text(json.dumps(run), encoding="utf-8")
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path


def _series(times, host, kind, sensor, values) -> pd.DataFrame:
    return pd.DataFrame({"t": times, "host": host, "kind": kind, "sensor": sensor, "value": values})


def _phase_requests(keys, start, end, tok_s, stalls, loop_share, probe_arrivals, one=None) -> pd.DataFrame:
    """One window's records in the load stage's columns (``validity.to_frame``): each user ends a
    request every USERS × MAX_TOKENS / tok_s seconds, busy ``loop_share`` of that period, from
    load_start until a request ends after load_end; the first request of user 1 has ``stalls``
    stall gaps. Probes decode 255 tokens after the first in 15 s, one arrival per token; with
    fewer arrivals (bursts) all of them within 3 ms.  At a level ``one`` of another shape than
    the closed loop, each load request left when it was due and a think-time loop's requests
    drew the level's mean think time."""
    period = USERS * MAX_TOKENS / tok_s
    records = []
    for user in range(1, USERS + 1):
        t_end = start + (user - 0.5) / USERS * period
        while (t_start := max(start, t_end - loop_share * period)) < end:
            first_token = t_start + min(1.0, (t_end - t_start) / 2)
            records.append(
                {
                    "kind": "load",
                    "user": user,
                    "tag": f"u{user} {t_end:.0f}",
                    "t_start": t_start,
                    "t_first_token": first_token,
                    "t_end": t_end,
                    "prompt_tokens": 1400,
                    "completion_tokens": MAX_TOKENS,
                    "cached_tokens": 0,
                    "ok": True,
                    "error": "",
                    "max_gap_s": 0.3,
                    "stall_gaps": stalls if user == 1 and t_start == start else 0,
                    "usage_source": "usage",
                    "token_arrivals": MAX_TOKENS,
                    "token_span_s": t_end - first_token,
                    **({} if one is None or one.kind == load_levels.CLOSED else {"t_due": t_start}),
                    **({} if one is None or one.think_s is None else {"think_s": one.think_s}),
                }
            )
            t_end += period
    decode_s = 15.0 if probe_arrivals >= PROBE_TOKENS else 0.003
    for i in range(3):
        first_token = start + 101 + 20 * i
        records.append(
            {
                "kind": "probe",
                "user": 0,
                "tag": f"p{i}",
                "t_start": first_token - 1,
                "t_first_token": first_token,
                "t_end": first_token + decode_s,
                "prompt_tokens": 20,
                "completion_tokens": PROBE_TOKENS,
                "cached_tokens": None,
                "ok": True,
                "error": "",
                "max_gap_s": 0.1,
                "stall_gaps": 0,
                "usage_source": "usage",
                "token_arrivals": probe_arrivals,
                "token_span_s": decode_s * 0.9,
            }
        )
    level_keys = {} if one is None else {"users": one.users, "load_level": one.label}
    return validity.to_frame(records, **keys, **level_keys)
