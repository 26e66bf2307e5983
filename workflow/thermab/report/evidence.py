"""``evidence.md``: a run's answer as GitHub Markdown for a pull request comment.

It opens with the headline (the verdict line of each question and arm, ``verdict``, and
for an undecided one what would decide it and the command that runs it), then the design,
the environment (from ``preflight.json`` and the ``restored`` events), a table of the key
numbers, and the details in a collapsed section.
A run whose hosts are thermab's simulation says so in its first lines.  ``summary.md``
and ``report.html`` open with the same lines (``opening``).

Pure text rendering of frames and dicts; ``analyze`` reads the files and writes this one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from thermab.analysis import energy as energy_rows, levels
from thermab.analysis.model import Plan, Sources
from thermab.load.shapes import Shape
from thermab.load_levels import CLOSED
from thermab.markup import Markdown, md_cell, md_text
from thermab.report import plan_words, verdict
from thermab.report.summary import fmt_duration, markdown_table
from thermab.report.units import fmt
from thermab.telemetry.power import total_scope


def simulated_hosts(preflight: dict[str, Any] | None) -> list[str]:
    """The hosts preflight found to be thermab's simulated nodes."""
    hosts = (preflight or {}).get("hosts", {})
    return [name for name, facts in hosts.items() if isinstance(facts, dict) and facts.get("simulated")]


def simulated_note(preflight: dict[str, Any] | None) -> list[str]:
    """A quoted warning that the numbers come from a model, where any host is simulated."""
    hosts = simulated_hosts(preflight)
    if not hosts:
        return []
    return [
        f"> **Simulated cluster.** {', '.join(map(md_text, hosts))} {'is' if len(hosts) == 1 else 'are'}"
        " thermab's embedded simulation (real processes and files; temperatures and power from a model fitted to the"
        " spin-wait study, docs/simulation.md): these numbers describe the model, not hardware.",
        "",
    ]


def _level(row: verdict.AnswerRow, plan: Plan) -> str | None:
    """The load level (its label) of a row of a run of levels, None in a run of one."""
    label = getattr(row, levels.LEVEL, None)
    if not isinstance(plan.users, tuple) or label is None or pd.isna(label):
        return None
    return str(label)


def load_shape(plan: Plan) -> str:
    """The load in words: a run of levels' labels, or its one level's shape."""
    named = [one for one in levels.of_run(plan) if one is not None]  # of_run's [None]: users unnamed
    if not named:
        return "a load whose users run.json does not name"
    if isinstance(plan.users, tuple):
        return "levels of load, one window each after each restart: " + "; ".join(one.label for one in named)
    one = named[0]
    if one.kind == CLOSED:
        return f"closed loop of {one.users} users (zero think time)"
    return Shape(one.users, **one.shape).describe()


def headline(
    answers: pd.DataFrame,
    variance: pd.DataFrame,
    plan: Plan,
    events: pd.DataFrame | None = None,
) -> list[str]:
    """One Markdown bullet per question and arm, its verdict line (``verdict``); an undecided
    one says what would decide it (``plan_words.decide_call``: the command and what it costs).
    ``events``: the run's, for the cost."""
    if answers.empty:
        return ["No question was declared (`questions` is empty): the tables below carry the numbers."]
    call = plan_words.decide_call(answers, plan, events)
    lines = [f"- {line}." for line in verdict.verdict_lines(answers, call, escape=md_text)]
    return lines


def opening(
    answers: pd.DataFrame,
    variance: pd.DataFrame,
    plan: Plan,
    preflight: dict[str, Any] | None,
    events: pd.DataFrame | None = None,
) -> list[str]:
    """What summary.md, report.html and evidence.md open with: the simulation named where
    there is one, then the headline."""
    return [*simulated_note(preflight), "## Answer", "", *headline(answers, variance, plan, events), ""]


def _design(plan: Plan, windows: pd.DataFrame, asked_s: pd.Series | None = None) -> list[str]:
    """The design in words; ``asked_s``: each phase's window as asked (validity.csv's
    ``load_s``), which tells a run that shortened its windows from the jitter of the measured."""
    arms, reference, setting = plan.arms, plan.reference_arm, plan.setting
    phases = windows.groupby("arm").size() if len(windows) else pd.Series(dtype=int)
    arm_text = "; ".join(
        f"{a} = {md_text(spec.label)} ({md_text(setting)} = {md_text(spec.value)}"
        f"{', reference' if a == reference else ''}),"
        f" {int(phases.get(a, 0))} phase(s)"
        for a, spec in arms.items()
    )
    orders = ", ".join(map(md_text, pd.unique(windows["order"]))) if len(windows) else plan.order
    window = fmt_duration(float(windows["window_s"].median())) if len(windows) else "–"
    asked = pd.Series(dtype="float64") if asked_s is None else asked_s.dropna().astype(float)
    if asked.nunique() > 1 and plan.until == "decided":
        window = (
            f"{fmt_duration(asked.max())}, {fmt_duration(asked.min())} once only questions of speed and"
            " energy per token were open (docs/planning.md)"
        )
    design = "until decided" if plan.until == "decided" else "a fixed number of repeats"
    load = (
        f"{load_shape(plan)}, prompts of {'?' if plan.prompt_tokens is None else plan.prompt_tokens}"
        f" tokens, {'?' if plan.max_tokens is None else plan.max_tokens} output tokens each"
    )
    if plan.probe_n:
        load += f", {plan.probe_n} single-stream probes per phase"
    return [
        "### Design",
        "",
        f"- Arms: {arm_text}.",
        f"- Orders: {orders}; {design} (each phase restarts the server, then loads it for {window}, then cools down).",
        f"- Load: {load}.",
        "- Tests: each question on the arm effect (Welch t, or OLS arm + position where orders are pooled,"
        " + window where the phases ran windows of two lengths; speed and energy per token adjusted for"
        " the acceptance, its method in the questions table), each bound of its interval a one-sided test"
        " (docs/statistics.md).",
        "",
    ]


def _restored(events: pd.DataFrame | None) -> dict[str, object]:
    """host → the sha256 of its file as restored at the end (the ``restored`` events)."""
    if events is None or any(column not in events for column in ("event", "detail", "host")):
        return {}
    rows = events[events["event"] == "restored"]
    return {
        host: detail.get("sha256")
        for host, detail in zip(rows["host"], rows["detail"], strict=True)
        if isinstance(detail, dict)
    }


def _served_models(events: pd.DataFrame | None) -> list[str]:
    """The models the server named each time it answered after a restart (the
    ``server_ready`` events), each once, in order."""
    if events is None or "event" not in events or "detail" not in events:
        return []
    details = events.loc[events["event"] == "server_ready", "detail"]
    return list(dict.fromkeys(d["model"] for d in details if isinstance(d, dict) and isinstance(d.get("model"), str)))


def _host_hardware(facts: dict[str, Any], sources: Mapping[str, Mapping[str, str]]) -> str:
    parts = [facts.get("uname") or "kernel not recorded"]
    zones = facts.get("zones") or []
    if zones:
        parts.append(f"{len(zones)} thermal zones")
    for kind, what in (("freq", "cpufreq policies"), ("power", "power domains"), ("gpu", "GPU sensors")):
        count = len(sources.get(kind, {}))
        if count:
            parts.append(f"{count} {what}")
    return ", ".join(parts)


def _sha(digest: object) -> str:
    """The first 16 hex digits of a file's sha256 as code, in Markdown; what is no hex digest
    is text."""
    text = str(digest or "")[:16]
    return f"`{text}`" if text and all(c in "0123456789abcdef" for c in text) else md_cell(text or "–")


def _environment(
    plan: Plan, preflight: dict[str, Any] | None, events: pd.DataFrame | None, sources: Sources
) -> list[str]:
    lines = ["### Environment", ""]
    if not preflight:
        return lines + ["No preflight.json in this run (an imported run): hosts and files are not recorded.", ""]
    simulated = set(simulated_hosts(preflight))
    restored = _restored(events)
    rows = []
    for name, facts in preflight.get("hosts", {}).items():
        at_preflight, restored_sha = facts.get("sha256"), restored.get(name)
        server = (
            "thermab's simulated vLLM"
            if name in simulated
            else (f"vLLM {facts['vllm_version']}" if facts.get("vllm_version") else "vLLM (version not recorded)")
        )
        rows.append(
            {
                "host": name + (" (simulated)" if name in simulated else ""),
                "hardware": _host_hardware(facts, sources.get(name, {})),
                "server": server + (f" in container {facts['container']}" if facts.get("container") else ""),
                "setting's file": facts.get("file", "–"),
                "sha256 at preflight": Markdown(_sha(at_preflight)),
                "sha256 restored": Markdown(
                    _sha(restored_sha) + (" (same)" if restored_sha == at_preflight else " (**differs**)")
                )
                if restored_sha
                else "–",
            }
        )
    lines.append(markdown_table(pd.DataFrame(rows)))
    endpoint = preflight.get("endpoint") or {}
    model = plan.model or endpoint.get("model")
    served = _served_models(events)
    if model:
        model = md_text(model)
    elif served:  # the server was down at preflight: the first phase's restart brought it up
        model = ", ".join(map(md_text, served)) + " (as the server answered once it was up)"
    else:
        model = "not recorded (the server never answered)"
    lines += [
        f"- Endpoint: {md_text(endpoint.get('url', '–'))}; model: {model}.",
        "- sha256 restored: the file as each host's restore wrote it back at the end of the run.",
        "",
    ]
    return lines


def key_numbers(answers: pd.DataFrame, variance: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """Per question and arm: the reference's and the arm's means, the difference, in % of the
    reference, and the question's interval, every number in its unit as the verdict line
    gives it (CPU in cores, stall gaps per phase)."""
    labels = {a: md_text(spec.label) for a, spec in plan.arms.items()}
    rows = []
    for row in verdict.answer_rows(answers):
        selected = variance[variance["metric"] == row.metric]
        level = _level(row, plan)
        if level is not None and levels.LEVEL in selected:
            selected = selected[selected[levels.LEVEL] == level]
        arm = selected[selected["arm"] == row.arm]
        ref = selected[selected["arm"] == row.reference]
        unit = selected["unit"].iloc[0] if len(selected) else ""
        pct = arm["diff_pct"].iloc[0] if len(arm) else math.nan
        rows.append(
            {
                "metric": row.metric + (f" ({level})" if level is not None else ""),
                labels.get(row.reference, row.reference): (
                    verdict.quantity(ref["mean"].iloc[0], unit, sign=False) if len(ref) else "–"
                ),
                "arm": labels.get(row.arm, row.arm),
                "arm mean": verdict.quantity(arm["mean"].iloc[0], unit, sign=False) if len(arm) else "–",
                "difference": verdict.quantity(row.estimate, unit),
                "% of reference": fmt(pct, "%", 1, sign=True),
                "interval": verdict.span(row.ci_low, row.ci_high, unit) if not pd.isna(row.ci_low) else "–",
                "verdict": row.verdict,
            }
        )
    return pd.DataFrame(rows)


def energy_scope(table: pd.DataFrame | None) -> list[str]:
    """What the energy per token covers, in words: at the wall and on board where a host has a
    meter at the wall; in bold, the hosts whose total holds no CPU."""
    if table is None or table.empty:
        return []
    hosts = table.loc[table["host"] != energy_rows.TOTAL_HOST, ["host", "domain"]].drop_duplicates()
    lines, blind = [], []
    for host, rows in hosts.groupby("host", sort=False):
        domains = rows["domain"].tolist()
        summed, scopes, holds = total_scope(domains)
        if not summed:
            continue
        if "wall" in scopes:
            board = total_scope(energy_rows.on_board(domains))[1]
            lines.append(f"{host}: at the wall ({' + '.join(summed)}), on board {' + '.join(board) or 'nothing'}")
        if "cpu" not in holds:
            blind.append(f"{host} ({' + '.join(scopes)})")
    said = (
        [f"Energy per token covers each host at the wall and on board side by side: {'; '.join(lines)}."]
        if lines
        else []
    )
    if blind:
        said.append(
            f"**Energy per token leaves out the CPU of {', '.join(blind)}**: no meter there sees the CPU, and no"
            " meter at the wall (`wall_meters`) holds it (docs/power.md)."
        )
    return said + [""] if said else []


def evidence_markdown(
    plan: Plan,
    answers: pd.DataFrame,
    variance: pd.DataFrame,
    windows: pd.DataFrame,
    *,
    preflight: dict[str, Any] | None,
    events: pd.DataFrame | None,
    sources: Sources,
    asked_s: pd.Series | None = None,
    energy: pd.DataFrame | None = None,
) -> str:
    """evidence.md: the headline, design, environment, key numbers and collapsed details;
    ``asked_s``: each phase's window as asked (validity.csv's ``load_s``); ``energy``: the
    energy table, whose scopes the energy per token is said in."""
    present = list(plan.arms)
    title = f"# thermab: {md_text(plan.cluster)} — {md_text(plan.setting)}, " + " vs ".join(
        f"{md_text(plan.arms[a].label)} ({md_text(plan.arms[a].value)})" for a in present
    )
    parts = [title, "", *opening(answers, variance, plan, preflight, events)]
    parts += _design(plan, windows, asked_s)
    parts += _environment(plan, preflight, events, sources)
    parts += ["### Key numbers", ""]
    parts += [markdown_table(key_numbers(answers, variance, plan)) if len(answers) else "No question declared.", ""]
    parts += energy_scope(energy)
    differences = variance[variance["reference"].notna()] if "verdict" in variance else variance.iloc[:0]
    details = [f"- {md_text(v)}" for v in differences["verdict"].dropna()]
    parts += [
        "<details><summary>Details: every verdict and question</summary>",
        "",
        *(details or ["- no arm to compare"]),
        "",
        markdown_table(answers) if len(answers) else "",
        "Full tables, figures and definitions: summary.md, report.html and tables/ in the run directory.",
        "",
        "</details>",
    ]
    return "\n".join(parts) + "\n"
