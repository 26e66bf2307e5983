"""Config validation: every bad value is refused before anything runs, naming its key,
in one line and without a traceback."""

import copy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.command_line import snakemake_command
from support.paths import REPO as ROOT
from thermab import metric_names as names
from thermab.config import ConfigError, cluster_spec, read_file, validate, view

NAN, INF = float("nan"), float("inf")


@pytest.fixture
def raw():
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def test_default_config_is_valid_and_gets_defaults(raw):
    del raw["load"]["probe_n"]
    config = validate(raw)
    assert config["load"]["probe_n"] == 3
    assert config["clusters"]["sim"]["hosts"]["head"]["agent_dir"] == "/tmp/thermab-agent"
    assert "probe_n" not in raw["load"], "validate must not modify its input"


def test_the_probes_acceptance_length_is_a_covariate_a_config_may_name(raw):
    """A per-phase metric of variance.csv that the adjusted metrics are not, so it may stand
    beside the server's acceptance length; asked about, it is a question's, not a covariate."""
    raw["analysis"]["covariates"] = [names.ACCEPTANCE_LENGTH, names.PROBE_ACCEPTANCE_LENGTH]
    assert validate(copy.deepcopy(raw))["analysis"]["covariates"][1] == names.PROBE_ACCEPTANCE_LENGTH
    raw["questions"] = [{"metric": names.PROBE_ACCEPTANCE_LENGTH, "kind": "equivalent", "margin_pct": 2}]
    with pytest.raises(ConfigError, match=r"analysis\.covariates\.1'.*is itself a question's"):
        validate(raw)


@pytest.mark.parametrize(
    "change, key",
    [
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
        (
            lambda c: c["clusters"]["sim"]["hosts"]["head"].update(transport="telnet"),
            "'clusters.sim.hosts.head.transport'",
        ),
        (lambda c: c["clusters"]["sim"]["hosts"]["head"].update(transport="ssh"), "'clusters.sim.hosts.head.address'"),
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
        (
            lambda c: c["clusters"]["sim"]["hosts"]["head"].update(container_engine="docker"),
            "'clusters.sim.hosts.head.container'",
        ),
        (
            lambda c: c["clusters"]["sim"]["hosts"]["head"].update(host_key_policy="yes"),
            "'clusters.sim.hosts.head.host_key_policy'",
        ),
        (
            lambda c: c["clusters"]["sim"]["hosts"]["head"]["server"].update(restart="x"),
            "'clusters.sim.hosts.head.server.restart'",
        ),
        (lambda c: c["clusters"]["sim"]["hosts"]["head"].update(jump="a b"), "'clusters.sim.hosts.head.jump'"),
    ],
)
def test_bad_values_name_their_key(raw, change, key):
    bad = copy.deepcopy(raw)
    change(bad)
    with pytest.raises(ConfigError) as error:
        validate(bad)
    assert key in str(error.value)


def test_simulated_hosts_count_only_their_own_processes(raw, tmp_path):
    cluster = cluster_spec(view(validate(raw)), "sim", tmp_path)
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
    command = cluster_spec(view(validate(raw, tmp_path)), "sim", tmp_path).host("head").command("stop")
    assert f"'{hostile}'" in command


# -- the class of problem: every key, every kind of wrong value ---------------------------------


def head(c):
    return c["clusters"]["sim"]["hosts"]["head"]


def rename(mapping: dict, old: str, new) -> None:
    """Rename a key in place, keeping its position (hosts are in start order)."""
    items = [(new if k == old else k, v) for k, v in mapping.items()]
    mapping.clear()
    mapping.update(items)


def twin_on_the_same_endpoint(c):
    """A second cluster on nodes of its own whose server listens where the first's does."""
    twin = copy.deepcopy(c["clusters"]["sim"])
    for host in twin["hosts"].values():
        host["root"] = host["root"].replace("/sim/sim/", "/sim/twin/")
    twin["endpoint"] += "/v1"  # another path, the same address and port
    c["clusters"]["twin"] = twin


def env_method(c):
    c["setting"] = {"name": "VLLM_SPIN_S", "method": "env", "env_var": "VLLM_SPIN_S"}


SIM = "config key 'clusters.sim"
HEAD = "config key 'clusters.sim.hosts.head"

# (id, change, what the message names): none of these was refused before
BAD = [
    # numbers that are not finite: comparisons with NaN are all false
    ("abort-nan", lambda c: c.setdefault("safety", {}).update(abort_at_c=NAN), "'safety.abort_at_c'"),
    ("abort-inf", lambda c: c.setdefault("safety", {}).update(abort_at_c=INF), "'safety.abort_at_c'"),
    ("load-nan", lambda c: c["timings"].update(load_s=NAN), "'timings.load_s'"),
    ("cooldown-nan", lambda c: c["timings"].update(cooldown_below_c=NAN), "'timings.cooldown_below_c'"),
    ("cooldown-minus-inf", lambda c: c["timings"].update(cooldown_below_c=-INF), "'timings.cooldown_below_c'"),
    ("thermal-interval-nan", lambda c: c["monitor"]["intervals"].update(thermal=NAN), "'monitor.intervals.thermal'"),
    ("cpu-interval-inf", lambda c: c["monitor"]["intervals"].update(cpu=INF), "'monitor.intervals.cpu'"),
    ("probe-at-nan", lambda c: c["load"].update(probe_at=NAN), "'load.probe_at'"),
    ("baseline-inf", lambda c: c["timings"].update(baseline_s=INF), "'timings.baseline_s'"),
    ("threshold-nan", lambda c: c["analysis"].update(thresholds_c=[85, NAN]), "'analysis.thresholds_c.1'"),
    ("stall-gap-inf", lambda c: c["analysis"].update(stall_gap_s=INF), "'analysis.stall_gap_s'"),
    ("cap-nan", lambda c: c.setdefault("safety", {}).update(max_load_minutes=NAN), "'safety.max_load_minutes'"),
    ("extra-body-nan", lambda c: c["load"].update(extra_body={"temperature": NAN}), "'load.extra_body.temperature'"),
    ("connect-timeout-inf", lambda c: head(c).update(connect_timeout_s=INF), HEAD + ".connect_timeout_s'"),
    # integers are whole numbers written without a point; documented bounds
    ("load-below-one", lambda c: c["timings"].update(load_s=0.4), "'timings.load_s'"),
    ("load-fraction", lambda c: c["timings"].update(load_s=60.5), "'timings.load_s'"),
    ("load-above-a-day", lambda c: c["timings"].update(load_s=10**6), "'timings.load_s'"),
    ("thermal-interval-tiny", lambda c: c["monitor"]["intervals"].update(thermal=0.05), "'monitor.intervals.thermal'"),
    ("freq-interval-tiny", lambda c: c["monitor"]["intervals"].update(freq=0.01), "'monitor.intervals.freq'"),
    ("gpu-interval-huge", lambda c: c["monitor"]["intervals"].update(gpu=86400), "'monitor.intervals.gpu'"),
    ("repeats-above-max", lambda c: c.update(repeats=101), "'repeats'"),
    ("repeats-huge", lambda c: c.update(repeats=10**30), "'repeats'"),
    ("repeats-float", lambda c: c.update(repeats=2.0), "'repeats'"),
    ("repeats-1e30", lambda c: c.update(repeats=1e30), "'repeats'"),
    ("repeats-bool", lambda c: c.update(repeats=True), "'repeats'"),
    ("users-fraction", lambda c: c["load"].update(users=2.5), "'load.users'"),
    ("users-huge", lambda c: c["load"].update(users=100_000), "'load.users'"),
    ("retries-above-max", lambda c: c.update(phase_retries=11), "'phase_retries'"),
    ("retries-negative", lambda c: c.update(phase_retries=-1), "'phase_retries'"),
    ("abort-above-range", lambda c: c.setdefault("safety", {}).update(abort_at_c=200), "'safety.abort_at_c'"),
    ("abort-negative", lambda c: c.setdefault("safety", {}).update(abort_at_c=-5), "'safety.abort_at_c'"),
    ("cap-zero", lambda c: c.setdefault("safety", {}).update(max_load_minutes=0), "'safety.max_load_minutes'"),
    ("threshold-out-of-range", lambda c: c["analysis"].update(thresholds_c=[500]), "'analysis.thresholds_c.0'"),
    ("thresholds-too-many", lambda c: c["analysis"].update(thresholds_c=list(range(21))), "'analysis.thresholds_c'"),
    ("max-tokens-huge", lambda c: c["load"].update(max_tokens=10**9), "'load.max_tokens'"),
    ("probe-n-zero", lambda c: c["load"].update(probe_n=0), "'load.probe_n'"),
    ("probe-at-one", lambda c: c["load"].update(probe_at=1.0), "'load.probe_at'"),
    ("connect-timeout-zero", lambda c: head(c).update(connect_timeout_s=0), HEAD + ".connect_timeout_s'"),
    ("cooldown-above-range", lambda c: c["timings"].update(cooldown_below_c=300), "'timings.cooldown_below_c'"),
    (
        "silence-below-one",
        lambda c: c.setdefault("safety", {}).update(max_sensor_silence_s=0.5),
        "'safety.max_sensor_silence_s'",
    ),
    (
        "silence-below-two-intervals",
        lambda c: (
            c["monitor"]["intervals"].update(thermal=1),
            c.setdefault("safety", {}).update(max_sensor_silence_s=1.5),
        ),
        "'safety.max_sensor_silence_s'",
    ),
    ("port-zero", lambda c: head(c).update(port=0), HEAD + ".port'"),
    # names that become directories and session names
    ("host-dot", lambda c: rename(c["clusters"]["sim"]["hosts"], "worker", "."), SIM + ".hosts'"),
    ("host-dotdot", lambda c: rename(c["clusters"]["sim"]["hosts"], "worker", ".."), SIM + ".hosts'"),
    ("host-slash", lambda c: rename(c["clusters"]["sim"]["hosts"], "worker", "a/b"), SIM + ".hosts'"),
    ("host-dash", lambda c: rename(c["clusters"]["sim"]["hosts"], "worker", "-x"), SIM + ".hosts'"),
    ("host-long", lambda c: rename(c["clusters"]["sim"]["hosts"], "worker", "w" * 300), SIM + ".hosts'"),
    ("host-newline", lambda c: rename(c["clusters"]["sim"]["hosts"], "worker", "a\nb"), SIM + ".hosts'"),
    ("host-int-key", lambda c: rename(c["clusters"]["sim"]["hosts"], "worker", 1), SIM + ".hosts.1'"),
    ("host-bool-key", lambda c: rename(c["clusters"]["sim"]["hosts"], "worker", True), SIM + ".hosts.True'"),
    ("cluster-long", lambda c: rename(c["clusters"], "sim", "c" * 300), "'clusters'"),
    ("cluster-logs", lambda c: rename(c["clusters"], "sim", "logs"), "'clusters'"),
    ("cluster-dotdot", lambda c: rename(c["clusters"], "sim", ".."), "'clusters'"),
    ("cluster-space", lambda c: rename(c["clusters"], "sim", "a b"), "'clusters'"),
    ("label-dotdot", lambda c: c["arms"]["A"].update(label=".."), "'arms.A.label'"),
    ("label-long", lambda c: c["arms"]["A"].update(label="x" * 40), "'arms.A.label'"),
    # templates: only known placeholders, no attribute or index access, paired braces
    ("stop-shell-brace", lambda c: head(c)["server"].update(stop="echo ${HOSTNAME}"), HEAD + ".server.stop'"),
    ("stop-lone-open", lambda c: head(c)["server"].update(stop="kill {"), HEAD + ".server.stop'"),
    ("stop-lone-close", lambda c: head(c)["server"].update(stop="kill }"), HEAD + ".server.stop'"),
    ("stop-attribute", lambda c: head(c)["server"].update(stop="{python.__class__}"), HEAD + ".server.stop'"),
    ("start-index", lambda c: head(c)["server"].update(start="{root[0]}"), HEAD + ".server.start'"),
    ("start-positional", lambda c: head(c)["server"].update(start="run {0}"), HEAD + ".server.start'"),
    ("start-empty-field", lambda c: head(c)["server"].update(start="run {}"), HEAD + ".server.start'"),
    ("start-conversion", lambda c: head(c)["server"].update(start="{python!r} x"), HEAD + ".server.start'"),
    ("start-format-spec", lambda c: head(c)["server"].update(start="{root:>10}"), HEAD + ".server.start'"),
    ("start-nested-spec", lambda c: head(c)["server"].update(start="{root:{python}}"), HEAD + ".server.start'"),
    ("start-empty", lambda c: head(c)["server"].update(start=""), HEAD + ".server.start'"),
    ("root-without-root", lambda c: head(c).pop("simulated") and head(c).pop("root"), HEAD + ".server.stop'"),
    ("replacement-unknown", lambda c: c["setting"].update(replacement="x = {value} {other}"), "'setting.replacement'"),
    ("replacement-attribute", lambda c: c["setting"].update(replacement="x = {value.real}"), "'setting.replacement'"),
    ("replacement-twice", lambda c: c["setting"].update(replacement="x = {value} {value}"), "'setting.replacement'"),
    ("replacement-lone-brace", lambda c: c["setting"].update(replacement="x = {value} {"), "'setting.replacement'"),
    # regexes compile and do not match everything
    ("pattern-invalid", lambda c: c["monitor"].update(process_pattern="vllm("), "'monitor.process_pattern'"),
    ("pattern-empty", lambda c: c["monitor"].update(process_pattern=""), "'monitor.process_pattern'"),
    ("pattern-matches-all", lambda c: c["monitor"].update(process_pattern="vllm|"), "'monitor.process_pattern'"),
    ("host-pattern-invalid", lambda c: head(c).update(process_pattern="[a"), HEAD + ".process_pattern'"),
    ("anchor-empty", lambda c: c["setting"].update(anchor=""), "'setting.anchor'"),
    ("anchor-matches-all", lambda c: c["setting"].update(anchor="x*"), "'setting.anchor'"),
    ("anchor-unterminated-group", lambda c: c["setting"].update(anchor="(?P<x"), "'setting.anchor'"),
    ("anchor-misses-replacement", lambda c: c["setting"].update(anchor="busy_loop_s: int = [0-9]+"), "'arms.A.value'"),
    # endpoints: scheme, host, port
    ("endpoint-no-host", lambda c: c["clusters"]["sim"].update(endpoint="http://"), SIM + ".endpoint'"),
    ("endpoint-port-only", lambda c: c["clusters"]["sim"].update(endpoint="http://:8000"), SIM + ".endpoint'"),
    ("endpoint-ftp", lambda c: c["clusters"]["sim"].update(endpoint="ftp://h:21"), SIM + ".endpoint'"),
    ("endpoint-port-range", lambda c: c["clusters"]["sim"].update(endpoint="http://h:99999"), SIM + ".endpoint'"),
    ("endpoint-port-word", lambda c: c["clusters"]["sim"].update(endpoint="http://h:port"), SIM + ".endpoint'"),
    ("endpoint-space", lambda c: c["clusters"]["sim"].update(endpoint="http://h:1 x"), SIM + ".endpoint'"),
    ("endpoint-userinfo", lambda c: c["clusters"]["sim"].update(endpoint="http://u:p@h:1"), SIM + ".endpoint'"),
    ("endpoint-query", lambda c: c["clusters"]["sim"].update(endpoint="http://h:1/?q=1"), SIM + ".endpoint'"),
    ("endpoint-of-another-cluster", twin_on_the_same_endpoint, "config key 'clusters.twin.endpoint': 127.0.0.1:"),
    # the env method must reach the server
    ("env-without-placeholder", env_method, HEAD + ".server.start'"),
    (
        "env-without-start",
        lambda c: env_method(c) or [h.pop("server") for h in c["clusters"]["sim"]["hosts"].values()],
        SIM + ".hosts'",
    ),
    ("env-without-var", lambda c: env_method(c) or c["setting"].pop("env_var"), "'setting.env_var'"),
    # simulated nodes are built and stopped under the working directory only
    ("sim-root-slash", lambda c: head(c).update(root="/"), HEAD + ".root'"),
    ("sim-root-outside", lambda c: head(c).update(root="/tmp/elsewhere"), HEAD + ".root'"),
    ("sim-root-workdir", lambda c: head(c).update(root="."), HEAD + ".root'"),
    ("sim-root-climbs", lambda c: head(c).update(root="../outside"), HEAD + ".root'"),
    # arm values: one line, a literal of one kind, a patch the anchor finds again
    ("value-newline", lambda c: c["arms"]["B"].update(value="0.002\nimport os"), "'arms.B.value'"),
    ("value-code", lambda c: c["arms"]["B"].update(value='__import__("os").system("id") or 0.002'), "'arms.B.value'"),
    ("value-word", lambda c: c["arms"]["B"].update(value="abc"), "'arms.B.value'"),
    ("value-comment", lambda c: c["arms"]["B"].update(value="0.002 # x"), "'arms.B.value'"),
    ("value-statements", lambda c: c["arms"]["B"].update(value="1; import os"), "'arms.B.value'"),
    ("value-empty", lambda c: c["arms"]["B"].update(value=""), "'arms.B.value'"),
    ("value-long", lambda c: c["arms"]["B"].update(value="1" * 300), "'arms.B.value'"),
    (
        "values-differ-in-kind",
        lambda c: c["setting"].update(anchor="busy_loop_s: float = .+") or c["arms"]["B"].update(value="'fast'"),
        "'arms'",
    ),
    ("value-type-unknown", lambda c: c["setting"].update(value_type="code"), "'setting.value_type'"),
    ("file-newline", lambda c: c["setting"].update(file="/x\ny.py"), "'setting.file'"),
    # host fields that reach argv or paths
    (
        "container-option",
        lambda c: head(c).update(container="--privileged", container_engine="docker"),
        HEAD + ".container'",
    ),
    ("address-option", lambda c: head(c).update(address="-oProxy"), HEAD + ".address'"),
    ("user-shell", lambda c: head(c).update(user="root; rm"), HEAD + ".user'"),
    ("jump-option", lambda c: head(c).update(jump="-oProxyCommand=x"), HEAD + ".jump'"),
    ("agent-dir-root", lambda c: head(c).update(agent_dir="/"), HEAD + ".agent_dir'"),
    ("python-newline", lambda c: head(c).update(python="py\nthon"), HEAD + ".python'"),
    ("key-file-empty", lambda c: head(c).update(key_file=""), HEAD + ".key_file'"),
    # anything else YAML can carry
    ("extra-body-int-key", lambda c: c["load"].update(extra_body={1: "x"}), "'load.extra_body.1'"),
    ("model-empty", lambda c: c["load"].update(model=""), "'load.model'"),
    ("timeline-zone-newline", lambda c: c["analysis"].update(timeline_zone="a\nb"), "'analysis.timeline_zone'"),
    ("nul-in-string", lambda c: c["arms"]["A"].update(label="a\0b"), "'arms.A.label'"),
    ("too-many-values", lambda c: c["load"].update(extra_body={"x": [0] * 200_000}), "'load.extra_body.x"),
]


def test_at_least_80_new_bad_configs():
    assert len(BAD) >= 80


@pytest.mark.parametrize("change, key", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_every_bad_config_is_refused_in_one_line_naming_its_key(raw, change, key):
    bad = copy.deepcopy(raw)
    change(bad)
    with pytest.raises(ConfigError) as error:
        validate(bad, ROOT)
    message = str(error.value)
    assert key in message
    assert "\n" not in message, "one line"


def test_two_point_zero_is_refused_everywhere_an_integer_is_asked(raw):
    for path in (
        ["repeats"],
        ["phase_retries"],
        ["timings", "load_s"],
        ["load", "users"],
        ["load", "max_tokens"],
        ["load", "prompt_tokens"],
        ["load", "max_failed"],
        ["load", "probe_n"],
        ["load", "probe_tokens"],
    ):
        bad = copy.deepcopy(raw)
        target = bad
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = 2.0 if path[-1] != "prompt_tokens" else 2000.0
        with pytest.raises(ConfigError, match=f"'{'.'.join(path)}'.*not of type 'integer'"):
            validate(bad, ROOT)


def test_expression_values_are_pasted_when_the_config_says_so(raw):
    raw["setting"].update(anchor="busy_loop_s: float = [^,]+", value_type="expression")
    raw["arms"]["B"]["value"] = "min(0.002, 1)"
    assert validate(raw, ROOT)["arms"]["B"]["value"] == "min(0.002, 1)"


def test_accepted_templates_render(raw, tmp_path):
    head(raw)["server"]["stop"] = "echo $${{HOSTNAME}} {python} {root} {env}"
    spec = cluster_spec(view(validate(raw, ROOT)), "sim", tmp_path).host("head")
    assert spec.command("stop").startswith("echo $${HOSTNAME} ")


def test_the_controllers_python_is_named_so_and_its_old_name_still_works(raw, tmp_path):
    """{controller_python} is the controller's Python, whatever the host's `python` key says;
    a config written before it still says {python}, which means the same."""
    head(raw).update(python="/opt/host-only/python")
    head(raw)["server"]["stop"] = "{controller_python} -V; {python} -V"
    spec = cluster_spec(view(validate(raw, ROOT)), "sim", tmp_path).host("head")
    assert spec.command("stop") == f"{shlex.quote(sys.executable)} -V; {shlex.quote(sys.executable)} -V"


# -- whole files: what YAML would merge or misread silently ------------------------------------

DEFAULT_TEXT = (ROOT / "config" / "config.yaml").read_text()
BAD_FILES = [
    (
        "arm-twice",
        DEFAULT_TEXT.replace('  B: {label: patched, value: "0.002"}', '  A: {label: patched, value: "0.002"}'),
        "key 'A' given twice",
    ),
    ("top-level-twice", DEFAULT_TEXT + "\nrepeats: 2\n", "key 'repeats' given twice"),
    ("host-twice", DEFAULT_TEXT.replace("      head:\n", "      worker:\n"), "key 'worker' given twice"),
    ("syntax", DEFAULT_TEXT + "\nload: [\n", "not valid YAML: line"),
    ("not-a-mapping", "- order\n- AB\n", "top level must be a mapping"),
    ("tab-indent", "order: AB\n\trepeats: 1\n", "not valid YAML"),
]


@pytest.mark.parametrize("text, fragment", [case[1:] for case in BAD_FILES], ids=[case[0] for case in BAD_FILES])
def test_bad_files_are_refused_naming_the_file(tmp_path, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        read_file(path)
    assert str(path) in str(error.value) and fragment in str(error.value)


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\n")
    assert read_file(path)["other"] == {"x": 1, "y": 3}


def check_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "thermab", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


# a sample of the table, run as a user runs it
CLI_SAMPLE = [
    "abort-nan",
    "load-below-one",
    "host-dotdot",
    "stop-shell-brace",
    "pattern-invalid",
    "endpoint-no-host",
    "env-without-placeholder",
    "sim-root-slash",
    "value-code",
    "repeats-float",
]


@pytest.mark.parametrize("case", CLI_SAMPLE)
def test_check_config_answers_in_one_line_with_status_2(raw, tmp_path, case):
    change, key = next(c[1:] for c in BAD if c[0] == case)
    bad = copy.deepcopy(raw)
    change(bad)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad, sort_keys=False))
    result = check_config(path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and key in result.stderr and str(path) in result.stderr


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe\x00", DEFAULT_TEXT.encode() + b"\nrepeats: 3\n", None, "dir"],
    ids=["not-utf8", "duplicate", "missing", "directory"],
)
def test_check_config_answers_file_problems_in_one_line(tmp_path, content):
    path = tmp_path / "c.yaml"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    result = check_config(path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and str(path) in result.stderr


def test_debug_shows_the_traceback(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- not a mapping\n")
    result = subprocess.run(
        [sys.executable, "-m", "thermab", "--debug", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_nested_keys_on_the_command_line_are_typed(tmp_path):
    """`--config 'timings={load_s: 5}'`: Snakemake reads the mapping as text ('5'), which the
    schema would refuse as not an integer; the run takes the number, or names the key."""

    def dry_run(*override):
        return subprocess.run(
            snakemake_command(tmp_path, "-n", "-p", "all", "--config", *override),
            capture_output=True,
            text=True,
            timeout=300,
        )

    result = dry_run("timings={load_s: 5, baseline_s: 2.5}", "safety={abort_at_c: null}")
    assert result.returncode == 0, result.stderr[-2000:]
    result = dry_run("timings={load_s: five}")
    assert result.returncode == 2 and "config key 'timings.load_s': 'five' is not of type 'integer'" in result.stderr
    assert "Traceback" not in result.stderr
