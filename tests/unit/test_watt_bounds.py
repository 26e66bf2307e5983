"""One plausibility bound per scope for every watt (``agent.watt_bound``): the agent's
readings and the watts ingest derives from energy counters alike.  A counter read wrong once
(2^64 − 1), ACPI's unknown, a rail of negative volts × negative amps: none is power."""

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from support import power_trees
from thermab.telemetry import agent, power

MAX_U64 = 2**64 - 1
RAPL_WRAP = 262143328850


def test_a_counter_read_as_2_64_once_skips_its_two_intervals_and_keeps_the_rest():
    t = np.arange(5.0)
    raw = np.array([0, 100e6, MAX_U64, 300e6, 400e6])  # µJ: 100 W, then the fault, then 100 W
    middle, watts, skipped = power.counter_power(t, raw, 1e-6, RAPL_WRAP, agent.watt_bound("package-0"))
    assert middle.tolist() == [0.5, 3.5] and watts.tolist() == [100.0, 100.0] and skipped == 2
    # NVML's counter (mJ, no range) of a GPU: the same
    middle, watts, skipped = power.counter_power(t, raw / 1e3, 1e-3, None, agent.watt_bound("gpu0"))
    assert watts.tolist() == [100.0, 100.0] and skipped == 2


def test_counters_and_readings_beyond_the_bound_reach_no_table_and_are_counted():
    acpi_unknown = power_trees.ACPI_UNKNOWN_UW
    module = "hwmon/power_meter@ACPI000D:00/Module Power Socket 0"
    frame = pd.DataFrame(
        {
            "t": [0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0],
            "host": "h",
            "kind": "power",
            "sensor": [f"{module} uJ"] * 4 + ["gpu0 W"] * 3,
            "value": [1e9, 1.5e9, acpi_unknown, acpi_unknown + 5e8, 300.0, 1.8e16, -4.0],
        }
    )
    rows, notes = power.power_rows(frame)
    assert rows[rows["sensor"] == module]["value"].tolist() == [500.0, 500.0]
    assert rows[rows["sensor"] == "gpu0"]["value"].tolist() == [300.0]
    assert notes == {
        f"h/power: {module} counter went back (reset) or implied watts outside 0-5000 W, interval skipped": 1,
        "h/power: gpu0 W readings outside 0-2000 W, not used": 2,
    }


@settings(max_examples=60, deadline=None)
@given(
    raw=st.lists(
        st.one_of(st.integers(0, MAX_U64), st.just(MAX_U64), st.just(power_trees.ACPI_UNKNOWN_UW)), max_size=8
    ),
    wrap=st.sampled_from([None, RAPL_WRAP, 2**32 - 1]),
    domain=st.sampled_from(["package-0", "gpu0", "node", "dram-0", "hwmon/ina3221@1-0040/VDD_IN"]),
)
def test_any_counter_gives_only_watts_within_its_domains_bound(raw, wrap, domain):
    t = np.arange(float(len(raw)))
    _middle, watts, skipped = power.counter_power(t, np.array(raw, float), 1e-6, wrap, agent.watt_bound(domain))
    assert ((watts >= 0) & (watts <= agent.watt_bound(domain))).all()
    assert len(watts) + skipped == max(len(raw) - 1, 0)


def test_acpis_unknown_counter_and_a_rail_below_zero_volts_are_missing(tmp_path):
    chip = power_trees.ina3221(tmp_path, 0, "1-0040", {1: ("VDD_GPU_SOC", -5000, -2000), 2: ("VDD_CPU_CV", 5000, -100)})
    (chip / "energy1_input").write_text(f"{power_trees.ACPI_UNKNOWN_UW}\n")
    source = agent.HwmonPower(str(tmp_path))
    source.discover()
    rows = {sensor.split("/")[-1]: (value, reason) for sensor, value, reason in source.sample()}
    assert rows["VDD_GPU_SOC W"] == (None, "implausible: a rail at -5000 mV"), "not +10 W"
    assert rows["VDD_CPU_CV W"][0] is None and "implausible for a rail domain: -0.5 W" in rows["VDD_CPU_CV W"][1]
    assert rows["energy1 uJ"] == (None, "no reading: 0xFFFFFFFF (ACPI's unknown)")
    assert agent.parse_dcmi_power("Instantaneous power reading: 99999 Watts\n")[0][1] is None
