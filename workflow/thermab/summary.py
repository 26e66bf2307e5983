"""Words and Markdown: number formatting, Markdown tables, verdict sentences and summary.md.

Pure text rendering of the frames computed by ``metrics`` and ``stats``; nothing here reads
or writes files.  Every number printed carries its unit, and every table says its n.
"""

import math

import pandas as pd

from . import stats

# decimals per unit, chosen so that no printed digit is finer than the measurement
DIGITS = {"°C": 1, "% of one core": 0, "tok/s": 1, "gaps": 0, "s": 1, "min": 1}
SHORT_UNIT = {"% of one core": "% CPU"}


def fmt(value, unit: str = "", digits: int | None = None, sign: bool = False) -> str:
    """``89.53, "°C"`` → ``89.5 °C``; NaN → ``–``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    digits = DIGITS.get(unit, 2) if digits is None else digits
    value = value if round(value, digits) else 0.0  # no "−0"
    text = f"{value:{'+' if sign else ''}.{digits}f}".replace("-", "−")
    unit = SHORT_UNIT.get(unit, unit)
    return f"{text} {unit}" if unit else text


def fmt_duration(seconds: float) -> str:
    """Seconds below two minutes, minutes above, as the study reports them (90 s, 2.3 min)."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table; floats rounded to 2 decimals, NaN empty."""
    def cell(value):
        if isinstance(value, float):
            return "" if math.isnan(value) else f"{value:.2f}".rstrip("0").rstrip(".")
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |",
             "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def verdicts(variance: pd.DataFrame) -> pd.Series:
    """One sentence per row of variance.csv: the reference rows say so, the others state the
    difference, its interval and the finding (see ``stats`` for the rules)."""
    if variance.empty:
        return pd.Series(dtype="string", name="verdict")
    labels = dict(zip(variance["arm"], variance["label"]))
    return variance.apply(lambda row: _verdict(row, labels), axis=1).rename("verdict")


def _verdict(row: pd.Series, labels: dict) -> str:
    if pd.isna(row["reference"]):
        return f"reference arm ({fmt(row['mean'], row['unit'])}, n = {row['n']} phases)"
    unit, ref_label = row["unit"], labels.get(row["reference"], row["reference"])
    pct = "" if pd.isna(row["diff_pct"]) else f" ({fmt(row['diff_pct'], '%', 1, sign=True)} of {ref_label})"
    ref_n = f"n = {row['ref_n']:.0f} ({ref_label}) / {row['n']} ({row['label']}) phases"
    text = f"{row['metric']}: {row['label']} vs {ref_label} {fmt(row['diff'], unit, sign=True)}{pct}, {ref_n}"
    interval = (f"95 % CI {fmt(row['ci_low'], unit, sign=True)} to {fmt(row['ci_high'], unit, sign=True)}"
                f" ({row['method']})")
    finding = row["finding"]
    if finding == stats.UNDEFINED:
        text += ("; with one phase in an arm the interval is undefined and restart variance is"
                 " unknown, so no claim is made: repeat each arm at least twice")
    elif finding == stats.CONTAINS_ZERO:
        text += f"; {interval} contains zero: no difference shown"
    elif finding == stats.VARIANCE_UNKNOWN:
        text += (f"; {interval} excludes zero, but one arm has a single phase, so restart variance is"
                 " unknown: not claimed")
    elif finding == stats.INSIDE_VARIANCE:
        text += (f"; {interval} excludes zero, but the difference is inside restart variance"
                 f" (CV {fmt(row['restart_cv_pct'], '%', 1)} between repeats of an arm): not claimed")
    else:
        direction = "higher" if row["diff"] > 0 else "lower"
        text += (f"; {interval}, beyond restart variance (CV {fmt(row['restart_cv_pct'], '%', 1)}):"
                 f" {row['label']} is {direction} than {ref_label}")
    if not pd.isna(row["period_effect"]):
        low, high = (fmt(row[c], unit, sign=True) for c in ("period_ci_low", "period_ci_high"))
        text += (f". Order (period) effect, per position in the order: {fmt(row['period_effect'], unit, sign=True)}"
                 f" (95 % CI {low} to {high})")
    if not pd.isna(row["repeats_needed"]):
        text += (f". At this variance, detecting a {fmt(row['detect_pct'], '%', 0)} difference needs"
                 f" {row['repeats_needed']:.0f} phases per arm")
        if not pd.isna(row["repeats_needed_observed"]):
            text += f", the observed one {row['repeats_needed_observed']:.0f}"
    return text + "."


def summary_markdown(run: dict, tables: dict, variance: pd.DataFrame, *, sample_interval_s: dict,
                     sources: list[str], best: dict | None) -> str:
    """summary.md: the study's three tables with arm labels as columns, the verdicts, and what
    was measured how.  ``tables`` holds the frames of analyze (windows, thresholds, zones, cpu,
    performance), ``sample_interval_s`` the median sampling interval per telemetry kind."""
    arms, reference = run["arms"], run["reference_arm"]
    head, zone = run["head"], run["timeline_zone"]
    windows = tables["windows"]
    if windows.empty:
        return (f"# thermab: {run.get('cluster', '')}\n\nNo complete load phase in this run: a phase is"
                " measured from its last load_start to the first load_end after it, and no phase has"
                " both. Nothing to compare.\n")
    phases = windows.groupby("arm").size()
    present = [a for a in arms if a in phases.index]
    labels = {a: arms[a]["label"] for a in present}
    setting = run.get("setting", "setting")
    parts = [
        f"# thermab: {run.get('cluster', '')} — {setting}, "
        + " vs ".join(f"{labels[a]} ({arms[a].get('value', '')})" for a in present),
        "",
        "Arms: " + "; ".join(
            f"{a} = {labels[a]} ({setting} = {arms[a].get('value', '')}"
            f"{', reference' if a == reference else ''}), {phases[a]} phase(s)" for a in present)
        + f". Orders in this run: {', '.join(pd.unique(windows['order']))}.",
        "",
    ]
    if tables["zones"].empty:
        parts += [
            "## Temperatures",
            "",
            "No thermal zone was sampled on any host in the load windows (a host without"
            " /sys/class/thermal zones, such as a VM, has none): there are no temperatures in this run,"
            " and the time-to-threshold and zone tables are empty, not zero.",
            "",
        ]
    else:
        parts += [
            f"## Time to reach a temperature after load start ({head} {zone})",
            "",
            markdown_table(_threshold_table(tables, run, present, labels)),
            f"First sample at or above the threshold inside the load window; with several phases"
            f" per arm the phases are listed in time order. Temperatures {_sampling(sample_interval_s, 'thermal')},"
            f" so times are that coarse.",
            "",
            "## Zones during load",
            "",
            markdown_table(_zone_table(tables["zones"], run, present, labels)),
            "Mean and maximum over all samples of a zone inside the load windows; with several"
            " phases the mean is the mean of the phase means ± their sd, and the maximum the"
            " highest sample. Gap = arm − reference mean.",
            "",
        ]
    parts += [
        "## CPU and performance under load",
        "",
        markdown_table(_cpu_performance_table(tables, run, present, labels)),
        "## Verdicts",
        "",
    ]
    differences = variance[variance["reference"].notna()]
    parts += [f"- {v}" for v in differences["verdict"]] or ["- no arm to compare"]
    parts.append("")
    parts.append("Verdicts pool the phases of: " + ", ".join(sources) + ".")
    if best is not None:
        parts += ["", "## Dose response", "", _best_sentence(best, run)]
        saver = stats.best_setting(variance, arms, reference, f"{head} vLLM CPU median")
        if saver is not None:
            parts += ["", _cpu_sentence(saver, run, variance)]
    parts += ["", "## What was measured how", "", _definitions(run, tables, sample_interval_s)]
    return "\n".join(parts) + "\n"


def _by_arm(frame: pd.DataFrame, present: list[str]):
    return [(arm, frame[frame["arm"] == arm]) for arm in present]


def _threshold_table(tables: dict, run: dict, present: list[str], labels: dict) -> pd.DataFrame:
    head, zone = run["head"], run["timeline_zone"]
    th = tables["thresholds"]
    th = th[(th["host"] == head) & (th["sensor"] == zone)]
    zones = tables["zones"]
    peaks = zones[(zones["host"] == head) & (zones["sensor"] == zone)]
    rows = []
    for threshold in run["thresholds_c"]:
        row = {"threshold": fmt(threshold, "°C", 0)}
        for arm, phase_rows in _by_arm(th[th["threshold_c"] == threshold], present):
            cells = []
            for phase in phase_rows.itertuples(index=False):
                if pd.isna(phase.reached_s):
                    peak = peaks[(peaks["order"] == phase.order) & (peaks["rep"] == phase.rep)
                                 & (peaks["arm"] == arm)]["max_c"]
                    cells.append(f"not reached (peak {fmt(peak.max(), '°C')})")
                else:
                    grazing = " (one grazing sample)" if phase.samples_at_or_above == 1 else (
                        f" ({phase.samples_at_or_above} samples at or above)")
                    cells.append(fmt_duration(phase.reached_s) + grazing)
            row[labels[arm]] = "; ".join(cells) or "–"
        rows.append(row)
    return pd.DataFrame(rows)


def _mean_cell(values: pd.Series, unit: str) -> str:
    if values.count() <= 1:
        return fmt(values.mean(), unit)
    return f"{fmt(values.mean(), '', DIGITS.get(unit))} ± {fmt(values.std(), unit)}"


def _zone_table(zones: pd.DataFrame, run: dict, present: list[str], labels: dict) -> pd.DataFrame:
    head, zone, reference = run["head"], run["timeline_zone"], run["reference_arm"]
    reference_means = zones[zones["arm"] == reference].groupby(["host", "sensor"])["mean_c"].mean()
    head_zones = (reference_means.loc[head].sort_values(ascending=False).index.tolist()
                  if head in reference_means else [])
    # the study's table: every head zone, timeline zone first, then the timeline zone of the other hosts
    order = [(head, zone)] + [(head, z) for z in head_zones if z != zone] + [
        (host, zone) for host in run.get("hosts", []) if host != head]
    rows = []
    for host, sensor in order:
        selected = zones[(zones["host"] == host) & (zones["sensor"] == sensor)]
        if selected.empty:
            continue
        row = {"zone": sensor if host == head else f"{host} {sensor}"}
        means, counts = {}, []
        for arm, arm_rows in _by_arm(selected, present):
            means[arm] = arm_rows["mean_c"].mean()
            row[f"{labels[arm]} mean"] = _mean_cell(arm_rows["mean_c"], "°C")
            row[f"{labels[arm]} max"] = fmt(arm_rows["max_c"].max(), "°C")
            counts.append(str(int(arm_rows["n"].sum())))
        for arm in present:
            if arm != reference and reference in means:
                row[f"gap {labels[arm]}"] = fmt(means[arm] - means[reference], "°C", sign=True)
        row["n (samples)"] = " / ".join(counts)
        rows.append(row)
    return pd.DataFrame(rows)


def _cpu_performance_table(tables: dict, run: dict, present: list[str], labels: dict) -> pd.DataFrame:
    cpu, perf = tables["cpu"], tables["performance"]
    rows = []
    for host in run.get("hosts", []):
        row = {"measure": f"{host} vLLM CPU sum, median (p5–p95 of the samples)"}
        for arm, arm_rows in _by_arm(cpu[cpu["host"] == host], present):
            if arm_rows.empty:
                row[labels[arm]] = "no CPU data"
                continue
            row[labels[arm]] = (f"{_mean_cell(arm_rows['median_pct'], '% of one core')}"
                                f" ({fmt(arm_rows['p5_pct'].min(), '', 0)}–"
                                f"{fmt(arm_rows['p95_pct'].max(), '% of one core')}),"
                                f" n = {int(arm_rows['n'].sum())} samples")
        rows.append(row)
    if perf["requests_completed"].isna().all():
        rows.append({"measure": "requests", **{labels[a]: "no request data in this run" for a in present}})
        return pd.DataFrame(rows)
    measures = [
        ("requests completed in the window", lambda r: " + ".join(
            f"{v:.0f} in {fmt(w / 60, 'min')}" for v, w in zip(r["requests_completed"], r["window_s"]))),
        ("output throughput", lambda r: _mean_cell(r["output_tok_s"], "tok/s")),
        ("single-stream probe decode speed (median)", lambda r: (
            f"{_mean_cell(r['probe_tok_s_median'], 'tok/s')}, n = {int(r['probe_n'].sum())} probes")),
        (f"stall gaps ≥ {fmt(run.get('stall_gap_s', math.nan), 's')} (largest gap)", lambda r: (
            f"{fmt(r['stall_gaps'].sum(), 'gaps')} ({fmt(r['max_gap_s'].max(), 's', 2)})")),
        ("failed requests", lambda r: f"{r['errors'].sum():.0f}"),
    ]
    for name, cell in measures:
        rows.append({"measure": name, **{labels[a]: cell(arm_rows) for a, arm_rows in _by_arm(perf, present)}})
    return pd.DataFrame(rows)


def _best_sentence(best: dict, run: dict) -> str:
    excluded = "; ".join(f"{arm}: {why}" for arm, why in best["excluded"].items()) or "none"
    unchecked = {"stalls", "throughput"} - set(best["checked"])
    caveat = f" Not checked for lack of request data: {', '.join(sorted(unchecked))}." if unchecked else ""
    return (f"Lowest {run['head']} {run['timeline_zone']} mean among the settings without extra stalls or"
            f" throughput loss beyond variance: {run.get('setting', 'setting')} = {best['value']}"
            f" ({best['label']}, arm {best['arm']}, {fmt(best['mean'], '°C')}). Excluded: {excluded}.{caveat}")


def _cpu_sentence(saver: dict, run: dict, variance: pd.DataFrame) -> str:
    """The setting that saves the most CPU (``stats.best_setting`` on the head's CPU)."""
    reference = run["reference_arm"]
    cpu = variance[variance["metric"] == f"{run['head']} vLLM CPU median"].set_index("arm")
    excluded = "; ".join(f"{arm}: {why}" for arm, why in saver["excluded"].items()) or "none"
    return (f"Most CPU saved without extra stalls or throughput loss beyond variance:"
            f" {run.get('setting', 'setting')} = {saver['value']} ({saver['label']}, arm {saver['arm']}),"
            f" {run['head']} vLLM CPU median {fmt(saver['mean'], '% of one core')} against"
            f" {fmt(cpu.at[reference, 'mean'], '% of one core')} for {run['arms'][reference]['label']}."
            f" Excluded: {excluded}.")


def _sampling(sample_interval_s: dict, kind: str) -> str:
    interval = sample_interval_s.get(kind)
    return "not sampled in this run" if interval is None else f"sampled every {fmt(interval, 's', 0)} (median)"


def _definitions(run: dict, tables: dict, sample_interval_s: dict) -> str:
    windows = tables["windows"]
    labels = {a: spec["label"] for a, spec in run["arms"].items()}
    phase_list = ", ".join(f"{o} rep{r}-{a} ({labels.get(a, a)}) {fmt(w / 60, 'min')}"
                           for o, r, a, w in windows[["order", "rep", "arm", "window_s"]].itertuples(index=False))
    return "\n".join([
        f"- Phases (n = {len(windows)}): {phase_list}. Load window of a phase: [load_start, load_end);"
        " after an aborted attempt the last load_start of the phase and the first load_end after it.",
        f"- Temperatures: every thermal zone of every host in °C, {_sampling(sample_interval_s, 'thermal')};"
        " zone mean and max over the samples inside the window (n = samples).",
        "- Time to threshold: time of the first sample inside the window at or above the threshold,"
        " minus load_start; a phase with a single such sample is marked as grazing.",
        f"- vLLM CPU: per sample, Σ Δ(utime+stime) / CLK_TCK / Δt × 100 over every process matching the"
        f" pattern, in % of one core (400 % = four cores busy), {_sampling(sample_interval_s, 'cpu')};"
        " median and 5th/95th percentiles over the window.",
        "- Output throughput: Σ completion_tokens (server usage) of the ok load requests ending inside"
        " the window / window length, in tok/s. Probe decode speed: (completion_tokens − 1) /"
        " (t_end − t_first_token) per probe, median over the probes of the window.",
        f"- Stall gaps: inter-token gaps ≥ {fmt(run.get('stall_gap_s', math.nan), 's')} summed over the"
        " ok requests of the window.",
        "- Statistics: per arm mean, sd and CV over phases; arm − reference by Welch t (one order) or"
        " OLS value ~ arm + position (several orders, separating the period effect), 95 % intervals,"
        " also in % of the reference mean. A difference is called real only when its interval"
        " excludes zero and it exceeds restart variance (the larger CV between repeats of an arm)."
        " Phases per arm needed: 2 (z0.975 + z0.8)² sd² / Δ² (normal approximation, 80 % power,"
        " α = 0.05, pooled sd).",
    ])
