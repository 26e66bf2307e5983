"""Each arm at rest: the idle window after each restart measured as the load's is, as
metrics the questions may name, and the config's refusal of a window longer than the
safety cap."""

import copy

import numpy as np
import pandas as pd
import pytest
import yaml

from support.paths import REPO as ROOT
from thermab import metric_names as names
from thermab.analysis import rest
from thermab.analysis.model import Telemetry
from thermab.config import ConfigError, known_metric, validate
from thermab.experiment.events import EVENTS

RAW = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def events():
    rows = []
    for rep, arm, start in ((1, "A", 100.0), (1, "B", 400.0)):
        for event, t in (("server_ready", start - 5), ("idle_start", start), ("idle_end", start + 60)):
            rows.append({"t": t, "event": event, "order": "AB", "rep": rep, "arm": arm})
        rows.append({"t": start + 70, "event": "load_start", "order": "AB", "rep": rep, "arm": arm})
        rows.append({"t": start + 200, "event": "load_end", "order": "AB", "rep": rep, "arm": arm})
    return pd.DataFrame(rows)


def telemetry():
    """The stock arm (A) spins a core at rest, the patched one (B) does not; under load both
    run hot; power and temperature follow."""
    rows = []
    for t in np.arange(0.0, 700.0, 1.0):
        loaded = 170 <= t < 300 or 470 <= t < 600
        at_rest_a = 100 <= t < 160
        cpu = 400.0 if loaded else 100.0 if at_rest_a or t < 100 else 2.0
        rows += [
            {"t": t, "host": "head", "kind": "cpu", "sensor": "vllm_cpu_pct", "value": cpu},
            {"t": t, "host": "head", "kind": "thermal", "sensor": "TSOC", "value": 40 + cpu / 20},
            {"t": t, "host": "head", "kind": "power", "sensor": "package", "value": 10 + cpu / 10},
        ]
    return Telemetry.from_frame(pd.DataFrame(rows))


def test_the_idle_window_lies_between_its_marks_per_phase():
    windows = rest.idle_windows(events())
    assert list(zip(windows["arm"], windows["load_start"], windows["load_end"], strict=True)) == [
        ("A", 100.0, 160.0),
        ("B", 400.0, 460.0),
    ]
    assert {"idle_start", "idle_end"} <= set(EVENTS)


def test_each_arm_at_rest_is_its_cpu_power_and_temperature_in_that_window():
    values = rest.rest_metrics(telemetry(), events(), ["head"], "TSOC").set_index(["arm", "metric"])["value"]
    assert values[("A", "head vLLM CPU median at rest")] == 100.0
    assert values[("B", "head vLLM CPU median at rest")] == 2.0
    assert values[("A", "head TSOC mean at rest")] == pytest.approx(45.0)
    assert values[("B", "head power at rest")] == pytest.approx(10.2)
    assert rest.rest_metrics(telemetry(), events().iloc[:0], ["head"], "TSOC").empty


def config(idle_s, cap=None, questions=None):
    raw = copy.deepcopy(RAW)
    raw.setdefault("timings", {})["idle_s"] = idle_s
    raw.setdefault("safety", {})["max_load_minutes"] = cap
    if questions is not None:
        raw["questions"] = questions
    return raw


def test_an_idle_window_longer_than_the_safety_cap_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"^config key 'timings.idle_s': 700 s of idle window outlasts"):
        validate(config(700, cap=10), ROOT)
    with pytest.raises(ConfigError, match="timings.idle_s"):
        validate(config(-1), ROOT)
    assert validate(config(60, cap=10), ROOT)["timings"]["idle_s"] == 60


def test_questions_may_name_a_metric_at_rest_when_there_is_an_idle_window():
    asked = [{"metric": "head vLLM CPU median at rest", "kind": "lower"}]
    validated = validate(config(60, questions=asked), ROOT)
    assert known_metric(validated, "head power at rest") and known_metric(validated, "head TSOC mean at rest")
    assert not known_metric(validated, "nohost power at rest")
    with pytest.raises(ConfigError, match="head vLLM CPU median at rest"):
        validate(config(0, questions=asked), ROOT)
    assert names.rest_host("head power") is None and names.rest_host(names.at_rest(names.power("w1"))) == "w1"
