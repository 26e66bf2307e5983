"""Config validation: every bad value is refused before anything runs, naming its key."""

import copy
from pathlib import Path

import pytest
import yaml

from thermab.config import ConfigError, cluster_spec, validate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def raw():
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def test_default_config_is_valid_and_gets_defaults(raw):
    del raw["load"]["probe_n"]
    config = validate(raw)
    assert config["load"]["probe_n"] == 3
    assert config["clusters"]["sim"]["hosts"]["head"]["agent_dir"] == "/tmp/thermab-agent"
    assert "probe_n" not in raw["load"], "validate must not modify its input"


@pytest.mark.parametrize("change, key", [
    (lambda c: c.update(ordr="BA"), "'ordr'"),
    (lambda c: c.update(repeats=0), "'repeats'"),
    (lambda c: c.update(repeats="three"), "'repeats'"),
    (lambda c: c.update(order="AC"), "'order'"),
    (lambda c: c.update(order="ABA"), "'order'"),
    (lambda c: c["timings"].update(load_s=0), "'timings.load_s'"),
    (lambda c: c["timings"].update(baseline_s=-5), "'timings.baseline_s'"),
    (lambda c: c["load"].update(probe_at=1.2), "'load.probe_at'"),
    (lambda c: c["load"].update(users="4"), "'load.users'"),
    (lambda c: c["clusters"]["sim"].update(head="nohost"), "'clusters.sim.head'"),
    (lambda c: c["clusters"]["sim"]["hosts"]["head"].update(transport="telnet"),
     "'clusters.sim.hosts.head.transport'"),
    (lambda c: c["clusters"]["sim"]["hosts"]["head"].update(transport="ssh"),
     "'clusters.sim.hosts.head.address'"),
    (lambda c: c["setting"].update(anchor="busy_loop_s: float = ([0-9"), "'setting.anchor'"),
    (lambda c: c["setting"].update(replacement="busy_loop_s: float = 2"), "'setting.replacement'"),
    (lambda c: c["arms"]["A"].update(label="has space"), "'arms.A.label'"),
    (lambda c: c["clusters"]["sim"].update(endpoint="127.0.0.1:8000"), "'clusters.sim.endpoint'"),
    (lambda c: c.pop("order"), "'order'"),
    (lambda c: c.pop("clusters"), "'clusters'"),
    (lambda c: c.update(clusters={}), "'clusters'"),
    (lambda c: c["clusters"]["sim"].pop("hosts"), "'clusters.sim.hosts'"),
    (lambda c: c["clusters"]["sim"].update(hosts={}), "'clusters.sim.hosts'"),
    (lambda c: c["clusters"]["sim"].update(colour="red"), "'clusters.sim.colour'"),
    (lambda c: c.update(order="ab"), "'order'"),
    (lambda c: c.update(order=""), "'order'"),
    (lambda c: c.update(arms={"A": {"label": "stock", "value": "1"}}), "'arms'"),
    (lambda c: c["arms"].update(b={"label": "x", "value": "2"}), "'arms'"),
    (lambda c: c["arms"]["B"].update(value=0.002), "'arms.B.value'"),
    (lambda c: c["arms"]["B"].pop("label"), "'arms.B.label'"),
    (lambda c: c["timings"].update(cooldown_max_s=0), "'timings.cooldown_max_s'"),
    (lambda c: c["timings"].update(startup_timeout_s=-1), "'timings.startup_timeout_s'"),
    (lambda c: c["timings"].update(load_s="30m"), "'timings.load_s'"),
    (lambda c: c["load"].update(probe_at=0), "'load.probe_at'"),
    (lambda c: c["load"].update(max_tokens=0), "'load.max_tokens'"),
    (lambda c: c["load"].update(users=0), "'load.users'"),
    (lambda c: c["load"].update(extra_body="low"), "'load.extra_body'"),
    (lambda c: c["monitor"]["intervals"].update(cpu=0), "'monitor.intervals.cpu'"),
    (lambda c: c["monitor"].update(interval=5), "'monitor.interval'"),
    (lambda c: c["setting"].update(method="sed"), "'setting.method'"),
    (lambda c: c["setting"].update(file="relative/path.py"), "'setting.file'"),
    (lambda c: c["setting"].pop("anchor"), "'setting.anchor'"),
    (lambda c: c["analysis"].update(thresholds_c="85"), "'analysis.thresholds_c'"),
    (lambda c: c["clusters"]["sim"]["hosts"]["head"].pop("root"), "'clusters.sim.hosts.head.root'"),
    (lambda c: c["clusters"]["sim"]["hosts"]["head"].update(port=70000), "'clusters.sim.hosts.head.port'"),
    (lambda c: c["clusters"]["sim"]["hosts"]["head"].update(container_engine="docker"),
     "'clusters.sim.hosts.head.container'"),
    (lambda c: c["clusters"]["sim"]["hosts"]["head"].update(host_key_policy="yes"),
     "'clusters.sim.hosts.head.host_key_policy'"),
    (lambda c: c["clusters"]["sim"]["hosts"]["head"]["server"].update(restart="x"),
     "'clusters.sim.hosts.head.server.restart'"),
    (lambda c: c["clusters"]["sim"]["hosts"]["head"].update(jump="a b"), "'clusters.sim.hosts.head.jump'"),
])
def test_bad_values_name_their_key(raw, change, key):
    bad = copy.deepcopy(raw)
    change(bad)
    with pytest.raises(ConfigError) as error:
        validate(bad)
    assert key in str(error.value)


def test_simulated_hosts_count_only_their_own_processes(raw, tmp_path):
    cluster = cluster_spec(validate(raw), "sim", tmp_path)
    head = cluster.host("head")
    pattern = head.process_pattern("vllm")
    import re
    root = str(head.root)
    assert re.search(pattern, f"python -m thermab.sim.vllm serve --node {root} --role head")
    assert not re.search(pattern, f"python -m thermab.sim.vllm serve --node {root}2 --role head")
    assert not re.search(pattern, f"python -m thermab.sim.vllm serve --node {cluster.host('worker').root}")
    assert [h.name for h in cluster.hosts] == ["worker", "head"], "hosts keep the configured start order"


def test_commands_quote_paths(raw, tmp_path):
    hostile = tmp_path / "a b;touch pwned"
    raw["clusters"]["sim"]["hosts"]["head"]["root"] = str(hostile)
    command = cluster_spec(validate(raw), "sim", tmp_path).host("head").command("stop")
    assert f"'{hostile}'" in command
