"""Energy per phase (docs/design.md): the definitions on hand-made frames whose answers are
known; sub-domains never summed twice; empty never zero (whole synthetic runs:
integration/test_energy_runs.py)."""

import math

import numpy as np
import pandas as pd
import pytest

from thermab.analysis import energy, metrics

T0 = 1.7e9


def events(*rows):
    return pd.DataFrame([dict(zip(("t", "event", "order", "rep", "arm"), row, strict=False)) for row in rows])


def power(host, domain, times, values):
    return pd.DataFrame(
        {
            "t": np.asarray(times, float),
            "host": host,
            "kind": "power",
            "sensor": domain,
            "value": np.asarray(values, float),
        }
    )


def requests(*rows):
    """(order, rep, arm, kind, t_first_token, t_end, completion_tokens, ok) per request."""
    columns = metrics.PHASE_KEYS + ["kind", "t_first_token", "t_end", "completion_tokens", "ok"]
    frame = pd.DataFrame([dict(zip(columns, row, strict=False)) for row in rows], columns=columns)
    return frame.assign(t_start=frame["t_first_token"] - 1.0)


def inside(order, rep, arm, tokens, start):
    """One load request of ``tokens`` wholly inside the window that opens at ``start``."""
    return (order, rep, arm, "load", start + 10.0, start + 20.0, tokens, True)


EVENTS = events(
    (0, "baseline_start", "AB", None, None),
    (100, "baseline_end", "AB", None, None),
    (1000, "load_start", "AB", 1, "A"),
    (1100, "load_end", "AB", 1, "A"),
    (2000, "load_start", "AB", 1, "B"),
    (2100, "load_end", "AB", 1, "B"),
)
WINDOWS = metrics.load_windows(EVENTS)
TOKENS = requests(inside("AB", 1, "A", 2000, 1000), inside("AB", 1, "B", 2500, 2000))


def test_time_weighted_mean_is_the_trapezoid_over_the_span_covered():
    # 100 W for 10 s, a ramp to 200 W over 10 s, 200 W for 30 s: (1000 + 1500 + 6000) / 50
    assert energy.time_weighted_mean(np.array([0.0, 10, 20, 50]), np.array([100.0, 100, 200, 200])) == 170.0
    assert energy.time_weighted_mean(np.array([5.0]), np.array([42.0])) == 42.0
    assert math.isnan(energy.time_weighted_mean(np.array([]), np.array([])))


def test_definitions_on_irregular_samples():
    telemetry = pd.concat(
        [
            power("head", "package-0", [10, 50, 90], [20, 20, 20]),  # baseline
            power("head", "package-0", [995, 1000, 1010, 1030, 1090, 1100], [999, 100, 100, 200, 200, 999]),
            power("head", "package-0", [2005, 2095], [150, 150]),
        ],
        ignore_index=True,
    )
    table = energy.energy_table(telemetry, WINDOWS, EVENTS, TOKENS, ["head"])
    a = table[(table["arm"] == "A") & (table["host"] == "head")].iloc[0]
    # inside [1000, 1100): 100 W to 1010, a ramp to 200 W at 1030, 200 W to 1090: 16000 J over 90 s
    assert a["mean_w"] == pytest.approx(16000 / 90)
    assert a["window_s"] == 100 and a["energy_j"] == pytest.approx(16000 / 90 * 100)
    assert a["idle_w"] == 20.0
    assert a["energy_above_idle_j"] == pytest.approx(16000 / 90 * 100 - 20 * 100)
    assert a["output_tokens"] == 2000
    assert a["j_per_token"] == pytest.approx(16000 / 90 * 100 / 2000)
    assert a["j_per_token_above_idle"] == pytest.approx((16000 / 90 * 100 - 2000) / 2000)
    b = table[(table["arm"] == "B") & (table["host"] == "head")].iloc[0]
    assert b["mean_w"] == 150 and b["j_per_token"] == pytest.approx(150 * 100 / 2500)
    assert table.columns.tolist() == energy.ENERGY_COLUMNS


def test_tokens_are_those_generated_inside_the_window():
    # window [1000, 1100): each request's tokens spread evenly from its first token to its end
    phase = requests(
        ("AB", 1, "A", "load", 1010, 1020, 400, True),  # wholly inside: 400
        ("AB", 1, "A", "load", 1090, 1110, 400, True),  # in flight at load_end: half, 200
        ("AB", 1, "A", "probe", 1050, 1060, 256, True),  # a probe's tokens are paid for too: 256
        ("AB", 1, "A", "load", 1095, 1095, 100, True),  # all at one instant inside: 100
        ("AB", 1, "A", "load", 1100, 1100, 100, True),  # at one instant at load_end: outside
        ("AB", 1, "A", "load", 1020, 1030, 400, False),  # failed: its tokens are unknown
        ("AB", 1, "A", "load", 500, 600, 400, True),  # an aborted attempt's, before the window
    )
    window = WINDOWS.iloc[0]
    assert energy.tokens_in_window(phase, window) == pytest.approx(400 + 200 + 256 + 100)
    assert math.isnan(energy.tokens_in_window(None, window)) and math.isnan(
        energy.tokens_in_window(phase.iloc[:0], window)
    )
    no_first_token = phase.iloc[:2].assign(t_first_token=np.nan, t_start=[1000.0, 1070.0])
    assert energy.tokens_in_window(no_first_token, window) == pytest.approx(400 + 400 * 30 / 40), "t_start stands in"
    table = energy.energy_table(
        power("head", "package-0", [1000, 1050, 1099], [100] * 3), WINDOWS.iloc[:1], EVENTS, phase, ["head"]
    )
    row = table[table["host"] == "all"].iloc[0]
    assert row["output_tokens"] == pytest.approx(956) and row["j_per_token"] == pytest.approx(100 * 100 / 956)


def test_counting_the_requests_that_ended_would_read_the_energy_high_and_noisy():
    """Four closed-loop streams of 400-token requests from load_start, each request as long
    as the simulated cluster's (7.15 s, sd 5.5 %, its first token after 0.18 s), in windows
    of 54-60 s (the default study's windows of load_s 60 measured 54.5-59.6 s): counted by
    the requests that ended in the window, the rate is low by the requests in flight at
    load_end and jumps by whole requests as the window's end passes the streams' nearly
    simultaneous ends; counted by the tokens generated inside the window it varies only as
    the requests' speed does.  The default study's phases read the same (tokens per second:
    CV 2.2-3.5 % against 1.0-1.2 %), which is why its J/token spread 2-3 % from phase to
    phase while its power spread 0.2 %."""
    rng = np.random.default_rng(7)
    request_s, start = 7.15, 1000.0
    generated, ended = [], []
    for _ in range(200):
        end = start + rng.uniform(54.0, 60.0)
        rows = []
        for _user in range(4):
            t = start
            while t < end:
                last = t + request_s * rng.normal(1.0, 0.055)
                rows.append(("AB", 1, "A", "load", t + 0.18, last, 400, True))
                t = last
        phase = requests(*rows)
        window = pd.Series({"load_start": start, "load_end": end})
        generated.append(energy.tokens_in_window(phase, window) / (end - start))
        ended.append(phase.loc[phase["t_end"] < end, "completion_tokens"].sum() / (end - start))
    generated, ended = np.array(generated), np.array(ended)
    cv = {name: 100 * v.std() / v.mean() for name, v in (("generated", generated), ("ended", ended))}
    print(
        f"tokens/s over 200 windows: generated {generated.mean():.1f} (CV {cv['generated']:.2f} %), "
        f"of the requests that ended {ended.mean():.1f} (CV {cv['ended']:.2f} %)"
    )
    assert ended.mean() < 0.96 * generated.mean()
    assert cv["ended"] > 2 * cv["generated"]


def test_host_total_never_sums_a_sub_domain_or_an_overlapping_reading():
    assert energy.host_total_domains(
        ["package-0", "package-0/core", "package-0/uncore", "dram-0", "gpu0", "psys", "hwmon/power_meter/node"]
    ) == ["dram-0", "gpu0", "package-0"]
    assert energy.host_total_domains(["node", "package-0", "gpu0"]) == ["node"]
    assert energy.host_total_domains(["package-0/core", "hwmon/amdgpu/PPT"]) == []
    assert energy.host_total_domains(["gpu-1", "core-0", "uncore"]) == ["gpu-1"]
    times = [1000, 1050, 1099]
    telemetry = pd.concat(
        [
            power("head", "package-0", times, [60] * 3),
            power("head", "package-0/core", times, [40] * 3),
            power("head", "dram-0", times, [5] * 3),
            power("head", "gpu0", times, [300] * 3),
            power("head", "psys", times, [90] * 3),
            power("head", "hwmon/power_meter/node", times, [500] * 3),
            power("worker", "node", times, [250] * 3),
            power("worker", "package-0", times, [70] * 3),
        ],
        ignore_index=True,
    )
    table = energy.energy_table(telemetry, WINDOWS.iloc[:1], EVENTS, TOKENS, ["head", "worker"])
    total = table[(table["host"] == "all") & (table["domain"] == "total")].iloc[0]
    assert total["mean_w"] == 60 + 5 + 300 + 250
    assert total["energy_j"] == (60 + 5 + 300 + 250) * 100
    assert total["j_per_token"] == pytest.approx((60 + 5 + 300 + 250) * 100 / 2000)
    assert energy.total_hosts(table) == {"head": ["dram-0", "gpu0", "package-0"], "worker": ["node"]}
    assert table["host"].tolist()[:6] == ["head"] * 6 and table["host"].iloc[-1] == "all"


def test_a_domain_without_samples_is_empty_never_zero(tmp_path):
    telemetry = pd.concat(
        [
            power("head", "package-0", [1000, 1050, 2000, 2050], [60, 60, 50, 50]),
            power("head", "gpu0", [1000, 1050], [300, 300]),  # gone in phase B
        ],
        ignore_index=True,
    )
    table = energy.energy_table(
        telemetry, WINDOWS, EVENTS.iloc[2:], requests(inside("AB", 1, "A", 2000, 1000)), ["head"]
    )
    gpu_b = table[(table["arm"] == "B") & (table["domain"] == "gpu0")].iloc[0]
    for column in ("mean_w", "energy_j", "energy_above_idle_j", "j_per_token", "j_per_token_above_idle"):
        assert math.isnan(gpu_b[column]), column
    assert gpu_b["window_s"] == 100
    total_b = table[(table["arm"] == "B") & (table["host"] == "all")].iloc[0]
    assert math.isnan(total_b["mean_w"]), "a total missing a domain would read as less energy"
    package_b = table[(table["arm"] == "B") & (table["domain"] == "package-0")].iloc[0]
    assert package_b["mean_w"] == 50 and math.isnan(package_b["j_per_token"]), "no tokens known: no J/token"
    assert math.isnan(package_b["idle_w"]) and math.isnan(package_b["energy_above_idle_j"]), "no baseline"
    path = tmp_path / "energy.csv"
    table.to_csv(path, index=False)
    line = next(row for row in path.read_text().splitlines() if row.startswith("AB,1,B,head,gpu0"))
    assert line == "AB,1,B,head,gpu0,100,,,,,,,,gpu", "empty cells, not zeros"


def test_no_power_telemetry_gives_an_empty_table():
    telemetry = power("head", "package-0", [], []).assign(kind="thermal")
    table = energy.energy_table(telemetry, WINDOWS, EVENTS, TOKENS)
    assert table.empty and table.columns.tolist() == energy.ENERGY_COLUMNS
    assert energy.phase_metrics(table).empty


GH200_MODULE = "hwmon/power_meter@ACPI000D:00/Module Power Socket 0"
GH200_GRACE = "hwmon/power_meter@ACPI000D:01/Grace Power Socket 0"


def test_a_module_is_counted_once_and_every_row_names_its_scope():
    """A GH200 host: its module meter holds the GPU's and the Grace socket's readings, which
    are listed in their rows and never added to it; a GB10 host has its GPU alone."""
    times = [1000, 1050, 1099]
    telemetry = pd.concat(
        [
            power("gh", GH200_MODULE, times, [600] * 3),
            power("gh", GH200_GRACE, times, [150] * 3),
            power("gh", "gpu0", times, [420] * 3),
            power("gb10", "gpu0", times, [40] * 3),
        ],
        ignore_index=True,
    )
    table = energy.energy_table(telemetry, WINDOWS.iloc[:1], EVENTS, TOKENS, ["gh", "gb10"])
    assert energy.total_hosts(table) == {"gh": [GH200_MODULE], "gb10": ["gpu0"]}
    total = table[table["host"] == "all"].iloc[0]
    assert total["mean_w"] == 600 + 40
    assert total["scope"] == "gh: module; gb10: gpu"
    scope = table.set_index(["host", "domain"])["scope"].to_dict()
    assert scope[("gh", "gpu0")] == f"gpu in {GH200_MODULE}"
    assert scope[("gh", GH200_GRACE)] == f"cpu in {GH200_MODULE}"
    assert scope[("gh", GH200_MODULE)] == "module" and scope[("gb10", "gpu0")] == "gpu"
    assert energy.host_scopes(table) == {"gh": (["module"], ["cpu", "gpu", "memory"]), "gb10": (["gpu"], ["gpu"])}
