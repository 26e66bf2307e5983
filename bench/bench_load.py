"""Is our closed loop as good a load as the field's reference client?

For each user count, against one fast local OpenAI-compatible server
(tests/support/openai_test_servers.py, in a process of its own), each run drives first one client
then the other (the order alternates from run to run, so a drift in the machine's load
favours neither):

- ours: thermab's Locust closed loop (``thermab.load.runner.run_load``, Locust in its own process);
- the reference: a minimal asyncio + aiohttp closed loop of the same shape (N workers, zero
  wait, streaming with ``include_usage``, like vLLM's benchmark client), also in a process
  of its own.

Per client and run it prints delivered output tok/s (DESIGN.md's definition: tokens of the
requests that end inside the load window, over the window), the time-weighted mean number
of requests in flight, and client CPU seconds per 1M output tokens, twice: inside the load
window (the steady state, what heats the node under test) and for the whole process (with
interpreter start-up, imports, spawning and the tail after the window). Then, per user count,
the runs pooled and the ratios. Targets: tok/s >= 0.99x the reference, CPU per token
(window) <= 1.0x the reference, in flight >= 3.99 of 4 and >= 63.9 of 64.

``--profile DIR`` also samples both client processes with py-spy (non-blocking, 100 Hz) and
writes their collapsed stacks to DIR (speedscope and flamegraph.pl read them) with a summary
of the top functions; py-spy takes CPU of its own, so compare clients on runs without it.

    pip install -e ".[bench]"; python bench/bench_load.py [--seconds 60] [--runs 3] [--users 4 64] [--quick]
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

# The stdlib server listens with a backlog of 5, which drops the SYNs of users connecting
# at once (1 s each to retransmit, idle slots for both clients); uvicorn, vLLM's server,
# listens with 2048.
SERVER = """
import socketserver, sys, time
socketserver.TCPServer.request_queue_size = 2048
sys.path.insert(0, {tests!r})
from support.openai_test_servers import MisbehavingServer
with MisbehavingServer("normal", token_interval_s={interval}, prefill_s=0.01) as server:
    print(server.url, flush=True)
    time.sleep({lifetime})
"""
PROMPT_TOKENS = 600
INFLIGHT_TARGET = {4: 3.99, 64: 63.9}
CPU_POLL_S = 0.005  # how often the Locust process's CPU time is read around its marks
PROFILE_RATE_HZ = 100
# Leaves where a client waits for the network or for nothing, which py-spy does not always
# tell from work: gevent's hub in libev (epoll), the idle worker of gevent's thread pool,
# asyncio's selector (epoll).
IDLE_LEAVES = ("Hub.run ", "acquire_with_timeout ", "EpollSelector.select ")


def start_server(interval: float, lifetime: float) -> tuple[subprocess.Popen, str]:
    code = SERVER.format(tests=str(REPO / "tests"), interval=interval, lifetime=lifetime)
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return process, process.stdout.readline().strip()


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def summarise(name, frame, start, end, users, cpu_window_s, cpu_total_s) -> dict:
    from thermab.load.validity import inflight

    done = frame[(frame["t_end"] >= start) & (frame["t_end"] < end) & frame["ok"]]
    window_tokens = int(done["completion_tokens"].sum())
    mean_inflight, _ = inflight(frame, start, end, users)
    return {
        "client": name,
        "window_s": end - start,
        "window_tokens": window_tokens,
        "all_tokens": int(frame.loc[frame["ok"], "completion_tokens"].sum()),
        "cpu_window_s": cpu_window_s,
        "cpu_total_s": cpu_total_s,
        "output_tok_s": window_tokens / (end - start),
        "inflight_mean": mean_inflight,
    }


class Profiler:
    """py-spy sampling one process into a collapsed-stacks file, when asked for."""

    def __init__(self, out: Path | None):
        self.out, self.process = out, None

    def attach(self, pid: int, seconds: float) -> None:
        if self.out is not None:
            self.process = subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "--pid",
                    str(pid),
                    "--nonblocking",
                    "--rate",
                    str(PROFILE_RATE_HZ),
                    "--duration",
                    str(max(1, int(seconds))),
                    "--format",
                    "raw",
                    "--output",
                    str(self.out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def finish(self) -> None:
        if self.process is not None:
            self.process.wait()
            print(top_functions(self.out))


def top_functions(path: Path, n: int = 12) -> str:
    """The functions taking most samples in a py-spy collapsed-stacks file, idle leaves left out."""
    own, inclusive, busy, idle = Counter(), Counter(), 0, 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r" \((?:[^()]*/)?([^/()]+):\d+\)$", r" (\1)", f) for f in stack.split(";") if f]
        if not frames or frames[-1].startswith(IDLE_LEAVES):
            idle += int(count)
            continue
        busy += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    lines = [f"profile {path.name}: {busy} busy samples ({idle} idle left out)", "  self   total  function"]
    lines += [f"  {100 * k / busy:4.1f}%  {100 * inclusive[f] / busy:5.1f}%  {f}" for f, k in own.most_common(n)]
    return "\n".join(lines)


class LocustCpu(threading.Thread):
    """The Locust process's CPU seconds at its load_start and load_end marks: reads its
    events file and its CPU times every CPU_POLL_S while ``run_load`` runs."""

    def __init__(self, events: Path, seconds: int, profiler: Profiler):
        super().__init__(daemon=True)
        self.events, self.seconds, self.profiler = events, seconds, profiler
        self.at = {}
        self.done = threading.Event()

    def run(self) -> None:
        import psutil

        process = None
        while not self.done.is_set() and "load_end" not in self.at:
            time.sleep(CPU_POLL_S)
            if process is None:
                process = next((p for p in psutil.Process().children() if "locust" in " ".join(p.cmdline())), None)
                continue
            try:
                times = process.cpu_times()
                marks = self.events.read_text() if self.events.exists() else ""
            except psutil.NoSuchProcess:
                return
            for mark in ("load_start", "load_end"):
                if mark not in self.at and f'"{mark}"' in marks:
                    self.at[mark] = times.user + times.system
                    if mark == "load_start":
                        self.profiler.attach(process.pid, self.seconds)

    def window_cpu_s(self) -> float:
        return self.at["load_end"] - self.at["load_start"]


def bench_locust(
    url: str, seconds: int, users: int, max_tokens: int, profile: Path | None, locustfile: Path | None
) -> dict:
    import pandas as pd

    from thermab.load.runner import LoadSpec, run_load

    profiler = Profiler(profile)
    with tempfile.TemporaryDirectory() as tmp:
        cpu = LocustCpu(Path(tmp) / "load_events.jsonl", seconds, profiler)
        cpu.start()
        before = children_cpu_s()
        spec = LoadSpec(
            duration_s=seconds, users=users, max_tokens=max_tokens, prompt_tokens=PROMPT_TOKENS, probe=False
        )
        report = run_load(
            url,
            Path(tmp) / "requests.parquet",
            spec,
            order="B",
            rep=1,
            arm="A",
            progress=lambda line: None,
            locustfile=locustfile,
        )
        total = children_cpu_s() - before
        cpu.done.set()
        cpu.join()
        frame = pd.read_parquet(Path(tmp) / "requests.parquet")
    profiler.finish()
    window = report["window"]
    return summarise(
        "thermab (Locust)",
        frame[frame["kind"] == "load"],
        window["start"],
        window["end"],
        users,
        cpu.window_cpu_s(),
        total,
    )


def bench_reference(url: str, seconds: int, users: int, max_tokens: int, profile: Path | None) -> dict:
    import pandas as pd

    profiler = Profiler(profile)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "reference.json"
        before = children_cpu_s()
        worker = subprocess.Popen(
            [sys.executable, __file__, "--reference-worker", url, str(users), str(seconds), str(max_tokens), str(out)]
        )
        profiler.attach(worker.pid, seconds)  # py-spy waits for the interpreter to come up
        if worker.wait() != 0:
            raise RuntimeError(f"the reference client exited with {worker.returncode}")
        total = children_cpu_s() - before
        result = json.loads(out.read_text())
    profiler.finish()
    return summarise(
        "reference (asyncio + aiohttp)",
        pd.DataFrame(result["records"]),
        result["start"],
        result["end"],
        users,
        result["cpu_window_s"],
        total,
    )


def reference_worker(url: str, users: int, seconds: int, max_tokens: int, out: str) -> None:
    """The reference client, in its own process: only asyncio, aiohttp and the prompt builder."""
    import asyncio

    import aiohttp

    from thermab.load.prompts import build_prompt

    records: list[dict] = []
    cpu = {}

    async def worker(user: int, session: aiohttp.ClientSession, end: float) -> None:
        sequence = 0
        while time.time() < end:
            body = {
                "model": "test-model",
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": build_prompt(f"[ref u{user} #{sequence}]", PROMPT_TOKENS)}],
            }
            sequence += 1
            t_start, usage = time.time(), None
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                async for line in response.content:
                    if line.startswith(b"data: {"):
                        chunk = json.loads(line[6:])
                        usage = chunk.get("usage") or usage
            records.append(
                {
                    "t_start": t_start,
                    "t_end": time.time(),
                    "ok": usage is not None,
                    "completion_tokens": (usage or {}).get("completion_tokens", 0),
                }
            )

    async def main(start: float) -> None:
        asyncio.get_running_loop().call_later(seconds, lambda: cpu.setdefault("end", time.process_time()))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            await asyncio.gather(*(worker(user, session, start + seconds) for user in range(users)))

    start = time.time()
    cpu["start"] = time.process_time()
    asyncio.run(main(start))
    Path(out).write_text(
        json.dumps(
            {"records": records, "start": start, "end": start + seconds, "cpu_window_s": cpu["end"] - cpu["start"]}
        )
    )


def per_1m(cpu_s: float, tokens: int) -> float:
    return cpu_s / max(tokens, 1) * 1e6


def show(row: dict) -> None:
    print(
        f"  {row['client']:<30} {row['output_tok_s']:8.1f} output tok/s   in flight {row['inflight_mean']:7.3f}"
        f"   CPU-s per 1M tokens {per_1m(row['cpu_window_s'], row['window_tokens']):6.1f} in the window, "
        f"{per_1m(row['cpu_total_s'], row['all_tokens']):6.1f} with start-up",
        flush=True,
    )


def pooled(rows: list[dict]) -> dict:
    return {
        "client": rows[0]["client"],
        "output_tok_s": sum(r["window_tokens"] for r in rows) / sum(r["window_s"] for r in rows),
        "inflight_mean": sum(r["inflight_mean"] * r["window_s"] for r in rows) / sum(r["window_s"] for r in rows),
        "inflight_min": min(r["inflight_mean"] for r in rows),
        "cpu_per_1m": per_1m(sum(r["cpu_window_s"] for r in rows), sum(r["window_tokens"] for r in rows)),
        "cpu_total_per_1m": per_1m(sum(r["cpu_total_s"] for r in rows), sum(r["all_tokens"] for r in rows)),
    }


def bench_users(args, users: int) -> None:
    server, url = start_server(args.token_interval_s, lifetime=args.runs * 2 * (args.seconds + 60) + 120)
    ours, reference = [], []
    try:
        for run in range(1, args.runs + 1):
            print(f"users {users}, run {run}:", flush=True)
            profile = {
                name: args.profile / f"{name}-{users}u-run{run}.txt" if args.profile else None
                for name in ("locust", "reference")
            }
            steps = [
                lambda profile=profile: ours.append(
                    bench_locust(url, args.seconds, users, args.max_tokens, profile["locust"], args.locustfile)
                ),
                lambda profile=profile: reference.append(
                    bench_reference(url, args.seconds, users, args.max_tokens, profile["reference"])
                ),
            ]
            for step in steps if run % 2 else steps[::-1]:
                step()
            show(ours[-1])
            show(reference[-1])
    finally:
        server.terminate()
        server.wait()
    a, b = pooled(ours), pooled(reference)
    target = INFLIGHT_TARGET.get(users)
    print(f"users {users}, {args.runs} runs pooled:")
    for row in (a, b):
        print(
            f"  {row['client']:<30} {row['output_tok_s']:8.1f} output tok/s   in flight {row['inflight_mean']:7.3f}"
            f" (lowest run {row['inflight_min']:.3f}{f', target >= {target}' if target else ''})"
            f"   CPU-s per 1M tokens {row['cpu_per_1m']:6.1f} in the window, {row['cpu_total_per_1m']:6.1f} "
            f"with start-up"
        )
    print(f"  with start-up, CPU per token ours/reference: {a['cpu_total_per_1m'] / b['cpu_total_per_1m']:.2f}")
    print(
        f"ratios ours/reference: tok/s {a['output_tok_s'] / b['output_tok_s']:.3f} (target >= 0.99), "
        f"CPU per token {a['cpu_per_1m'] / b['cpu_per_1m']:.2f} (target <= 1.0)",
        flush=True,
    )


def main() -> None:
    if sys.argv[1:2] == ["--reference-worker"]:
        url, users, seconds, max_tokens, out = sys.argv[2:7]
        reference_worker(url, int(users), int(seconds), int(max_tokens), out)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60, help="load window of each client in each run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--users", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--token-interval-s", type=float, default=0.005)
    parser.add_argument("--profile", type=Path, help="directory for py-spy profiles of both clients")
    parser.add_argument("--locustfile", type=Path, help="ours from another locustfile (default: thermab's)")
    parser.add_argument("--quick", action="store_true", help="one 3-s run at 4 users: that it runs")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.runs, args.users = 3, 1, [4]
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    print(
        f"server: {1 / args.token_interval_s:.0f} tok/s per stream, max_tokens {args.max_tokens}, prompts of "
        f"{PROMPT_TOKENS} tokens; {args.runs} runs of {args.seconds} s per client and user count",
        flush=True,
    )
    for users in args.users:
        bench_users(args, users)


if __name__ == "__main__":
    main()
