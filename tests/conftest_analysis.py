"""Writes small synthetic run directories (the contracts of DESIGN.md) for the analysis tests."""

import json
from pathlib import Path

import numpy as np
import pandas as pd

ARMS = {"A": {"label": "stock", "value": "1"}, "B": {"label": "patched", "value": "0.002"}}
PHASE_S = 300.0
GAP_S = 120.0
BASELINE = (5.0, 55.0)  # seconds after run_start


def write_synthetic_run(path, order="AB", arms=ARMS, reps=1, temperature=None, cpu=None, tok_s=None,
                        stalls=None, aborted_first=False, requests=True, seed=0, t0=1.7e9, power=None,
                        power_interval_s=5.0) -> Path:
    """A run of ``reps`` × ``order`` phases of PHASE_S seconds after an idle baseline
    ``[t0 + BASELINE[0], t0 + BASELINE[1])``: the head TSOC sits at ``temperature[arm]`` during
    load (N(0, 0.3) noise), 50 °C otherwise; CPU at ``cpu[arm]``; load requests of 400 tokens at
    ``tok_s[arm]``.  ``power``: {(host, domain): {arm: watts under load, "idle": watts}}, sampled
    every ``power_interval_s`` as kind ``power``.  ``aborted_first``: the first phase has an
    aborted attempt (load_start, abort) before its retry."""
    temperature = temperature or {"A": 90.0, "B": 80.0}
    cpu = cpu or {"A": 398.0, "B": 212.0}
    tok_s = tok_s or {"A": 85.0, "B": 92.0}
    stalls = stalls or {}
    rng = np.random.default_rng(seed)
    path = Path(path)
    (path / "tidy").mkdir(parents=True, exist_ok=True)
    events = [{"t": t0, "event": "run_start"}, {"t": t0 + BASELINE[0], "event": "baseline_start", "order": order},
              {"t": t0 + BASELINE[1], "event": "baseline_end", "order": order}]
    windows, t = [], t0 + 60
    for rep in range(1, reps + 1):
        for arm in order:
            keys = {"order": order, "rep": rep, "arm": arm}
            events.append({"t": t, "event": "restart_start", **keys})
            if aborted_first and not windows:
                events += [{"t": t + 10, "event": "load_start", **keys}, {"t": t + 20, "event": "abort", **keys}]
                t += 30
            events += [{"t": t + 10, "event": "server_ready", **keys}, {"t": t + 15, "event": "load_start", **keys},
                       {"t": t + 15 + PHASE_S, "event": "load_end", **keys},
                       {"t": t + 15 + PHASE_S + GAP_S, "event": "cooldown_end", **keys}]
            windows.append((keys, t + 15, t + 15 + PHASE_S))
            t += 15 + PHASE_S + GAP_S
    events.append({"t": t, "event": "run_end"})

    def level(times, values, idle):
        out = np.full(len(times), idle, dtype=float)
        for keys, start, end in windows:
            out[(times >= start) & (times < end)] = values[keys["arm"]]
        return out

    thermal_t = np.arange(t0, t, 15.0)
    cpu_t = np.arange(t0, t, 6.0)
    head_tsoc = level(thermal_t, temperature, 50) + rng.normal(0, 0.3, len(thermal_t))
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
        _requests(windows, tok_s, stalls).to_parquet(path / "tidy" / "requests.parquet", index=False)
    run = {"cluster": "synthetic", "order": order, "repeats": reps, "arms": arms,
           "reference_arm": next(iter(arms)), "setting": "busy_loop_s", "head": "head",
           "hosts": ["head", "worker"], "thresholds_c": [85, 90, 92, 95], "trip_point_c": 104.8,
           "reference_lines_c": [96, 87], "stall_gap_s": 1.0, "timeline_zone": "TSOC"}
    (path / "run.json").write_text(json.dumps(run), encoding="utf-8")
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path


def _series(times, host, kind, sensor, values) -> pd.DataFrame:
    return pd.DataFrame({"t": times, "host": host, "kind": kind, "sensor": sensor, "value": values})


def _requests(windows, tok_s, stalls) -> pd.DataFrame:
    rows = []
    for keys, start, end in windows:
        count = round(tok_s[keys["arm"]] * (end - start) / 400)
        for i, t_end in enumerate(start + (np.arange(count) + 0.5) * (end - start) / count):
            rows.append({**keys, "kind": "load", "user": i % 4, "tag": f"r{i}", "t_start": t_end - 18,
                         "t_first_token": t_end - 17, "t_end": t_end, "prompt_tokens": 1400,
                         "completion_tokens": 400, "cached_tokens": 0, "ok": True, "error": "",
                         "max_gap_s": 0.3, "stall_gaps": stalls.get(keys["arm"], 0) if i == 0 else 0})
        for i in range(3):  # probes decoding 255 tokens after the first in 15 s: 17 tok/s
            rows.append({**keys, "kind": "probe", "user": 99, "tag": f"p{i}", "t_start": start + 100 + 20 * i,
                         "t_first_token": start + 101 + 20 * i, "t_end": start + 116 + 20 * i,
                         "prompt_tokens": 20, "completion_tokens": 256, "cached_tokens": None, "ok": True,
                         "error": "", "max_gap_s": 0.1, "stall_gaps": 0})
    return pd.DataFrame(rows)
