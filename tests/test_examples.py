"""Every shipped config validates, and the presets say what they promise."""

from pathlib import Path

import pytest

from thermab.config import cluster_spec, load

CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"
CONFIGS = sorted([*CONFIG_DIR.glob("*.yaml"), *CONFIG_DIR.glob("examples/*.yaml")])  # not profiles/


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates(path):
    config = load(path)
    for name in config["clusters"]:
        cluster = cluster_spec(config, name)
        assert cluster.head in [h.name for h in cluster.hosts]


def test_env_method_reaches_the_start_command_quoted():
    config = load(Path(__file__).resolve().parents[1] / "config/examples/single-host-venv.yaml")
    host = cluster_spec(config, "box").host("box")
    assert (
        host.command("start", {"VLLM_SPIN_S": "0.002; rm -rf /"})
        == "systemctl set-environment VLLM_SPIN_S='0.002; rm -rf /' && systemctl start vllm"
    )
