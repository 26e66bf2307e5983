"""Every shipped config validates, and the presets say what they promise."""

import pytest

from support.paths import REPO
from thermab import load_levels
from thermab.config import cluster_spec, load, view

CONFIG_DIR = REPO / "config"
CONFIGS = sorted([*CONFIG_DIR.glob("*.yaml"), *CONFIG_DIR.glob("examples/*.yaml")])  # not profiles/


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates(path):
    config = load(path)
    for name in config["clusters"]:
        cluster = cluster_spec(view(config), name)
        assert cluster.head in [h.name for h in cluster.hosts]


def test_env_method_reaches_the_start_command_quoted():
    config = load(CONFIG_DIR / "examples/single-host-venv.yaml")
    host = cluster_spec(view(config), "box").host("box")
    assert (
        host.command("start", {"VLLM_SPIN_S": "0.002; rm -rf /"})
        == "systemctl set-environment VLLM_SPIN_S='0.002; rm -rf /' && systemctl start vllm"
    )


def test_the_traffic_example_mixes_three_shapes_and_ends_each_window_with_wakeups():
    config = load(CONFIG_DIR / "examples/sim-traffic.yaml")
    every = load_levels.parse(config["load"])
    assert sorted(level.kind for level in every) == ["closed", "rate", "think"]
    assert {level.users for level in every if level.kind != "rate"} == {4}  # the study's users, two ways
    gaps = config["load"]["wakeup_gaps_s"]
    assert (gaps[0], gaps[-1]) == (0.001, 3) and config["load"]["wakeup_n"] >= 6  # a median's interval
    assert config["timings"]["idle_s"] > 0
