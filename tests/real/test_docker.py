"""Container exec and the patcher against a real Docker engine (private dockerd)."""

import hashlib

import pytest

from support.dockerd import IMAGE, start_dockerd
from thermab.config import HostSpec
from thermab.experiment import server
from thermab.experiment.patch import Patcher, PatchError
from thermab.hosts.host import Host
from thermab.hosts.transport import CommandError, NotAFile

FILE = "/usr/local/lib/python3.12/dist-packages/vllm/distributed/device_communicators/shm_broadcast.py"
STOCK = (
    "class SpinCondition:\n    def __init__(\n        self,\n        busy_loop_s: float = 1,\n    ):\n        pass\n"
)
SETTING = {"file": FILE, "anchor": r"busy_loop_s: float = [0-9.eE+-]+", "replacement": "busy_loop_s: float = {value}"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    dockerd = start_dockerd(tmp_path_factory.mktemp("docker"))
    yield dockerd
    dockerd.docker("rm", "-f", "vllm-head", check=False)
    dockerd.stop()


@pytest.fixture
def container(engine, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", engine.host)
    engine.docker("rm", "-f", "vllm-head", check=False)
    engine.docker("run", "-d", "--name", "vllm-head", "--network", "none", IMAGE, "/bin/sleep", "100000")
    engine.docker(
        "exec",
        "-i",
        "vllm-head",
        "sh",
        "-c",
        f"mkdir -p {FILE.rsplit('/', 1)[0]} && cat > {FILE}",
        input=STOCK.encode(),
    )
    spec = HostSpec(
        "spark1",
        "c",
        "local",
        {
            "container_engine": "docker",
            "container": "vllm-head",
            "server": {"stop": "docker stop -t 1 vllm-head", "start": "docker start vllm-head"},
        },
    )
    return Host(spec)


def inside(engine) -> bytes:
    return engine.docker("exec", "vllm-head", "cat", FILE).stdout


def test_patch_survives_restart_and_restores_byte_identical(engine, container, tmp_path):
    patcher = Patcher(container, SETTING, tmp_path / "state")
    patcher.apply("0.002")
    assert b"busy_loop_s: float = 0.002," in inside(engine)
    server.stop_servers([container])
    server.start_servers([container])
    assert b"busy_loop_s: float = 0.002," in inside(engine), "docker restart keeps the container's files"
    patcher.restore()
    assert hashlib.sha256(inside(engine)).hexdigest() == hashlib.sha256(STOCK.encode()).hexdigest()


def test_missing_anchor_in_the_container_writes_nothing(engine, container, tmp_path):
    engine.docker("exec", "vllm-head", "sed", "-i", "s/busy_loop_s/spin_s/", FILE)
    before = inside(engine)
    with pytest.raises(PatchError, match="spark1.*matches 0 times"):
        Patcher(container, SETTING, tmp_path / "state").apply("0.002")
    assert inside(engine) == before


def test_stopped_container_is_named(engine, container, tmp_path):
    engine.docker("stop", "-t", "1", "vllm-head")
    with pytest.raises(CommandError) as error:
        Patcher(container, SETTING, tmp_path / "state").apply("0.002")
    assert "spark1" in str(error.value) and "not running" in str(error.value)


def test_wrong_path_is_named(engine, container, tmp_path):
    setting = dict(SETTING, file="/usr/lib/python3/vllm/nope.py")
    with pytest.raises(NotAFile) as error:
        Patcher(container, setting, tmp_path / "state").apply("0.002")
    assert str(error.value) == "host spark1: /usr/lib/python3/vllm/nope.py: missing, where a regular file is needed"


@pytest.mark.parametrize("name", ["vllm-head; touch {marker}", "$(touch {marker})", "`touch {marker}`"])
def test_hostile_container_names_never_reach_a_shell(engine, container, tmp_path, name):
    marker = tmp_path / "pwned"
    spec = HostSpec("spark1", "c", "local", {"container_engine": "docker", "container": name.format(marker=marker)})
    with pytest.raises(CommandError):
        Host(spec).read_file(FILE)
    assert not marker.exists()


def test_hostile_file_path_stays_one_argument(engine, container, tmp_path):
    marker = "/tmp/pwned2"
    setting = dict(SETTING, file=f"/tmp/x'; touch {marker}; echo '")
    with pytest.raises(NotAFile):
        Patcher(container, setting, tmp_path / "state").apply("0.002")
    assert engine.docker("exec", "vllm-head", "test", "-e", marker, check=False).returncode == 1, (
        "the path was not split by the container's shell"
    )


def test_full_path_ssh_docker_exec_patch_restart_restore(engine, tmp_path):
    """ssh -> docker exec -> patch -> docker restart -> the process in the container
    starts with the new value -> restore -> byte-identical original."""
    import getpass

    from support.sshd import start_sshd
    from thermab.hosts.ssh import SshTransport

    sshd = start_sshd(tmp_path / "sshd", extra_config=f"SetEnv DOCKER_HOST={engine.host}")
    engine.docker("rm", "-f", "vllm-ssh", check=False)
    # the "server": reads the setting at start-up, as vLLM does at import, then idles
    start = f"grep -o 'busy_loop_s: float = [0-9.]*' {FILE} > /tmp/started-with 2>/dev/null; exec sleep 100000"
    engine.docker("run", "-d", "--init", "--name", "vllm-ssh", "--network", "none", IMAGE, "sh", "-c", start)
    engine.docker(
        "exec", "-i", "vllm-ssh", "sh", "-c", f"mkdir -p {FILE.rsplit('/', 1)[0]} && cat > {FILE}", input=STOCK.encode()
    )
    try:
        transport = SshTransport(
            "spark1",
            "127.0.0.1",
            port=sshd.port,
            user=getpass.getuser(),
            key_file=str(sshd.client_key),
            known_hosts=str(sshd.known_hosts),
            retries=1,
        )
        spec = HostSpec(
            "spark1",
            "c",
            "ssh",
            {
                "address": "127.0.0.1",
                "container_engine": "docker",
                "container": "vllm-ssh",
                "server": {"stop": "docker stop -t 1 vllm-ssh", "start": "docker start vllm-ssh"},
            },
        )
        host = Host(spec, transport)
        patcher = Patcher(host, SETTING, tmp_path / "state")
        patcher.apply("0.002")
        server.stop_servers([host])
        server.start_servers([host])
        seen = host.exec("cat /tmp/started-with").stdout.strip()
        assert seen == "busy_loop_s: float = 0.002", "the restarted server read the patched value"
        patcher.restore()
        original = engine.docker("exec", "vllm-ssh", "cat", FILE).stdout
        assert hashlib.sha256(original).hexdigest() == hashlib.sha256(STOCK.encode()).hexdigest()
        transport.close()
    finally:
        engine.docker("rm", "-f", "vllm-ssh", check=False)
        sshd.stop()
