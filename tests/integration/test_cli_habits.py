"""The command line keeps the habits of one: --help and --version exit 0, an unknown command
is named with the closest one, every command's help is whole plain text with its defaults;
check-config layers files as Snakemake does, names each problem once, checks what it can
locally, and with --hosts reaches every host changing nothing; import-chart refuses what
it does not read."""

import copy
from pathlib import Path

import pytest
import yaml

import thermab
from support.command_line import one_line_error, run_thermab
from support.paths import REPO
from support.ports import free_ports
from support.sim_runs import own_ports
from support.study_chart import CHART
from thermab.__main__ import COMMANDS


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_exits_0_and_lists_every_command(flag):
    result = run_thermab(flag)
    assert result.returncode == 0 and result.stderr == ""
    assert all(f"  {command} " in result.stdout for command in COMMANDS)


def test_version_and_no_command():
    result = run_thermab("--version")
    assert (result.returncode, result.stdout) == (0, f"thermab {thermab.__version__}\n")
    nothing = run_thermab()
    assert nothing.returncode == 2 and "usage:" in nothing.stderr


def test_an_unknown_command_is_named_with_the_closest_one():
    assert "unknown command 'anlyze'; did you mean 'analyze'?" in one_line_error(run_thermab("anlyze"))
    assert f"the commands: {', '.join(COMMANDS)} (" in one_line_error(run_thermab("xyzzy"))


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_whole_plain_help_with_defaults(command):
    result = run_thermab(command, "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert f"usage: thermab {command}" in text
    assert "``" not in text and ":func:" not in text and ":mod:" not in text
    description = text.split("\n\n", 2)[1]
    assert description.rstrip().endswith((".", ")")), description  # no sentence cut mid-way
    assert not options_without_help(text), options_without_help(text)


def options_without_help(text: str) -> list[str]:
    """The option lines of a help text with no help: none beside them, none below them."""
    lines = text.split("options:", 1)[1].split("\n\n", 1)[0].splitlines()
    bare = []
    for at, line in enumerate(lines):
        following = lines[at + 1] if at + 1 < len(lines) else ""
        helped_below = following.startswith(" " * 8) and not following.lstrip().startswith("-")
        if line.startswith("  -") and "  " not in line.strip() and not helped_below:
            bare.append(line.strip())
    return bare


def test_the_help_check_sees_an_option_without_help():
    text = "options:\n  -h, --help  show this\n  --bare BARE\n  --helped HELPED\n          its help\n"
    assert options_without_help(text) == ["--bare BARE"]


def test_the_load_shows_its_defaults():
    text = run_thermab("load", "--help").stdout
    for shown in ("tokens per response (default: 400)", "the arm letter, recorded (default: A)"):
        assert shown in " ".join(text.split()), shown


@pytest.fixture
def raw():
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_check_config_names_each_missing_key_once(tmp_path):
    line = one_line_error(run_thermab("check-config", write(tmp_path / "c.yaml", "repeats: 1\n")), "4 problems")
    assert line.count("required but missing") == 4
    for key in ("order", "setting", "arms", "clusters"):
        assert line.count(f"'{key}'") == 1


def test_check_config_layers_files_as_snakemake_does(raw, tmp_path):
    base = write(tmp_path / "base.yaml", raw)
    override = write(tmp_path / "over.yaml", {"repeats": 3, "timings": {"load_s": 30}})
    result = run_thermab("check-config", base, override)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{base} + {override}: valid (sim; order AB, 3 repeat(s))"
    # merged key by key: the override keeps the base's other timings, and a bad one is named
    bad = write(tmp_path / "bad.yaml", {"timings": {"load_s": 0}})
    one_line_error(run_thermab("check-config", base, bad), f"{base} + {bad}", "'timings.load_s'")


def test_check_config_refuses_a_shortest_window_longer_than_the_window(raw, tmp_path):
    config = write(tmp_path / "c.yaml", {**raw, "until": "decided", "timings": {"load_s": 60, "min_load_s": 400}})
    one_line_error(run_thermab("check-config", config), "'timings.min_load_s': 400 s", "'timings.load_s' = 60 s")


def ssh_config(raw: dict, tmp_path: Path, **host) -> dict:
    config = copy.deepcopy(raw)
    config["clusters"] = {
        "lab": {
            "head": "node1",
            "endpoint": "http://192.0.2.10:8000",
            "hosts": {"node1": {"transport": "ssh", "address": "192.0.2.10", "port": 2222, **host}},
        }
    }
    return config


def test_check_config_checks_key_files_and_pinned_host_keys(raw, tmp_path):
    known = write(tmp_path / "known_hosts", "")
    missing_key = ssh_config(raw, tmp_path, key_file=str(tmp_path / "no-key"), known_hosts=str(known))
    line = one_line_error(run_thermab("check-config", write(tmp_path / "a.yaml", missing_key)), "2 problems")
    assert f"'clusters.lab.hosts.node1.key_file': {tmp_path / 'no-key'} does not exist" in line
    assert "no known_hosts entry for [192.0.2.10]:2222" in line and "ssh-keyscan -p 2222 192.0.2.10" in line
    key = write(tmp_path / "id_ed25519", "a key\n")
    key_type, blob = "ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    write(known, f"[192.0.2.10]:2222 {key_type} {blob}\n")
    pinned = ssh_config(raw, tmp_path, key_file=str(key), known_hosts=str(known))
    result = run_thermab("check-config", write(tmp_path / "b.yaml", pinned))
    assert result.returncode == 0, result.stderr
    accept_new = ssh_config(raw, tmp_path, known_hosts=str(tmp_path / "empty"), host_key_policy="accept-new")
    assert run_thermab("check-config", write(tmp_path / "c.yaml", accept_new)).returncode == 0


def test_check_config_hosts_reaches_the_simulated_cluster_changing_nothing(tmp_path):
    # the default cluster on a port of its own: a run of the default config elsewhere in the
    # suite may be serving the default's
    port, worker_port = free_ports(2)
    ports = write(tmp_path / "ports.yaml", {"clusters": own_ports(port, worker_port)})
    result = run_thermab("check-config", REPO / "config" / "config.yaml", ports, "--hosts", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for host in ("head", "worker"):
        assert f"preflight {host}: ok" in out and f"{host}: reached" in out and f"{host}: power: rapl:" in out
    assert "thermal interlock: load stops at" in out and f"endpoint http://127.0.0.1:{port}: does not answer now" in out
    assert out.rstrip().endswith("every host is fit for a run")
    assert not (tmp_path / "results").exists(), "a check writes no run directory"


def test_import_chart_refuses_what_it_does_not_read(tmp_path):
    notes = write(tmp_path / "notes.md", "t,TSOC\n0,50\n")
    one_line_error(run_thermab("import-chart", notes, tmp_path / "out"), str(notes), "chart JSON, .json", ".csv")
    line = one_line_error(run_thermab("import-chart", CHART, tmp_path / "out", "--arm", "stok=1"), "--arm stok")
    assert line.endswith("no arm of that name in its marks (its arms: stock, patched)")
    assert not (tmp_path / "out").exists()


def test_run_answers_what_snakemake_would_answer_with_a_traceback(tmp_path):
    missing = tmp_path / "missing.yaml"
    one_line_error(run_thermab("run", "--cores", "1", "--configfile", missing), f"{missing}: cannot read")
    broken = write(tmp_path / "broken.yaml", "order: AB\nrepeats: [1\n")
    one_line_error(run_thermab("run", "--configfile", broken, "--cores", "1"), f"{broken}: not valid YAML: line 3")
    dotted = one_line_error(run_thermab("run", "--cores", "1", "--config", "load.users=four", "order=BA"))
    assert dotted.endswith(
        "--config load.users=four: a nested key is given as a mapping: --config 'load={users: four}'"
    )
    both = one_line_error(run_thermab("run", f"--configfile={missing}", "--config", "a.b.c=1", "x y=2"), "3 problems")
    assert "--config 'a={b: {c: 1}}'" in both and "'x y' is not a config key" in both


def test_run_is_snakemake_with_the_checkouts_snakefile(tmp_path):
    assert run_thermab("run", "--help").returncode == 0
    result = run_thermab("run", "-n", "--cores", "1", "--config", "repeats=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rep2-B" in result.stdout + result.stderr  # the dry run's jobs, with the override
