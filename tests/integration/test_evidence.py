"""evidence.md, the answer a reviewer pastes: one verdict line per question with its
estimate, interval and margin in units (the same line in summary.md and status), the
design, the environment with the file's sha256 at preflight and as restored, a link-free table of key
numbers and collapsed details; summary.md and report.html open with the same headline; a
simulated cluster is named in the first lines; an undecided question says what would
decide it and the command."""

import json
import re

import pandas as pd

from support.synthetic_run import write_synthetic_run
from thermab.analysis import planning, questions
from thermab.analysis.model import Plan, load_run
from thermab.config import question_words
from thermab.report import plan_words
from thermab.report.analyze import analyze
from thermab.report.html_page import write_report

SHA_BEFORE = "ab" * 32


def _with_hosts(run_dir, simulated: bool, restored_sha: str = SHA_BEFORE):
    """The preflight.json and restored events a run writes, for the synthetic run."""
    facts = {
        "transport": "local",
        "uname": "Linux 6.8.0 aarch64",
        "file": "/venv/vllm/distributed/device_communicators/shm_broadcast.py",
        "sha256": SHA_BEFORE,
        "vllm_version": None if simulated else "0.11.0",
        "zones": [{"name": "TSOC"}, {"name": "TS1P"}],
    }
    if simulated:
        facts["simulated"] = True
    preflight = {"hosts": {"head": facts, "worker": dict(facts)}, "endpoint": {"url": "http://x:8000", "model": "m"}}
    (run_dir / "preflight.json").write_text(json.dumps(preflight))
    events = (run_dir / "events.jsonl").read_text().splitlines()
    end = json.loads(events[-1])["t"]
    for host in ("worker", "head"):
        detail = {"file": facts["file"], "sha256": restored_sha if host == "head" else SHA_BEFORE}
        events.append(json.dumps({"t": end + 1, "event": "restored", "host": host, "detail": detail}))
    (run_dir / "events.jsonl").write_text("\n".join(events) + "\n")
    return run_dir


def _answer_block(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("## Answer")
    end = next(i for i in range(start + 2, len(lines)) if not lines[i].startswith(("- ", "  ")))
    return lines[start:end]


def test_the_headline_states_each_verdict_estimate_and_interval_in_units(tmp_path):
    run_dir = _with_hosts(write_synthetic_run(tmp_path / "AB", reps=3, tok_s={"A": 85.0, "B": 60.0}), False)
    answers = analyze(run_dir)["questions"]
    text = (run_dir / "evidence.md").read_text()
    block = _answer_block(text)
    bullets = [line for line in block if line.startswith("- ")]
    assert len(bullets) == len(answers) == 6
    temperature = next(b for b in bullets if "head TSOC mean lower" in b)
    assert re.fullmatch(
        r"- YES — head TSOC mean lower: −\d+\.\d °C \[−[\d.]+, −[\d.]+ °C\] vs margin 0 °C, 3 phases per arm\.",
        temperature,
    )
    throughput = next(b for b in bullets if b.startswith("- NO — output throughput"))
    assert re.fullmatch(
        r"- NO — output throughput no worse than 5 % \(higher is better\): −\d+\.\d tok/s \[−[\d.]+, −[\d.]+"
        r" tok/s\] vs margin −4\.\d tok/s, 3 phases per arm\.",
        throughput,
    )
    cpu = next(b for b in bullets if "vLLM CPU" in b)
    assert re.search(r": −1\.\d\d cores \(−1\d\d % of one core\) \[−1\.\d\d, −1\.\d\d cores\] vs margin 0 cores,", cpu)
    assert "vs margin +0.5 gaps per phase, 3 phases per arm" in next(b for b in bullets if "stall gaps" in b)
    assert "Simulated" not in text
    design = text[text.index("### Design") : text.index("### Environment")]
    assert "A = stock (busy_loop_s = 1, reference), 3 phase(s)" in design and "closed loop of" in design
    environment = text[text.index("### Environment") : text.index("### Key numbers")]
    assert "vLLM 0.11.0" in environment and f"`{SHA_BEFORE[:16]}` (same)" in environment
    assert "shm_broadcast.py" in environment and "2 thermal zones" in environment
    key = text[text.index("### Key numbers") : text.index("<details>")]
    assert "](" not in key and "http" not in key
    assert re.search(
        r"\| output throughput \| 8\d\.\d tok/s \| patched \| 6\d\.\d tok/s \| −2\d\.\d tok/s \| −2\d\.\d % \|", key
    )
    assert text.index("<details>") < text.index("</details>") and text.rstrip().endswith("</details>")


def test_summary_and_report_open_with_the_same_headline(tmp_path):
    run_dir = _with_hosts(write_synthetic_run(tmp_path / "AB", reps=3), False)
    analyze(run_dir)
    summary = (run_dir / "summary.md").read_text()
    assert _answer_block(summary) == _answer_block((run_dir / "evidence.md").read_text())
    assert summary.startswith("# thermab: synthetic") and summary.index("## Answer") < summary.index("## Questions")
    write_report(run_dir, run_dir / "report.html")
    page = (run_dir / "report.html").read_text()
    assert page.index("<h2>Answer</h2>") < page.index("<h2>Questions</h2>")


def test_a_simulated_cluster_is_named_in_the_first_lines_of_each(tmp_path):
    run_dir = _with_hosts(write_synthetic_run(tmp_path / "AB", reps=2), True, restored_sha="cd" * 32)
    analyze(run_dir)
    write_report(run_dir, run_dir / "report.html")
    for name in ("evidence.md", "summary.md"):
        first = (run_dir / name).read_text().splitlines()[:4]
        assert any("**Simulated cluster.** head, worker are thermab's embedded simulation" in line for line in first)
    page = (run_dir / "report.html").read_text()
    assert page.index("Simulated cluster.") < page.index("<h2>Answer</h2>")
    environment = (run_dir / "evidence.md").read_text()
    assert "head (simulated)" in environment and "thermab's simulated vLLM" in environment
    assert f"`{'cd' * 8}` (**differs**)" in environment  # the head's file came back otherwise


def test_the_model_is_the_one_the_server_named_once_it_answered(tmp_path):
    """A server down at preflight names no model there; the environment gives the model it
    named as it answered after the first restart (the server_ready events)."""
    run_dir = _with_hosts(write_synthetic_run(tmp_path / "AB"), False)
    preflight = json.loads((run_dir / "preflight.json").read_text())
    preflight["endpoint"]["model"] = None
    (run_dir / "preflight.json").write_text(json.dumps(preflight))
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    ready = [event for event in events if event["event"] == "server_ready"]
    assert ready
    for event in ready:
        event["detail"] = {"model": "sim-deepseek"}
    (run_dir / "events.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events))
    analyze(run_dir)
    text = (run_dir / "evidence.md").read_text()
    assert "model: sim-deepseek (as the server answered once it was up)." in text
    assert "not recorded" not in text


def _started_with(run_dir, configfiles: list[str], cores: int):
    """run.json as preflight records it of a run Snakemake started with these."""
    run = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**run, "configfiles": configfiles, "cores": cores}))
    return run_dir


def test_an_undecided_question_says_what_would_decide_it_and_the_command(tmp_path):
    run_dir = _started_with(_with_hosts(write_synthetic_run(tmp_path / "AB"), False), ["/c/my cluster.yaml"], 4)
    analyze(run_dir)
    bullets = [b for b in _answer_block((run_dir / "evidence.md").read_text()) if b.startswith("- ")]
    measured = [b for b in bullets if "not measured in this run" not in b]  # no power: no repeat can help
    assert len(measured) == 5 and all(b.startswith("- UNDECIDED — ") for b in bullets)
    assert all("to decide" not in b for b in bullets if b not in measured)
    command = "`snakemake --cores 4 all --configfile '/c/my cluster.yaml' --config until=decided max_repeats=8`"
    assert all(command in b and b.endswith(".") for b in measured), measured
    assert all(
        "[no interval] vs margin " in b
        and ", 1 phase per arm; to decide: a spread between phases needs at least two phases per arm, " in b
        and "cluster-hours" in b
        for b in measured
    )
    assert "run.json does not say" not in (run_dir / "evidence.md").read_text()
    ba = _with_hosts(write_synthetic_run(tmp_path / "BA", order="BA"), False)
    analyze(ba)  # a run.json that does not record its files: the reader is told to add them
    text = (ba / "evidence.md").read_text()
    assert "`snakemake --cores 1 all --config order=BA until=decided max_repeats=8`" in text
    assert "add the `--configfile` the run was made with: run.json does not say" in text


def test_the_command_asks_for_the_phases_the_open_questions_need_in_pairs():
    def frame(needed, ran=3, verdict=questions.UNDECIDED):
        return pd.DataFrame(
            {"verdict": [verdict, questions.YES], "phases_needed": [needed, 99.0], "phases_per_arm": ran}
        )

    plan = Plan({"order": "AB"})
    assert planning.decide_repeats(frame(13.0), plan) == 14  # pairs: AB then BA
    assert planning.decide_repeats(frame(14.0), plan) == 14
    assert planning.decide_repeats(frame(2.0, ran=3), plan) == 6  # never fewer than one more pair
    assert planning.decide_repeats(frame(float("nan"), ran=1), plan) == 8  # no spread yet: the default cap
    assert planning.decide_repeats(frame(500.0), plan) == 100  # the schema's bound
    assert planning.decide_command(frame(13.0), Plan({"order": "BA", "configfiles": (), "cores": 2})) == (
        "snakemake --cores 2 all --config order=BA until=decided max_repeats=14"
    )
    # the run's own --config entries hold on (a budget, a load), but for those the command sets
    given = {"order": "BA", "configfiles": (), "cores": 2, "overrides": {"budget_hours": "6", "repeats": "3"}}
    assert planning.decide_command(frame(13.0), Plan(given)) == (
        "snakemake --cores 2 all --config budget_hours=6 order=BA until=decided max_repeats=14"
    )


def test_the_command_that_decides_says_what_it_costs_at_the_runs_measured_jobs():
    answers = pd.DataFrame({"verdict": [questions.UNDECIDED], "phases_needed": [13.0], "phases_per_arm": [3]})
    plan = Plan({"order": "AB", "arms": {"A": {}, "B": {}}, "time_scale": 30.0})
    events = pd.DataFrame(
        [
            {"t": 0.0, "event": "baseline_start", "rep": None},
            {"t": 20.0, "event": "baseline_end", "rep": None},
            *[
                {"t": 20.0 + 100 * k + offset, "event": name, "order": "AB", "rep": 1 + k // 2, "arm": "AB"[k % 2]}
                for k in range(4)
                for offset, name in ((0.0, "restart_start"), (90.0, "cooldown_end"))
            ],
        ]
    )
    # each job from the end of the one before it (the 10-s gaps between jobs are cluster time
    # too): 90, 100, 100, 100 s; 14 repeats of two arms at the median 100 s plus the 20-s
    # baseline, × 30: (20 + 28 × 100) × 30 / 3600
    assert plan_words.decide_cost(answers, plan, events) == (
        " (at most 23.5 cluster-hours: this run's median phase job of 100 s × 30 study seconds per second)"
    )
    assert plan_words.decide_cost(answers, plan, None) == ""


def test_status_gives_the_command_that_decides_what_is_open_and_its_cost(tmp_path):
    from thermab.report import status

    run_dir = _with_hosts(write_synthetic_run(tmp_path / "AB"), False)
    analyze(run_dir)
    lines = [line for line in status.status_lines(run_dir) if "; to decide: " in line]
    assert len(lines) == 5  # every measured question is open after one phase per arm
    for line in lines:
        assert "`snakemake --cores 1 all --config until=decided max_repeats=8`" in line
        assert "cluster-hours" in line and "--configfile" in line


def test_the_same_verdict_lines_stand_in_evidence_summary_and_status(tmp_path):
    """evidence.md, summary.md and status give each question the one verdict line (Markdown's
    escapes read back), from the questions' words alone: no caveat or method inside it."""
    import html

    from thermab.report import status

    run_dir = _with_hosts(write_synthetic_run(tmp_path / "AB", reps=3, tok_s={"A": 85.0, "B": 60.0}), False)
    answers = analyze(run_dir)["questions"]

    def lines(text):
        return [html.unescape(line[2:].removesuffix(".")) for line in _answer_block(text) if line.startswith("- ")]

    evidence_lines = lines((run_dir / "evidence.md").read_text())
    summary_lines = lines((run_dir / "summary.md").read_text())
    shown = status.status_lines(run_dir)
    start = shown.index("  questions so far:") + 1
    status_lines = [line.strip() for line in shown[start : start + len(answers)]]
    assert evidence_lines == summary_lines == status_lines and len(status_lines) == len(answers) == 6
    declared = [question_words(q) for q in load_run(run_dir).plan.questions]
    assert answers["question"].tolist() == declared  # the words alone: caveats are the note column's
    for line, words, verdict in zip(status_lines, declared, answers["verdict"], strict=True):
        assert line.startswith(f"{verdict.upper()} — {words}: ") and len(words) <= 60
