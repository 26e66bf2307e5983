"""The embedded simulated node: tree, spin-waiting queue, server, thermal model.

Every process a test starts is stopped by pid in a finalizer.
"""

import json
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from thermab.telemetry.agent import CpuFrequency, ProcessCpu, ThermalZones, parse_stat, read_text
from thermab.sim import node, thermal, vllm
from thermab.sim.shm import ShmQueue

ANCHOR = "        busy_loop_s: float = 1,\n"
STUDY_SED = (r"busy_loop_s: float = [0-9.]*", "busy_loop_s: float = 0.002")
fork = multiprocessing.get_context("fork")


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cpu_seconds(pid):
    return parse_stat(read_text("/proc/%d/stat" % pid))[0] / os.sysconf("SC_CLK_TCK")


def node_pids(root):
    return ProcessCpu(node.process_pattern(root)).matching_pids()


def stop_process(process):
    process.terminate()
    process.join(5)


# ---- the node tree -----------------------------------------------------------------

def test_node_tree_has_the_paths_of_a_real_node(tmp_path):
    node.create_node(tmp_path, "head")
    source = (tmp_path / node.SHM_BROADCAST).read_text()
    assert source.count(ANCHOR) == 1
    assert node.read_busy_loop_s(tmp_path) == 1.0

    zones = ThermalZones(sys_root=str(tmp_path)).discover()
    assert zones["zones"] == sorted(node.ZONES)
    assert set(zones["trip_points_c"].values()) == {104.8}
    assert (tmp_path / "sys/class/thermal/thermal_zone0/device/path").read_text().strip() == "\\_TZ_.TSOC"
    assert (tmp_path / "sys/class/thermal/thermal_zone6/type").read_text().strip() == "acpitz"

    policies = CpuFrequency(sys_root=str(tmp_path)).discover()["policies"]
    assert len(policies) == 20
    assert policies["cpu5"] == policies["cpu15"] == "cpuinfo_avg_freq"
    assert policies["cpu0"] == policies["cpu10"] == "scaling_cur_freq"

    settings = node.load_settings(tmp_path)
    assert settings["role"] == "head"
    assert settings["process_pattern"] == node.process_pattern(tmp_path)


def test_create_node_keeps_a_patch_and_restores_missing_files(tmp_path):
    node.create_node(tmp_path, "worker")
    target = tmp_path / node.SHM_BROADCAST
    target.write_text(re.sub(*STUDY_SED, target.read_text()))
    (tmp_path / "sys/class/thermal/thermal_zone3/temp").unlink()

    node.create_node(tmp_path, "worker")

    assert node.read_busy_loop_s(tmp_path) == 0.002
    assert (tmp_path / "sys/class/thermal/thermal_zone3/temp").exists()
    worker_idle = node.load_settings(tmp_path)["thermal"]["zones"]["TS1P"]["ambient_c"]
    assert worker_idle < node.THERMAL_MODEL["zones"]["TS1P"]["ambient_c"]


def test_process_pattern_matches_only_its_own_node(tmp_path):
    pattern = re.compile(node.process_pattern(tmp_path / "head"))
    command = "python -m thermab.sim.vllm serve --node %s --port 1"
    assert pattern.search(command % (tmp_path / "head"))
    assert not pattern.search(command % (tmp_path / "head2"))
    assert not pattern.search("python -m thermab.sim.thermal --node %s" % (tmp_path / "head"))


# ---- the shared-memory queue -------------------------------------------------------

def echo(inbox, outbox):
    while (message := inbox.get()) is not None:
        outbox.put(message)


def test_shm_queue_round_trip_wraps_the_ring():
    inbox, outbox = ShmQueue(0.002, slots=4), ShmQueue(0.002, slots=4)
    child = fork.Process(target=echo, args=(inbox, outbox))
    child.start()
    try:
        # Twice the ring: the writer may have to wait for the reader.  At most 9 fit in
        # flight (4 in each ring, 1 held by the echo), so this cannot deadlock.
        messages = [{"step": n, "payload": "x" * 1000 * n} for n in range(8)]
        for message in messages:
            inbox.put(message)
        assert [outbox.get(timeout=5) for _ in messages] == messages
        with pytest.raises(ValueError):
            inbox.put("y" * inbox.slot_bytes)
        with pytest.raises(TimeoutError):
            outbox.get(timeout=0.05)
        inbox.put(None)
        child.join(5)
        assert child.exitcode == 0
    finally:
        stop_process(child)


def drain(inbox):
    while inbox.get() is not None:
        pass


def test_stock_reader_spins_and_patched_reader_parks():
    stock, patched = ShmQueue(busy_loop_s=1.0), ShmQueue(busy_loop_s=0.002)
    readers = [fork.Process(target=drain, args=(q,)) for q in (stock, patched)]
    for reader in readers:
        reader.start()
    try:
        before = [cpu_seconds(r.pid) for r in readers]
        for step in range(20):  # a message every 0.1 s, as a busy engine's steps (slower)
            stock.put(step)
            patched.put(step)
            time.sleep(0.1)
        stock_s, patched_s = (cpu_seconds(r.pid) - b for r, b in zip(readers, before))
        for q in (stock, patched):
            q.put(None)
    finally:
        for reader in readers:
            stop_process(reader)
    assert stock_s > 0.4, "stock reader used only %.2f s of CPU in 2 s" % stock_s
    assert stock_s > 4 * patched_s, "stock %.2f s vs patched %.2f s" % (stock_s, patched_s)


# ---- tokens and the prefix cache ---------------------------------------------------

def test_count_tokens_is_four_characters_a_token():
    assert vllm.count_tokens("") == 0
    assert vllm.count_tokens("abcd") == 1
    assert vllm.count_tokens("abcde") == 2


def test_prefix_cache_reuses_whole_blocks_and_a_leading_tag_defeats_it():
    cache = vllm.PrefixCache()
    body = "word " * 400
    first = vllm.render_chat([{"role": "user", "content": "[tag-1] " + body}])
    assert cache.cached_tokens(first) == 0
    again = cache.cached_tokens(first)
    assert again % vllm.BLOCK_TOKENS == 0
    assert vllm.count_tokens(first) - vllm.BLOCK_TOKENS <= again < vllm.count_tokens(first)
    assert cache.cached_tokens(vllm.render_chat([{"role": "user", "content": "[tag-2] " + body}])) == 0


def test_completion_length_is_deterministic_and_bounded():
    assert vllm.completion_length("p", 400, ignore_eos=True) == 400
    natural = vllm.completion_length("some prompt", 400, ignore_eos=False)
    assert 1 <= natural <= 400
    assert natural == vllm.completion_length("some prompt", 400, ignore_eos=False)


# ---- the server --------------------------------------------------------------------

def start(*args):
    subprocess.run([sys.executable, "-m", "thermab.sim.vllm", "serve", *map(str, args), "--detach"],
                   check=True, capture_output=True, timeout=30)


def wait_healthy(port, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as response:
                return response.status
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture
def cluster(tmp_path):
    """A worker node and a head node tied to it, both running."""
    head, worker = tmp_path / "head", tmp_path / "worker"
    node.create_node(head, "head")
    node.create_node(worker, "worker")
    head_port, worker_port = free_port(), free_port()
    try:
        start("--node", worker, "--port", worker_port, "--model", "sim", "--role", "worker")
        start("--node", head, "--port", head_port, "--model", "sim", "--role", "head",
              "--peer-port", worker_port, "--step-ms", 5)
        yield {"head": head, "worker": worker, "port": head_port}
    finally:
        for root in (head, worker):
            node.stop(root, "vllm")


def post(port, body):
    request = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port,
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=30)


def test_server_streams_exactly_max_tokens_with_usage_then_stops(cluster):
    port = cluster["port"]
    assert wait_healthy(port) == 200
    with urllib.request.urlopen("http://127.0.0.1:%d/v1/models" % port, timeout=5) as response:
        assert [m["id"] for m in json.load(response)["data"]] == ["sim"]

    messages = [{"role": "user", "content": "[unique-tag] Explain spin-waiting. " * 20}]
    body = {"model": "sim", "messages": messages, "max_tokens": 12, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "reasoning_effort": "low"}
    with post(port, body) as response:
        events = [line[6:].strip() for line in response.read().decode().splitlines()
                  if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == 12
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    prompt_tokens = vllm.count_tokens(vllm.render_chat(messages))
    assert chunks[-1]["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 12,
                                   "total_tokens": prompt_tokens + 12,
                                   "prompt_tokens_details": {"cached_tokens": 0}}

    with post(port, dict(body, stream=False, max_tokens=3)) as response:
        answer = json.load(response)
    assert answer["usage"]["completion_tokens"] == 3
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # same prompt again

    # Steps ran on both nodes' emulated GPUs.
    for root in (cluster["head"], cluster["worker"]):
        assert float((node.run_dir(root) / "gpu_busy_s").read_text()) > 0
    assert len(node_pids(cluster["head"])) == 3  # API server, engine core, worker

    for root in (cluster["head"], cluster["worker"]):
        assert node.stop(root, "vllm")
        assert node_pids(root) == []
        assert not node.pid_file(root, "vllm").exists()
    assert not node.stop(cluster["head"], "vllm")


def test_server_rejects_a_request_it_cannot_serve(cluster):
    wait_healthy(cluster["port"])
    with pytest.raises(urllib.error.HTTPError) as error:
        post(cluster["port"], {"model": "other", "messages": [{"role": "user", "content": "hi"}]})
    assert error.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as error:
        post(cluster["port"], {"model": "sim", "messages": []})
    assert error.value.code == 400


# ---- the thermal model -------------------------------------------------------------

def test_zones_approach_their_target_and_tsoc_reads_the_hottest(tmp_path):
    node.create_node(tmp_path, "head")
    zones = node.THERMAL_MODEL["zones"]
    temps = {name: zone["ambient_c"] for name, zone in zones.items()}
    for _ in range(200):  # the inputs this emulator measures in each arm (node.py)
        thermal.step_temps(temps, zones, cpu_cores=1.1, gpu_busy=0.83, dt=0.5)
    stock = dict(temps)
    for _ in range(200):
        thermal.step_temps(temps, zones, cpu_cores=0.2, gpu_busy=0.88, dt=0.5)
    assert stock["TS1P"] == pytest.approx(89.5, abs=0.5)  # the study's head means
    assert temps["TS1P"] == pytest.approx(80.4, abs=0.5)
    assert stock["TGPU"] - temps["TGPU"] < 1.0  # the GPU zone barely notices the spin

    shown = thermal.write_temps(tmp_path, temps, noise_c=0.0)
    assert shown["TSOC"] == max(temps.values())
    written = ThermalZones(sys_root=str(tmp_path))
    written.discover()
    assert dict((name, value) for name, value, _ in written.sample())["TSOC"] == pytest.approx(
        shown["TSOC"], abs=0.051)


def test_thermal_daemon_writes_zones_and_stops(tmp_path):
    node.create_node(tmp_path, "head")
    temp = tmp_path / "sys/class/thermal/thermal_zone1/temp"
    temp.write_text("70000\n")  # hotter than idle: the daemon must start cooling it
    command = [sys.executable, "-m", "thermab.sim.thermal", "--node", str(tmp_path), "--detach"]
    first = subprocess.run(command, check=True, capture_output=True, text=True, timeout=30).stdout
    try:
        again = subprocess.run(command, check=True, capture_output=True, text=True, timeout=30).stdout
        assert again == first  # already running: no second daemon
        deadline = time.monotonic() + 10
        while int(temp.read_text()) >= 70000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert int(temp.read_text()) < 70000
    finally:
        assert node.stop(tmp_path, "thermal")
    assert not node.pid_file(tmp_path, "thermal").exists()


def test_a_stale_pid_file_is_never_signalled(tmp_path):
    node.create_node(tmp_path, "head")
    node.pid_file(tmp_path, "vllm").write_text("%d\n" % os.getpid())  # not a node process
    assert not node.stop(tmp_path, "vllm")
    assert not node.pid_file(tmp_path, "vllm").exists()
