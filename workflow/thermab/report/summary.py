"""Words and Markdown: Markdown tables, verdict sentences and summary.md (numbers in their units: ``units``).

Pure text rendering of the frames computed by ``metrics`` and ``stats``; nothing here reads
or writes files.  Every number printed carries its unit, and every table says its n.
"""

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import pandas as pd

from thermab import metric_names as names
from thermab.analysis import energy, load_validity, phase_length, sequential, speed, stats, washout
from thermab.analysis.model import Plan
from thermab.analysis.questions import ALPHA
from thermab.analysis.stats import BestSetting, Exclusion
from thermab.contracts import COMPLETENESS_COLUMNS
from thermab.load.validity import FULL_LENGTH_MIN, INFLIGHT_SLACK, MIN_ARRIVAL_SPAN_SHARE, MIN_TOKEN_ARRIVALS, bursts
from thermab.markup import Markdown, md_cell, md_text
from thermab.report import verdict
from thermab.report.table_rows import tuple_rows
from thermab.report.units import DIGITS, fmt
from thermab.telemetry.power import host_total_domains, total_scope

VALIDITY_COLUMNS = [
    "phase",
    "in flight",
    "server running / waiting",
    "full length",
    "cached tokens",
    "failed",
    "usage source",
    "load",
    "warnings",
]
SHORT_MARK = " †"  # after an arm's name in a table: the load of one of its phases fell short


def fmt_interval(seconds: float) -> str:
    """A sampling interval with the digits it was measured to (0.5 s, 1 s, 6 s, 0.25 s), never
    rounded to a whole second."""
    return "–" if seconds is None or math.isnan(seconds) else f"{seconds:.3g} s"


def fmt_duration(seconds: float) -> str:
    """Seconds below two minutes, minutes above, as the study reports them (90 s, 2.3 min)."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table; floats rounded to 2 decimals, NaN empty; every cell and
    header through ``markup.md_cell`` (a label, a host's or a zone's name is text)."""

    def cell(value: object) -> str:
        if value is pd.NA:
            return ""
        if isinstance(value, float):
            return "" if math.isnan(value) else f"{value:.2f}".rstrip("0").rstrip(".")
        return md_cell(value)

    lines = ["| " + " | ".join(map(md_cell, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def verdicts(variance: pd.DataFrame) -> pd.Series:
    """One sentence per row of variance.csv: the reference rows say so, the others state the
    difference, its interval and the finding (see ``stats`` for the rules), and a difference
    built on a phase whose load fell short (``load_short``) says so; a metric no phase has
    (``speed.NOT_MEASURED``) says why."""
    if variance.empty:
        return pd.Series(dtype="string", name="verdict")
    labels = dict(zip(variance["arm"], variance["label"], strict=False))
    return variance.apply(lambda row: _noted_verdict(row, labels), axis=1).rename("verdict")


def _noted_verdict(row: pd.Series, labels: Mapping[str, str]) -> str:
    reasons = row.get(speed.NOT_MEASURED)
    text = f"not measured: {reasons or 'not measured'}" if isinstance(reasons, str) else _verdict(row, labels)
    short = row.get("load_short")
    if pd.notna(row["reference"]) and isinstance(short, str) and short:
        text += f" Built on phases whose load fell short of the configuration: {short} (see Load validity)."
    return text


def _verdict(row: pd.Series, labels: Mapping[str, str]) -> str:
    if pd.isna(row["reference"]):
        return f"reference arm ({fmt(row['mean'], row['unit'])}, n = {row['n']} phases)"
    unit, ref_label = row["unit"], labels.get(row["reference"], row["reference"])
    if not pd.isna(row["diff_pct"]):
        pct = f" ({fmt(row['diff_pct'], '%', 1, sign=True)} of {ref_label})"
    else:  # stats.per_cent_of: a share of a mean that cannot be told from zero says nothing
        pct = "" if pd.isna(row["diff"]) else f" (no % of {ref_label}: its mean cannot be told from zero)"
    ref_n = f"n = {row['ref_n']:.0f} ({ref_label}) / {row['n']} ({row['label']}) phases"
    text = f"{row['metric']}: {row['label']} vs {ref_label} {fmt(row['diff'], unit, sign=True)}{pct}, {ref_n}"
    interval = (
        f"95 % CI {fmt(row['ci_low'], unit, sign=True)} to {fmt(row['ci_high'], unit, sign=True)} ({row['method']})"
    )
    finding = row["finding"]
    if finding == stats.UNDEFINED:
        text += (
            "; with one phase in an arm the interval is undefined and restart variance is"
            " unknown, so no claim is made: repeat each arm at least twice"
        )
    elif finding == stats.CONTAINS_ZERO:
        text += f"; {interval} contains zero: no difference shown"
    elif finding == stats.VARIANCE_UNKNOWN:
        text += (
            f"; {interval} excludes zero, but one arm has a single phase, so restart variance is unknown: not claimed"
        )
    elif finding == stats.INSIDE_VARIANCE:
        text += (
            f"; {interval} excludes zero, but the difference is inside restart variance"
            f" ({_restart_variance(row)}): not claimed"
        )
    else:
        direction = "higher" if row["diff"] > 0 else "lower"
        text += (
            f"; {interval}, beyond restart variance ({_restart_variance(row)}):"
            f" {row['label']} is {direction} than {ref_label}"
        )
    if not pd.isna(row["period_effect"]):
        low, high = (fmt(row[c], unit, sign=True) for c in ("period_ci_low", "period_ci_high"))
        text += (
            f". Order (period) effect, per position in the order: {fmt(row['period_effect'], unit, sign=True)}"
            f" (95 % CI {low} to {high})"
        )
    if not pd.isna(row["repeats_needed"]):
        text += (
            f". At this variance, detecting a {fmt(row['detect_pct'], '%', 0)} difference needs"
            f" {row['repeats_needed']:.0f} phases per arm"
        )
        if not pd.isna(row["repeats_needed_observed"]):
            text += f", the observed one {row['repeats_needed_observed']:.0f}"
    return text + "."


def _restart_variance(row: pd.Series) -> str:
    """What the difference was weighed against (``stats._finding``): the larger CV between
    repeats, or, where there is no share of the reference, the larger sd."""
    if pd.isna(row["diff_pct"]) or pd.isna(row["restart_cv_pct"]):
        return "the larger sd between repeats of an arm"
    return f"CV {fmt(row['restart_cv_pct'], '%', 1)} between repeats of an arm"


def completeness_section(frame: pd.DataFrame) -> str:
    """The completeness table (``completeness.completeness``) as a summary.md section."""
    rows = []
    for host, source, interval, expected, got, largest_gap_s in frame[COMPLETENESS_COLUMNS].itertuples(
        index=False, name=None
    ):
        note = ""
        if got == 0:
            note = "no samples"
        elif interval > 0 and largest_gap_s > 3 * interval:  # False for NaN too
            note = f"gap of {largest_gap_s / interval:.0f} intervals"
        rows.append(
            {
                "host": host,
                "source": source,
                "interval": fmt(interval, "s"),
                "expected": fmt(expected, "", 0),
                "got": fmt(got, "", 0),
                "largest gap": fmt(largest_gap_s, "s"),
                "note": note,
            }
        )
    return "\n".join(
        [
            "## Telemetry completeness",
            "",
            markdown_table(
                pd.DataFrame(rows, columns=["host", "source", "interval", "expected", "got", "largest gap", "note"])
            ),
            "Samples inside the load windows: expected = window ÷ sample interval, summed over the"
            " windows; got = samples of the source (median over its sensors); largest gap = the longest"
            " stretch of a window without a sample of some sensor, window edges included.",
        ]
    )


def summary_markdown(
    run: Plan,
    tables: dict[str, pd.DataFrame],
    variance: pd.DataFrame,
    *,
    sample_interval_s: dict[str, float],
    sources: list[str],
    best: dict[str, Any] | None,
    completeness: pd.DataFrame | None = None,
    open_plan: list[str] | None = None,
) -> str:
    """summary.md: the study's three tables with arm labels as columns, the verdicts, and what
    was measured how.  ``tables`` holds the frames of analyze (windows, thresholds, zones, cpu,
    performance), ``sample_interval_s`` the median sampling interval per telemetry kind,
    ``completeness`` the per host and source sample counts (``completeness.completeness``),
    ``open_plan`` the open questions' paragraph (``plan_words.open_questions_section``)."""
    arms, reference = run.arms, run.reference_arm
    head, zone = run.head, run.timeline_zone
    windows = tables["windows"]
    if windows.empty:
        return (
            f"# thermab: {md_text(run.cluster)}\n\nNo complete load phase in this run: a phase is"
            " measured from its last load_start to the first load_end after it, and no phase has a"
            " load_end later than its load_start. Nothing to compare.\n"
        )
    phases = windows.groupby("arm").size()
    present = [a for a in arms if a in phases.index]
    # what run.json says is text: escaped once here, for the lines and the tables alike
    labels = {a: md_text(arms[a].label) for a in present}
    values = {a: md_text(arms[a].value) for a in present}
    setting = md_text(run.setting)
    head_text, zone_text = md_text(head), md_text(zone)
    parts = [
        f"# thermab: {md_text(run.cluster)} — {setting}, " + " vs ".join(f"{labels[a]} ({values[a]})" for a in present),
        "",
        "Arms: "
        + "; ".join(
            f"{a} = {labels[a]} ({setting} = {values[a]}"
            f"{', reference' if a == reference else ''}), {phases[a]} phase(s)"
            for a in present
        )
        + f". Orders in this run: {', '.join(pd.unique(windows['order']))}.",
        "",
    ]
    if "questions" in tables:
        parts += questions_section(tables["questions"], run)
    parts += open_plan or []
    parts += load_validity_section(tables["validity"], run)
    parts += start_balance_section(tables["validity"], run)
    parts += balance_section(tables.get("acceptance"), run)
    short_arms = set(tables["validity"].loc[load_validity.is_short(tables["validity"]), "arm"])
    marked = {a: labels[a] + (SHORT_MARK if a in short_arms else "") for a in present}
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
        zones = tables["zones"]
        head_zones = list(dict.fromkeys(zones.loc[zones["host"] == head, "sensor"]))
        parts += [f"## Time to reach a temperature after load start ({head_text} {zone_text})", ""]
        if not run.thresholds_c:
            parts.append("No threshold was asked for (`analysis.thresholds_c` is empty).")
        elif zone in head_zones:
            parts += [
                markdown_table(_threshold_table(tables, run, present, marked)),
                f"First sample at or above the threshold inside the load window; with several phases"
                f" per arm the phases are listed in time order. Temperatures"
                f" {_sampling(sample_interval_s, 'thermal')}, so times are that coarse.",
            ]
        else:
            parts.append(
                f"The head ({head_text}) has no zone {zone_text} (`analysis.timeline_zone`), so there are no times"
                f" to threshold: its zones are {', '.join(map(md_text, head_zones)) or 'none'}; set"
                " `analysis.timeline_zone` to one of them and run the analysis again."
            )
        parts += [
            "",
            "## Zones during load",
            "",
            markdown_table(_zone_table(tables["zones"], run, present, marked)),
            "Mean and maximum over all samples of a zone inside the load windows; with several"
            " phases the mean is the mean of the phase means ± their sd, and the maximum the"
            " highest sample. Gap = arm − reference mean.",
            "",
        ]
    parts += [
        "## CPU and performance under load",
        "",
        markdown_table(_cpu_performance_table(tables, run, present, marked)),
        *_energy_section(tables, run, present, marked),
        "## Verdicts",
        "",
    ]
    differences = variance[variance["reference"].notna()]
    parts += [f"- {md_text(v)}" for v in differences["verdict"]] or ["- no arm to compare"]
    parts.append("")
    parts.append("Verdicts pool the phases of: " + ", ".join(map(md_text, sources)) + ".")
    if best is not None:
        parts += ["", "## Dose response", "", _best_sentence(best, run)]
        saver = stats.best_setting(variance, arms, reference, names.cpu_median(head))
        if saver is not None:
            parts += ["", _cpu_sentence(saver, run, variance)]
    if completeness is not None:
        parts += ["", completeness_section(completeness)]
    parts += ["", "## What was measured how", "", _definitions(run, tables, sample_interval_s)]
    return "\n".join(parts) + "\n"


def questions_section(answers: pd.DataFrame, run: Plan) -> list[str]:
    """The answer first: one line per declared question and arm (``tables/questions.csv``)."""
    if answers.empty:
        return ["## Questions", "", "No question was declared (`questions` is empty).", ""]
    labels = {a: md_text(spec.label) for a, spec in run.arms.items()}
    units = answers["unit"].fillna("") if "unit" in answers else pd.Series("", index=answers.index)
    rows = pd.DataFrame(
        {
            "question": [verdict.label(row) for row in verdict.answer_rows(answers)],
            "arm vs reference": [
                f"{labels.get(a, a)} vs {labels.get(r, r)}"
                for a, r in zip(answers["arm"], answers["reference"], strict=False)
            ],
            "estimate": [verdict.quantity(v, u) for v, u in zip(answers["estimate"], units, strict=False)],
            "interval": [
                verdict.span(lo, hi, u) for lo, hi, u in zip(answers["ci_low"], answers["ci_high"], units, strict=False)
            ],
            "margin": [verdict.margin_text(row) for row in verdict.answer_rows(answers.assign(unit=units))],
            "phases per arm": answers["phases_per_arm"],
            "verdict": answers["verdict"].str.upper(),
            "phases needed": [f"{v:.0f}" if pd.notna(v) else "" for v in answers["phases_needed"]],
        }
    )
    if "note" in answers and answers["note"].fillna("").astype(str).str.len().any():
        rows["note"] = answers["note"].fillna("").astype(str).to_numpy()
    level = answers["level"].dropna()
    lines = []
    if run.until == "decided":
        open_ = answers.loc[answers["verdict"] == "undecided", "question"]
        reached = int(answers["phases_per_arm"].max())
        lines = [
            f"Repeats until decided: {reached} of at most {run.max_repeats} repeats"
            + (
                f" (at most what the budget of {run.budget_hours:g} cluster-hours fits at the config's timings)"
                if run.budget_hours is not None
                else ""
            )
            + f", each look at its level of {sequential.METHOD_WORDS[sequential.METHOD]} alpha spending"
            + " (docs/statistics.md); "
            + (
                f"still open: {'; '.join(dict.fromkeys(map(md_text, open_)))}."
                if len(open_)
                else "every question is decided."
            ),
            "",
        ]
    return [
        "## Questions",
        "",
        *lines,
        markdown_table(rows),
        *adjustment_lines(answers, labels),
        (
            f"Each question is tested on the arm effect of the verdicts below (arm − reference, in the metric's"
            f" unit), with its {level.iloc[0] * 100:.1f} % interval (each bound a one-sided test at"
            f" {(1 - level.iloc[0]) / 2 * 100:.2g} %"
            if len(level)
            else "Each question is tested ("
        )
        + "; equivalence: both, TOST). YES: the interval clears the margin the"
        ' claimed way; NO: it rules the claim out; UNDECIDED: neither, and "phases needed" is how many phases'
        " per arm would decide it at the observed spread.",
        "",
    ]


def adjustment_lines(answers: pd.DataFrame, labels: Mapping[str, str]) -> list[str]:
    """Under the questions' table: each answer on speed or energy per token, what it was
    adjusted for (or why it stayed raw), and the raw effect beside it."""
    if "adjustment" not in answers:
        return []
    lines = []
    adjusted = answers.loc[
        answers["adjustment"].fillna("").astype(str) != "",
        ["metric", "arm", "adjustment", "raw_estimate", "raw_ci_low", "raw_ci_high"],
    ]
    for metric, arm, adjustment, raw_estimate, raw_ci_low, raw_ci_high in adjusted.itertuples(index=False, name=None):
        raw = f"raw {fmt(raw_estimate, sign=True)}"
        if pd.notna(raw_ci_low):
            raw += f" [{fmt(raw_ci_low, sign=True)}, {fmt(raw_ci_high, sign=True)}]"
        lines.append(f"- {metric}, {labels.get(arm, arm)}: {adjustment} ({raw})")
    if not lines:
        return []
    return [
        "",
        "Speed and energy per token move with what each server start draws (the drafter's acceptance);"
        " where the arm does not move it, they are answered adjusted for it (ANCOVA, the fit's own"
        " standard error):",
        *lines,
        "",
    ]


class ValidityRow(Protocol):
    """One phase of tables/validity.csv as the section reads it; a phase without load records
    has NaN for each."""

    @property
    def order(self) -> str: ...
    @property
    def rep(self) -> int: ...
    @property
    def arm(self) -> str: ...
    @property
    def load_valid(self) -> bool | float: ...
    @property
    def users(self) -> object: ...
    @property
    def inflight_mean(self) -> float: ...
    @property
    def share_at_users(self) -> float: ...
    @property
    def server_running_mean(self) -> float: ...
    @property
    def server_waiting_mean(self) -> float: ...
    @property
    def server_held_max(self) -> float: ...
    @property
    def full_length_share(self) -> float: ...
    @property
    def ok_load(self) -> object: ...
    @property
    def cached_share(self) -> float: ...
    @property
    def reporting_cached(self) -> object: ...
    @property
    def failed(self) -> object: ...
    @property
    def requests(self) -> object: ...
    @property
    def usage_source(self) -> object: ...
    @property
    def shortfalls(self) -> object: ...
    @property
    def warnings(self) -> object: ...


# validity.csv's rows
validity_rows: Callable[[pd.DataFrame], Iterator[ValidityRow]] = tuple_rows


def load_validity_section(validity: pd.DataFrame, run: Plan) -> list[str]:
    """The "Load validity" section: one row per phase from its validity.json (the table
    ``tables/validity.csv``), whether its load was the configured one, and its warnings."""
    if validity["load_valid"].isna().all():
        return [
            "## Load validity",
            "",
            "No load records in this run (imported runs have none): whether the load"
            " of a phase was the configured one is unknown.",
            "",
        ]
    labels = {a: spec.label for a, spec in run.arms.items()}
    rows = []
    for phase in validity_rows(validity):
        row: dict[str, object] = {
            "phase": f"{phase.order} rep{phase.rep}-{phase.arm} ({labels.get(phase.arm, phase.arm)})"
        }
        if pd.isna(phase.load_valid):
            rows.append({**row, "load": load_validity.NO_RECORDS})
            continue
        cached = (
            "not reported by the server"
            if pd.isna(phase.cached_share)
            else f"{fmt(phase.cached_share * 100, '%', 0)} of {phase.reporting_cached}"
        )
        rows.append(
            {
                **row,
                "in flight": (
                    f"{fmt(phase.inflight_mean, '', 2)} of {phase.users}"
                    f" ({fmt(phase.share_at_users * 100, '%', 0)} of the window at {phase.users})"
                ),
                "server running / waiting": (
                    "not scraped"
                    if pd.isna(phase.server_running_mean)
                    else f"{fmt(phase.server_running_mean, '', 2)} / {fmt(phase.server_waiting_mean, '', 2)}"
                    f" (at most {fmt(phase.server_held_max, '', 0)} held)"
                ),
                "full length": f"{fmt(phase.full_length_share * 100, '%', 1)} of {phase.ok_load} ok",
                "cached tokens": cached,
                "failed": f"{phase.failed} of {phase.requests}",
                "usage source": phase.usage_source,
                "load": "as configured" if phase.load_valid else Markdown(f"**short**: {md_cell(phase.shortfalls)}"),
                "warnings": phase.warnings or "none",
            }
        )
    return [
        "## Load validity",
        "",
        markdown_table(pd.DataFrame(rows, columns=VALIDITY_COLUMNS)),
        "In flight: time-weighted mean number of load requests in flight over the window, of the"
        " configured users, and the share of the window with all of them in flight. Server running / waiting:"
        " the means of vLLM's own gauges from its /metrics over the window, which count a request only while"
        " the engine holds it (less than in flight by the time spent in HTTP and tokenizing, docs/load-tools.md);"
        " more than one request above in flight, or a most held at once more than one below the users, is"
        " a warning. Full length: ok load"
        " requests that returned max_tokens. Cached tokens: load requests whose prompt hit the prefix"
        " cache, of those whose usage reports it. Failed: of all requests, probes included. A phase's load"
        f" falls short of the configuration when fewer than users − {INFLIGHT_SLACK:g} requests were in"
        f" flight on average, fewer than {FULL_LENGTH_MIN * 100:.0f} % returned max_tokens, any hit the prefix cache,"
        f" or the load was aborted: its arm is marked{SHORT_MARK} in the tables below, its points are hollow in the"
        " figures, and every verdict built on it says so.",
        "",
    ]


def adjustment_words(code: str, covariate: str, p: float, covariates: Iterable[str]) -> str:
    """How a question on speed or energy per token was answered (``speed.adjusted_effects``'
    code, the covariate it concerns and its test's p), in words; "" for other questions."""
    moved = f"raw: the arm moves {covariate} (two-sided t, p = {p:.2g} < {ALPHA:g})"
    adjusted_for = covariate if isinstance(covariate, str) and covariate else " + ".join(covariates)
    return {
        speed.ADJUSTED: f"adjusted for {adjusted_for}",
        speed.RAW_NO_COVARIATES: "raw: analysis.covariates is empty (the setting may move what a restart draws)",
        speed.RAW_NOT_MEASURED: f"raw: no {covariate} measured",
        speed.RAW_UNTESTABLE: f"raw: one phase in an arm, the arm's effect on {covariate} cannot be tested",
        speed.RAW_MOVED: moved,
        speed.RAW_MOVED_CONFIRM: moved + "; a yes needs the adjusted too",
        speed.RAW_NOT_IN_FIT: "raw: no covariate in every phase of the fit",
    }.get(code, "")


def balance_words(arm: str, reference: str, check: Mapping[Hashable, Any]) -> str:
    """One arm's acceptance check in words (a record of the acceptance table)."""
    span = f"{check['low_pct']:+.1f} % to {check['high_pct']:+.1f} %"
    if math.isnan(check["low_pct"]):
        span = "no interval"
    return (
        f"acceptance length of {arm} vs {reference}: {span} (TOST at ± {check['margin_pct']:g} %, "
        f"{check['n']} phase{'' if check['n'] == 1 else 's'} per arm): {check['state']}"
    )


def balance_section(balance: pd.DataFrame | None, run: Plan) -> list[str]:
    """The summary's "Balanced acceptance" section: each arm's check, and what it is for, in a
    sentence; nothing where no phase measured the acceptance."""
    if balance is None or balance.empty:
        return []
    labels = {a: md_text(spec.label) for a, spec in run.arms.items()}
    lines = ["## Balanced acceptance", ""]
    checks = balance[["arm", "reference", "state", "low_pct", "high_pct", "n"]]
    for arm, reference, state, low_pct, high_pct, n in checks.itertuples(index=False, name=None):
        mark = state if state == speed.BALANCED else f"**{state}**"
        span = "no interval" if math.isnan(low_pct) else f"{low_pct:+.1f} % to {high_pct:+.1f} %"
        lines.append(
            f"- {arm} ({labels.get(arm, arm)}) vs {reference}: mean acceptance length {span}"
            f" of the reference's ({n} phases per arm): {mark}"
        )
    margin = float(balance["margin_pct"].iloc[0])
    lines += [
        "",
        f"Acceptance length is 1 + accepted / drafted tokens from the server's /metrics; arms are balanced"
        f" when its interval lies inside ± {margin:g} % (TOST, analysis.acceptance_margin_pct), unbalanced"
        " when wholly outside.  A restart moves it, a setting may too (docs/design.md).  The check is"
        " reported, not a gate: speed and energy per token are adjusted for it unless the arm moves it"
        " (two-sided t; the questions' adjustment column says which).",
    ]
    return lines + ["Per phase in tables/speed.csv.", ""]


def start_balance_section(validity: pd.DataFrame, run: Plan) -> list[str]:
    """The "Balanced starts" section: per arm, where its phases of the run's full window
    started (the head's timeline zone at load_start; the phases the questions in °C pool,
    phase_length.full_window_phases), how idle the head was before each restart, and whether
    the arms started alike (washout.arm_starts); nothing where no phase has a start
    temperature."""
    tolerance = run.start_balance_c
    starts = washout.arm_starts(phase_length.full_window_phases(validity), run.reference_arm, tolerance)
    if starts.empty:
        return []
    labels = {a: spec.label for a, spec in run.arms.items()}
    rows = pd.DataFrame(
        {
            "arm": [f"{a} ({labels.get(a, a)})" for a in starts["arm"]],
            "phases": starts["phases"],
            "start °C, mean (range)": [
                f"{fmt(m, '', 1)} ({fmt(lo, '', 1)}–{fmt(hi, '', 1)})"
                for m, lo, hi in zip(starts["start_c"], starts["start_min_c"], starts["start_max_c"], strict=False)
            ],
            "vs reference": [
                "reference" if a == run.reference_arm else fmt(d, "°C", sign=True)
                for a, d in zip(starts["arm"], starts["diff_c"], strict=False)
            ],
            "head idle W before": [fmt(w, "", 1) for w in starts["idle_w_before"]],
            "cooldowns at their cap": starts["cooldown_capped"],
            "starts": ["balanced" if b else Markdown("**unbalanced**") for b in starts["balanced"]],
        }
    )
    return [
        "## Balanced starts",
        "",
        markdown_table(rows),
        f"Start: the head's timeline zone at its last sample before load_start; head idle W: its total power"
        f" over the 10 s before the phase's restart (the end of the cooldown before it, or of the baseline)."
        f" Arms whose mean starts lie more than {tolerance:g} °C from the reference's (analysis.start_balance_c)"
        " are unbalanced: no question in °C built on them is yes. Phases of a shorter window (speed-only:"
        " no heat cooldown) are left out. Per phase in tables/validity.csv.",
        "",
    ]


def _by_arm(frame: pd.DataFrame, present: list[str]) -> list[tuple[str, pd.DataFrame]]:
    return [(arm, frame[frame["arm"] == arm]) for arm in present]


def _threshold_table(
    tables: dict[str, pd.DataFrame], run: Plan, present: list[str], labels: Mapping[str, str]
) -> pd.DataFrame:
    head, zone = run.head, run.timeline_zone
    th = tables["thresholds"]
    th = th[(th["host"] == head) & (th["sensor"] == zone)]
    zones = tables["zones"]
    peaks = zones[(zones["host"] == head) & (zones["sensor"] == zone)]
    rows = []
    for threshold in run.thresholds_c:
        row = {"threshold": fmt(threshold, "°C", 0)}
        for arm, phase_rows in _by_arm(th[th["threshold_c"] == threshold], present):
            cells = []
            reached = phase_rows[["order", "rep", "reached_s", "samples_at_or_above"]]
            for order, rep, reached_s, samples_at_or_above in reached.itertuples(index=False, name=None):
                if pd.isna(reached_s):
                    peak = peaks[(peaks["order"] == order) & (peaks["rep"] == rep) & (peaks["arm"] == arm)]["max_c"]
                    cells.append(f"not reached (peak {fmt(peak.max(), '°C')})")
                else:
                    grazing = (
                        " (one grazing sample)"
                        if samples_at_or_above == 1
                        else (f" ({samples_at_or_above} samples at or above)")
                    )
                    cells.append(fmt_duration(reached_s) + grazing)
            row[labels[arm]] = "; ".join(cells) or "–"
        rows.append(row)
    return pd.DataFrame(rows)


def _mean_cell(values: pd.Series, unit: str) -> str:
    if values.count() <= 1:
        return fmt(values.mean(), unit)
    return f"{fmt(values.mean(), '', DIGITS.get(unit))} ± {fmt(values.std(), unit)}"


def _zone_table(zones: pd.DataFrame, run: Plan, present: list[str], labels: Mapping[str, str]) -> pd.DataFrame:
    head, zone, reference = run.head, run.timeline_zone, run.reference_arm
    reference_means = zones[zones["arm"] == reference].groupby(["host", "sensor"])["mean_c"].mean()
    head_zones = (
        reference_means.loc[head].sort_values(ascending=False).index.tolist() if head in reference_means else []
    )
    # the study's table: every head zone, timeline zone first, then the timeline zone of the other hosts
    order = (
        [(head, zone)]
        + [(head, z) for z in head_zones if z != zone]
        + [(host, zone) for host in run.hosts if host != head]
    )
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


def _cpu_performance_table(
    tables: dict[str, pd.DataFrame], run: Plan, present: list[str], labels: Mapping[str, str]
) -> pd.DataFrame:
    cpu, perf = tables["cpu"], tables["performance"]
    rows = []
    for host in run.hosts:
        row = {"measure": f"{host} vLLM CPU sum, median (p5–p95 of the samples)"}
        for arm, arm_rows in _by_arm(cpu[cpu["host"] == host], present):
            if arm_rows.empty:
                row[labels[arm]] = "no CPU data"
                continue
            row[labels[arm]] = (
                f"{_mean_cell(arm_rows['median_pct'], '% of one core')}"
                f" ({fmt(arm_rows['p5_pct'].min(), '', 0)}–"
                f"{fmt(arm_rows['p95_pct'].max(), '% of one core')}),"
                f" n = {int(arm_rows['n'].sum())} samples"
            )
        rows.append(row)
    if perf["requests_completed"].isna().all():
        rows.append({"measure": "requests", **{labels[a]: "no request data in this run" for a in present}})
        return pd.DataFrame(rows)
    measures: list[tuple[str, Callable[[pd.DataFrame], str]]] = [
        (
            "requests completed in the window",
            lambda r: " + ".join(
                f"{v:.0f} in {fmt(w / 60, 'min')}" for v, w in zip(r["requests_completed"], r["window_s"], strict=False)
            ),
        ),
        ("output throughput", lambda r: _mean_cell(r["output_tok_s"], "tok/s")),
        ("output throughput in the window (the verdicts')", lambda r: _mean_cell(r["output_tok_s_in_window"], "tok/s")),
        ("single-stream probe decode speed (median)", _probe_cell),
        (
            f"stall gaps ≥ {fmt(run.stall_gap_s, 's')} (largest gap)",
            lambda r: f"{fmt(r['stall_gaps'].sum(), 'gaps')} ({fmt(r['max_gap_s'].max(), 's', 2)})",
        ),
        ("failed requests", lambda r: f"{r['errors'].sum():.0f}"),
    ]
    for name, cell in measures:
        rows.append({"measure": name, **{labels[a]: cell(arm_rows) for a, arm_rows in _by_arm(perf, present)}})
    return pd.DataFrame(rows)


def _probe_cell(rows: pd.DataFrame) -> str:
    """The probe decode speed of an arm's phases, only from the probes where it was measured."""
    measured, ok = int(rows["probe_n"].sum()), int(rows["probe_ok"].sum())
    if measured:
        of = "" if measured == ok else f" of {ok}"
        return f"{_mean_cell(rows['probe_tok_s_median'], 'tok/s')}, n = {measured}{of} probes measurable"
    if not ok:
        return "no successful probe"
    arrived = bursts(pd.concat([rows["probe_arrivals_min"], rows["probe_arrivals_max"]]))
    if arrived is None:
        return f"not measurable: token arrivals not recorded, n = {ok} probes"
    return f"not measurable: tokens arrived in {arrived}, n = {ok} probes"


def _energy_section(
    tables: dict[str, pd.DataFrame], run: Plan, present: list[str], labels: Mapping[str, str]
) -> list[str]:
    """ "Energy under load": the cluster total's power, J/token, tokens/J and above-idle figures
    per arm, then each host's total; lines of summary.md."""
    table = tables.get("energy", pd.DataFrame(columns=energy.ENERGY_COLUMNS))
    head = ["## Energy under load", ""]
    if table.empty:
        return head + [
            "No power domain was sampled on any host (RAPL, hwmon power, nvidia-smi, IPMI): there are"
            " no energy figures in this run (empty, not zero).",
            "",
        ]
    covered = energy.total_hosts(table)
    if not covered:
        return head + [
            "No host has a power domain that makes up its total (node, a module, a CPU socket or"
            " package, DRAM, a GPU): the domains it has are in tables/energy.csv, with no cluster total.",
            "",
        ]
    total = table[(table["host"] == energy.TOTAL_HOST) & (table["domain"] == energy.TOTAL_DOMAIN)]
    total = total.assign(tok_per_j=total["output_tokens"] / total["energy_j"])
    measures = [
        ("cluster power under load (mean)", "mean_w", "W"),
        ("cluster idle power (baseline)", "idle_w", "W"),
        ("cluster energy per output token", "j_per_token", "J/token"),
        ("cluster output tokens per joule", "tok_per_j", "tok/J"),
        ("cluster energy per output token above idle", "j_per_token_above_idle", "J/token"),
        ("cluster energy above idle per phase", "energy_above_idle_j", "J"),
    ]
    rows = [
        _energy_row(name, total, column, unit, present, labels, run.reference_arm) for name, column, unit in measures
    ]
    onboard = table[(table["host"] == energy.TOTAL_HOST) & (table["domain"] == energy.ONBOARD_DOMAIN)]
    if not onboard.empty:  # the total is at the wall: the boards' own meters beside it
        rows[3:3] = [
            _energy_row(
                "cluster energy per output token on board",
                onboard,
                "j_per_token",
                "J/token",
                present,
                labels,
                run.reference_arm,
            )
        ]
    per_host = energy.host_totals(table)
    for host, summed in covered.items():
        rows.append(
            _energy_row(
                f"{host} power under load ({' + '.join(summed)})",
                per_host[per_host["host"] == host],
                "mean_w",
                "W",
                present,
                labels,
                run.reference_arm,
            )
        )
    rows.append({"measure": "n (phases)", **{labels[a]: str(int((total["arm"] == a).sum())) for a in present}})
    covers = "; ".join(f"{md_text(host)}: {md_text(' + '.join(summed))}" for host, summed in covered.items())
    scopes = energy.host_scopes(table)
    scope_text = "; ".join(
        f"{md_text(host)}: {md_text(' + '.join(scopes[host][0]))} (holds {', '.join(scopes[host][1])})"
        for host in covered
    )
    blind = [host for host in covered if "cpu" not in scopes[host][1]]
    caveat = (
        [
            f"**The J/token leaves out the CPU of {', '.join(map(md_text, blind))}**: the total there covers"
            f" {'; '.join(md_text(' + '.join(scopes[host][0])) for host in blind)} only: where the arms change"
            " vLLM's CPU work (its spin), the energy of that change on those CPU cores is not in it;"
            " a meter at the wall (`wall_meters`: a plug, PDU outlet or BMC) would hold it (docs/power.md).",
            "",
        ]
        if blind
        else []
    )
    at_wall = _at_the_wall(table, total, onboard)
    return head + [
        markdown_table(pd.DataFrame(rows).fillna("")),
        *caveat,
        *at_wall,
        f"Cluster total = {covers} (each host's meters at the wall where it has any, else its node meter"
        " where it has one, else its module meters,"
        " else its CPU sockets or packages, DRAM and GPUs; what a module holds, rails, sub-domains such"
        " as package-0/core and other readings are in tables/energy.csv only). Scope of each host's"
        f" total: {scope_text}."
        " Mean power over the samples inside each load window (time-weighted), idle power over the"
        " baseline window; energy = mean power × window length; per token: energy / the tokens"
        " generated inside the load window (each request counts its share of tokens in the window)."
        " With several phases: mean of the phase values ± their sd. Gap = arm"
        " − reference.",
        "",
    ]


def _at_the_wall(table: pd.DataFrame, total: pd.DataFrame, onboard: pd.DataFrame) -> list[str]:
    """Where the total is at the wall: the scope of each J/token in words, and the hosts whose
    boards' own meters leave out the CPU."""
    if onboard.empty:
        return []
    hosts = table.loc[table["host"] != energy.TOTAL_HOST, ["host", "domain"]].drop_duplicates()
    blind = [
        str(host)
        for host, rows in hosts.groupby("host", sort=False)
        if host_total_domains(energy.on_board(rows["domain"].tolist()))
        and "cpu" not in total_scope(energy.on_board(rows["domain"].tolist()))[2]
    ]
    walls = table.loc[table["domain"].map(lambda domain: energy.is_wall(str(domain)))]
    listed = "; ".join(
        f"{host} {domain}: {scope}"
        for host, domain, scope in walls.groupby(["host", "domain"], sort=False)["scope"]
        .first()
        .reset_index()
        .itertuples(index=False, name=None)
    )
    return [
        f"Energy per token at the wall (scope: {total['scope'].iloc[0]}) is what the meters outside the hosts"
        f" read ({listed}): power supplies and everything on the boards. On board (scope:"
        f" {onboard['scope'].iloc[0]}) is what the hosts' own meters read: no supply loss, and"
        + (f" **not the CPU of {', '.join(blind)}**." if blind else " only the parts they meter."),
        "",
    ]


def _energy_row(
    name: str,
    frame: pd.DataFrame,
    column: str,
    unit: str,
    present: list[str],
    labels: Mapping[str, str],
    reference: str,
) -> dict[str, str]:
    row, means = {"measure": name}, dict[str, float]()
    for arm, arm_rows in _by_arm(frame, present):
        means[arm] = arm_rows[column].mean()
        row[labels[arm]] = _mean_cell(arm_rows[column], unit) if arm_rows[column].count() else "–"
    for arm in present:
        if arm != reference and reference in means:
            row[f"gap {labels[arm]}"] = fmt(means[arm] - means[reference], unit, sign=True)
    return row


def excluded_words(excluded: Mapping[str, Exclusion], reference: str) -> str:
    """The arms ``stats.best_setting`` left out and why, in words."""

    def why(reason: Exclusion) -> str:
        if reason["criterion"] == "stalls":
            return f"more stall gaps than {reference} ({reason['mean']:.1f} vs {reason['reference_mean']:.1f})"
        if math.isnan(reason["diff_pct"]):
            return f"throughput loss {reason['diff']:+.1f} {md_text(reason['unit'])}"
        return f"throughput loss {reason['diff_pct']:+.1f} %"

    return "; ".join(f"{arm}: {why(reason)}" for arm, reason in excluded.items()) or "none"


def _best_sentence(best: dict[str, Any], run: Plan) -> str:
    excluded = excluded_words(best["excluded"], run.reference_arm)
    unchecked = {"stalls", "throughput"} - set(best["checked"])
    caveat = f" Not checked for lack of request data: {', '.join(sorted(unchecked))}." if unchecked else ""
    if best["load_short"]:
        caveat += (
            " Built on phases whose load fell short of the configuration: "
            f"{', '.join(map(md_text, best['load_short']))} (see Load validity)."
        )
    return (
        f"Lowest {md_text(run.head)} {md_text(run.timeline_zone)} mean among the settings without extra"
        f" stalls or throughput loss beyond variance: {md_text(run.setting)} ="
        f" {md_text(best['value'])} ({md_text(best['label'])}, arm {best['arm']}, {fmt(best['mean'], '°C')})."
        f" Excluded: {excluded}.{caveat}"
    )


def _cpu_sentence(saver: BestSetting, run: Plan, variance: pd.DataFrame) -> str:
    """The setting that saves the most CPU (``stats.best_setting`` on the head's CPU)."""
    reference = run.reference_arm
    cpu = variance[variance["metric"] == names.cpu_median(run.head)].set_index("arm")
    excluded = excluded_words(saver["excluded"], reference)
    return (
        f"Most CPU saved without extra stalls or throughput loss beyond variance:"
        f" {md_text(run.setting)} = {md_text(saver['value'])} ({md_text(saver['label'])},"
        f" arm {saver['arm']}), {md_text(run.head)} vLLM CPU median {fmt(saver['mean'], '% of one core')}"
        f" against {fmt(cpu['mean'][reference], '% of one core')} for"
        f" {md_text(run.arms[reference].label)}."
        f" Excluded: {excluded}."
    )


def _sampling(sample_interval_s: dict[str, float], kind: str) -> str:
    interval = sample_interval_s.get(kind)
    return "not sampled in this run" if interval is None else f"sampled every {fmt_interval(interval)} (median)"


def _definitions(run: Plan, tables: dict[str, pd.DataFrame], sample_interval_s: dict[str, float]) -> str:
    windows = tables["windows"]
    labels = {a: md_text(spec.label) for a, spec in run.arms.items()}
    phase_list = ", ".join(
        f"{o} rep{r}-{a} ({labels.get(a, a)}) {fmt(w / 60, 'min')}"
        for o, r, a, w in windows[["order", "rep", "arm", "window_s"]].itertuples(index=False)
    )
    return "\n".join(
        [
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
            " the window / window length, in tok/s (the study's count). In the window (what the verdicts and"
            " questions compare): each ok load request's share of its tokens generated inside the window, its"
            " tokens spread evenly from its first token to its end, / window length. Probe decode speed:"
            " (completion_tokens − 1) / (t_end − t_first_token) per probe, median over the probes of the"
            " window where it was"
            f" measurable: at least {MIN_TOKEN_ARRIVALS} separate arrivals of tokens, from first to last"
            f" spanning at least {MIN_ARRIVAL_SPAN_SHARE * 100:.0f} % of t_end − t_first_token. Tokens that arrive in a"
            " few bursts divide by almost nothing; such a probe has no value and no verdict compares it.",
            f"- Stall gaps: inter-token gaps ≥ {fmt(run.stall_gap_s, 's')} summed over the ok requests of the window.",
            "- Energy: per power domain, the time-weighted mean of its samples inside the window (trapezoid"
            " over them / the span they cover) × the window length; idle: the same mean over the baseline"
            " [baseline_start, baseline_end); above idle: energy − idle × window length; J/token: energy /"
            " the window's output tokens. Energy counters (RAPL, hwmon, NVML) become power as Δenergy / Δt."
            " A domain without samples in a window is empty, never zero.",
            "- Statistics: per arm mean, sd and CV over phases; arm − reference by Welch t (one order) or"
            " OLS value ~ arm + position (several orders, separating the period effect), 95 % intervals,"
            " also in % of the reference mean where that mean can be told from zero (its own 95 % interval"
            " excludes zero). A difference is called real only when its interval excludes zero and it"
            " exceeds restart variance (the larger CV between repeats of an arm; the larger sd where there"
            " is no %)."
            " Phases per arm needed: 2 (z0.975 + z0.8)² sd² / Δ² (normal approximation, 80 % power,"
            " α = 0.05, pooled sd).",
        ]
    )
