"""``thermab compare RUN_A RUN_B``: any two finished runs side by side, arms matched by label,
the environments' differences first; bad input one line and exit status 2."""

import json

import pytest

from support.synthetic_run import write_synthetic_run
from thermab.__main__ import main as thermab_main
from thermab.report import compare


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    run_a = write_synthetic_run(root / "run_a" / "AB", reps=2, seed=1, temperature={"A": 90.0, "B": 84.0})
    run_b = write_synthetic_run(root / "run_b" / "AB", reps=2, seed=2, temperature={"A": 80.0, "B": 76.0})
    lines = (run_b / "events.jsonl").read_text().splitlines()  # another run: another start
    first = json.loads(lines[0])
    assert first["event"] == "run_start"
    (run_b / "events.jsonl").write_text("\n".join([json.dumps({**first, "t": first["t"] - 1}), *lines[1:]]) + "\n")
    plan = json.loads((run_b / "run.json").read_text())
    (run_b / "run.json").write_text(json.dumps({**plan, "max_tokens": 256}))  # an environment that differs
    return run_a, run_b


def test_two_runs_compare_by_arm_label_with_their_environments_differences_first(runs, capsys):
    run_a, run_b = runs
    assert thermab_main(["compare", str(run_a), str(run_b)]) == 0
    text = capsys.readouterr().out
    assert "not a crossover's estimate within one run" in text
    assert text.index("run.json: max_tokens:") < text.index("## Differences per arm and metric")
    table, _differ = compare.compare([run_a, run_b])
    zone = table[(table["metric"] == "head TSOC mean")].set_index("arm_label")
    assert zone.at["stock", "diff"] == pytest.approx(-10.0, abs=0.5)  # 90 °C then 80
    assert zone.at["stock", "ci_low"] < zone.at["stock", "diff"] < zone.at["stock", "ci_high"]
    assert zone.at["stock", "unit"] == "°C" and zone.at["stock", "n"] == 2


@pytest.mark.parametrize("case", ["no run", "in progress", "no shared label", "one run", "the same run"])
def test_bad_input_is_one_line_and_exit_status_2(runs, tmp_path, capsys, case):
    run_a, run_b = runs
    other = tmp_path / "other"
    if case == "no run":
        other.mkdir()
        argv = [str(run_a), str(other)]
    elif case == "in progress":
        other = write_synthetic_run(tmp_path / "live" / "AB", reps=1)
        lines = (other / "events.jsonl").read_text().splitlines()
        (other / "events.jsonl").write_text("\n".join(line for line in lines if "run_end" not in line) + "\n")
        argv = [str(run_a), str(other)]
    elif case == "no shared label":
        other = write_synthetic_run(
            tmp_path / "renamed" / "AB",
            reps=1,
            arms={"A": {"label": "old", "value": "1"}, "B": {"label": "new", "value": "0"}},
        )
        argv = [str(run_a), str(other)]
    elif case == "the same run":
        argv = [str(run_a), str(run_a)]
    else:
        argv = [str(run_a)]
    assert thermab_main(["compare", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    expected = {
        "no run": "not a run directory",
        "in progress": "still in progress",
        "no shared label": "share no label",
        "one run": "at least two run directories",
        "the same run": "is the same run as",
    }[case]
    assert expected in err


def test_differences_name_each_key_that_differs_and_a_file_only_some_runs_have():
    first = {"run.json: max_tokens": "400", "run.json: users": "4", "provenance: vllm": '"0.9"'}
    second = {"run.json: max_tokens": "256", "run.json: users": "4"}
    assert compare.differences([first, second], ["a", "b"]) == [
        "provenance: only in a",
        "run.json: max_tokens: a: 400, b: 256",
    ]
