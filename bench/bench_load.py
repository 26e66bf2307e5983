"""Is our load as lean as the field's reference client, in every shape of load?

For each level of load, against one local OpenAI-compatible server that keeps to a schedule
(bench/paced_server.py, in a process of its own), each run drives first one client
then the other (the order alternates from run to run, so a drift in the machine's load
favours neither):

- ours: thermab's Locust load (``thermab.load.runner.run_load``, Locust in its own process);
- the reference: a minimal asyncio + aiohttp client of the same shape (streaming with
  ``include_usage``, like vLLM's benchmark client), also in a process of its own.

A level is a closed loop of N users (``64``), a think-time loop (``64:think=0.5``: each user
waits an exponential think time of that mean before its next request) or an open loop
(``64:rate=40``: Poisson arrivals at 40 requests/s, at most 64 in flight). Both clients draw
the same arrivals and think times (``thermab.load.shapes``, one seed), so they offer the server
the same load.

Per client and run it prints delivered output tok/s (DESIGN.md's definition: tokens of the
requests that end inside the load window, over the window), the time-weighted mean number
of requests in flight, client CPU seconds per 1M output tokens, twice: inside the load
window (the steady state, what heats the node under test) and for the whole process (with
interpreter start-up, imports, spawning and the tail after the window), and for a think or
open loop the client's own delay (a request's start after it was due, less any wait for a
slot: median and 99th percentile). Then, per level, the runs pooled and the ratios.
Targets: tok/s >= 0.99x the reference, CPU per token (window) <= 1.0x the reference, in a
closed loop in flight >= 3.99 of 4 and >= 63.9 of 64. The server writes token k of a request
at a fixed time after the request arrived, so while it keeps pace a closed loop's tok/s is
the client's alone (how full it keeps the slots, how fast it reads); the bench prints how
late the server wrote its tokens (99th percentile) and says so when that passed one token
interval, where tok/s is partly the server's (docs/benchmarks.md: a server that slept after
each token's work made the 64-user ratio a measure of its own share of a core).

On two or more CPUs the server runs on the first and the clients on the others (``--no-pin``
lets them share), so that a busy client does not delay the server's writes (in use the load
runs on the controller, not on the node it loads).

``--profile DIR`` also samples both client processes with py-spy (non-blocking, 100 Hz) and
writes their collapsed stacks to DIR (speedscope and flamegraph.pl read them) with a summary
of the top functions; py-spy takes CPU of its own, so compare clients on runs without it.

    pip install -e ".[bench]"
    python bench/bench_load.py [--seconds 60] [--runs 3] [--levels 4 64 64:think=0.5 64:rate=40] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from thermab.load_levels import Level  # noqa: E402  (after the path above)

PROMPT_TOKENS = 600
SHAPE_SEED = 7  # both clients draw the same arrivals and think times
INFLIGHT_TARGET = {4: 3.99, 64: 63.9}  # of a closed loop
CPU_POLL_S = 0.005  # how often the Locust process's CPU time is read around its marks
MARK_LEAD_S = 2.0  # how long before the window's end the polling resumes
PROFILE_RATE_HZ = 100
# Leaves where a client waits for the network or for nothing, which py-spy does not always
# tell from work: gevent's hub in libev (epoll), the idle worker of gevent's thread pool,
# asyncio's selector (epoll).
IDLE_LEAVES = ("Hub.run ", "acquire_with_timeout ", "EpollSelector.select ")


def parse_level(text: str) -> Level:
    """``64`` (a closed loop), ``64:think=0.5`` or ``64:rate=40`` (at most 64 in flight)."""
    users, _, shape = text.partition(":")
    key, _, value = shape.partition("=")
    if key not in ("", "think", "rate") or (key and not value):
        raise argparse.ArgumentTypeError(f"{text!r}: a level is USERS, USERS:think=SECONDS or USERS:rate=PER_S")
    try:
        return Level(
            int(users), rate=float(value) if key == "rate" else None, think_s=float(value) if key == "think" else None
        )
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from exc


class Cpus:
    """Where the server and the clients run: apart when there are two CPUs or more."""

    def __init__(self, pin: bool):
        cpus = sorted(os.sched_getaffinity(0))
        self.pinned = pin and len(cpus) >= 2
        self.server, self.clients = ({cpus[0]}, set(cpus[1:])) if self.pinned else (set(cpus), set(cpus))

    def describe(self) -> str:
        if not self.pinned:
            return "server and clients share the CPUs"
        return f"server on CPU {min(self.server)}, clients on CPU {','.join(map(str, sorted(self.clients)))}"


def start_server(interval: float, lifetime: float, cpus: Cpus) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, str(REPO / "bench" / "paced_server.py"), f"--token-interval-s={interval}"]
    process = subprocess.Popen(
        [*command, f"--lifetime={lifetime}"],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cpus.server),
    )
    return process, process.stdout.readline().strip()


def server_lag(url: str) -> dict:
    """How late the paced server wrote its tokens since it was last asked."""
    with urllib.request.urlopen(f"{url}/lag", timeout=10) as response:
        return json.load(response)


def with_server_lag(url: str, client) -> dict:
    server_lag(url)  # forgets the tokens of the client before
    row = client()
    row["server_late_p99_s"] = server_lag(url).get("p99_s", 0.0)
    return row


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def summarise(name, frame, start, end, level, cpu_window_s, cpu_total_s) -> dict:
    import numpy as np

    from thermab.load.validity import inflight

    done = frame[(frame["t_end"] >= start) & (frame["t_end"] < end) & frame["ok"]]
    window_tokens = int(done["completion_tokens"].sum())
    mean_inflight, _ = inflight(frame, start, end, level.users)
    started = frame[(frame["t_start"] >= start) & (frame["t_start"] < end)]
    delay = np.array([])
    if "t_due" in started and started["t_due"].notna().any():
        due = started.dropna(subset=["t_due"])
        delay = (due["t_start"] - due["t_due"] - due["slot_wait_s"].fillna(0.0)).to_numpy()
    return {
        "client": name,
        "window_s": end - start,
        "window_tokens": window_tokens,
        "all_tokens": int(frame.loc[frame["ok"], "completion_tokens"].sum()),
        "cpu_window_s": cpu_window_s,
        "cpu_total_s": cpu_total_s,
        "output_tok_s": window_tokens / (end - start),
        "inflight_mean": mean_inflight,
        "requests_per_s": len(started) / (end - start),
        "delays_s": delay.tolist(),
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
    events file and its CPU times every CPU_POLL_S around each mark, and sleeps between
    them (until MARK_LEAD_S before the window's end): polling all through the window would
    take time on the server's core in our client's runs only."""

    def __init__(self, events: Path, seconds: int, profiler: Profiler, cpus: Cpus):
        super().__init__(daemon=True)
        self.events, self.seconds, self.profiler, self.cpus = events, seconds, profiler, cpus
        self.at = {}
        self.done = threading.Event()

    def run(self) -> None:
        import psutil

        os.sched_setaffinity(0, self.cpus.server)  # this thread only (Linux: 0 is the caller)
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
                        self.done.wait(max(0.0, self.seconds - MARK_LEAD_S))

    def window_cpu_s(self) -> float:
        return self.at["load_end"] - self.at["load_start"]


def bench_locust(url: str, args, level: Level, profile: Path | None, cpus: Cpus) -> dict:
    import pandas as pd

    from thermab.load.runner import LoadSpec, run_load

    profiler = Profiler(profile)
    with tempfile.TemporaryDirectory() as tmp:
        cpu = LocustCpu(Path(tmp) / "load_events.jsonl", args.seconds, profiler, cpus)
        cpu.start()
        before = children_cpu_s()
        spec = LoadSpec(
            duration_s=args.seconds,
            users=level.users,
            max_tokens=args.max_tokens,
            prompt_tokens=PROMPT_TOKENS,
            probe=False,
            rate=level.rate,
            think_s=level.think_s,
            shape_seed=SHAPE_SEED,
        )
        report = run_load(
            url,
            Path(tmp) / "requests.parquet",
            spec,
            order="B",
            rep=1,
            arm="A",
            progress=lambda line: None,
            locustfile=args.locustfile,
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
        level,
        cpu.window_cpu_s(),
        total,
    )


def bench_reference(url: str, args, level: Level, profile: Path | None, cpus: Cpus) -> dict:
    import pandas as pd

    profiler = Profiler(profile)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "reference.json"
        before = children_cpu_s()
        spec = {**level.shape, "users": level.users, "seconds": args.seconds, "max_tokens": args.max_tokens}
        worker = subprocess.Popen(
            [sys.executable, __file__, "--reference-worker", url, json.dumps(spec), str(out)],
            preexec_fn=lambda: os.sched_setaffinity(0, cpus.clients),
        )
        profiler.attach(worker.pid, args.seconds)  # py-spy waits for the interpreter to come up
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
        level,
        result["cpu_window_s"],
        total,
    )


def reference_worker(url: str, spec: dict, out: str) -> None:
    """The reference client, in its own process: only asyncio, aiohttp, the prompt builder and
    the shapes' draws. A closed or think-time loop is one worker per user; an open loop is a
    dispatcher that starts each request at its arrival time, waiting for one of ``users``
    slots when all are busy."""
    import asyncio

    import aiohttp

    from thermab.load.prompts import build_prompt
    from thermab.load.shapes import arrival_stream, think_stream

    users, seconds, max_tokens = spec["users"], spec["seconds"], spec["max_tokens"]
    records: list[dict] = []
    cpu = {}

    async def request(session: aiohttp.ClientSession, tag: str, timing: dict) -> None:
        body = {
            "model": "test-model",
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": build_prompt(f"[ref {tag}]", PROMPT_TOKENS)}],
        }
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
                **timing,
            }
        )

    async def loop_user(user: int, session: aiohttp.ClientSession, end: float) -> None:
        thinks = think_stream(spec["think_s"], SHAPE_SEED, user) if spec["think_s"] else None
        timing = {}
        for sequence in itertools.count():
            if time.time() >= end:
                return
            await request(session, f"u{user} #{sequence}", timing)
            if thinks:
                think = next(thinks)
                timing = {"t_due": time.time() + think, "think_s": think, "slot_wait_s": 0.0}
                await asyncio.sleep(max(0.0, timing["t_due"] - time.time()))

    async def open_loop(session: aiohttp.ClientSession, start: float, end: float) -> None:
        slots = asyncio.Semaphore(users)
        flights = set()

        async def fly(sequence: int, timing: dict) -> None:
            try:
                await request(session, f"r #{sequence}", timing)
            finally:
                slots.release()

        for sequence, offset in enumerate(arrival_stream(spec["rate"], spec["burstiness"], SHAPE_SEED)):
            due = start + offset
            if due >= end:
                break
            await asyncio.sleep(max(0.0, due - time.time()))
            asked = time.time()
            await slots.acquire()
            task = asyncio.create_task(fly(sequence, {"t_due": due, "slot_wait_s": time.time() - asked}))
            flights.add(task)
            task.add_done_callback(flights.discard)
        await asyncio.gather(*flights)

    async def main(start: float) -> None:
        asyncio.get_running_loop().call_later(seconds, lambda: cpu.setdefault("end", time.process_time()))
        connector = aiohttp.TCPConnector(limit=users)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            if spec["rate"]:
                await open_loop(session, start, start + seconds)
            else:
                await asyncio.gather(*(loop_user(user, session, start + seconds) for user in range(1, users + 1)))

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


def delays(row: dict) -> str:
    import numpy as np

    if not row["delays_s"]:
        return ""
    median, p99 = np.percentile(row["delays_s"], [50, 99]) * 1000
    return f"   own delay median {median:.2f} ms, p99 {p99:.2f} ms (n={len(row['delays_s'])})"


def show(row: dict) -> None:
    print(
        f"  {row['client']:<30} {row['output_tok_s']:8.1f} output tok/s   {row['requests_per_s']:6.2f} req/s"
        f"   in flight {row['inflight_mean']:7.3f}"
        f"   CPU-s per 1M tokens {per_1m(row['cpu_window_s'], row['window_tokens']):6.1f} in the window, "
        f"{per_1m(row['cpu_total_s'], row['all_tokens']):6.1f} with start-up"
        f"   server late p99 {row['server_late_p99_s'] * 1000:.2f} ms" + delays(row),
        flush=True,
    )


def pooled(rows: list[dict]) -> dict:
    window_s = sum(r["window_s"] for r in rows)
    return {
        "client": rows[0]["client"],
        "window_s": window_s,
        "output_tok_s": sum(r["window_tokens"] for r in rows) / window_s,
        "requests_per_s": sum(r["requests_per_s"] * r["window_s"] for r in rows) / window_s,
        "inflight_mean": sum(r["inflight_mean"] * r["window_s"] for r in rows) / window_s,
        "inflight_min": min(r["inflight_mean"] for r in rows),
        "cpu_per_1m": per_1m(sum(r["cpu_window_s"] for r in rows), sum(r["window_tokens"] for r in rows)),
        "cpu_total_per_1m": per_1m(sum(r["cpu_total_s"] for r in rows), sum(r["all_tokens"] for r in rows)),
        "delays_s": [d for r in rows for d in r["delays_s"]],
        "server_late_p99_s": max(r["server_late_p99_s"] for r in rows),
    }


def bench_level(args, level: Level, cpus: Cpus) -> None:
    server, url = start_server(args.token_interval_s, args.runs * 2 * (args.seconds + 60) + 120, cpus)
    ours, reference = [], []
    try:
        for run in range(1, args.runs + 1):
            print(f"{level.label}, run {run}:", flush=True)
            profile = {
                name: args.profile / f"{name}-{level.slug}-run{run}.txt" if args.profile else None
                for name in ("locust", "reference")
            }
            steps = [
                lambda profile=profile: ours.append(
                    with_server_lag(url, lambda: bench_locust(url, args, level, profile["locust"], cpus))
                ),
                lambda profile=profile: reference.append(
                    with_server_lag(url, lambda: bench_reference(url, args, level, profile["reference"], cpus))
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
    target = INFLIGHT_TARGET.get(level.users) if level.kind == "closed" else None
    print(f"{level.label}, {args.runs} runs pooled:")
    for row in (a, b):
        print(
            f"  {row['client']:<30} {row['output_tok_s']:8.1f} output tok/s   {row['requests_per_s']:6.2f} req/s"
            f"   in flight {row['inflight_mean']:7.3f}"
            f" (lowest run {row['inflight_min']:.3f}{f', target >= {target}' if target else ''})"
            f"   CPU-s per 1M tokens {row['cpu_per_1m']:6.1f} in the window, {row['cpu_total_per_1m']:6.1f} "
            f"with start-up" + delays(row)
        )
    print(f"  with start-up, CPU per token ours/reference: {a['cpu_total_per_1m'] / b['cpu_total_per_1m']:.2f}")
    late = max(a["server_late_p99_s"], b["server_late_p99_s"])
    paced = late <= args.token_interval_s
    print(
        f"ratios ours/reference: tok/s {a['output_tok_s'] / b['output_tok_s']:.3f} (target >= 0.99"
        + ("" if paced else "; not the clients' alone: the server fell behind its schedule")
        + f"), CPU per token {a['cpu_per_1m'] / b['cpu_per_1m']:.2f} (target <= 1.0); "
        f"server late p99 {late * 1000:.2f} ms at worst, {'within' if paced else 'over'} one token interval",
        flush=True,
    )


def main() -> None:
    if sys.argv[1:2] == ["--reference-worker"]:
        url, spec, out = sys.argv[2:5]
        reference_worker(url, json.loads(spec), out)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60, help="load window of each client in each run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--levels",
        type=parse_level,
        nargs="+",
        default=[parse_level(text) for text in ("4", "64", "64:think=0.5", "64:rate=40")],
        help="levels of load: USERS (a closed loop), USERS:think=SECONDS, USERS:rate=PER_S (USERS the cap)",
    )
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument(
        "--token-interval-s",
        type=float,
        default=0.005,
        help="the test server's time per token",
    )
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="server and clients share the CPUs")
    parser.add_argument("--profile", type=Path, help="directory for py-spy profiles of both clients")
    parser.add_argument("--locustfile", type=Path, help="ours from another locustfile (default: thermab's)")
    parser.add_argument("--quick", action="store_true", help="one 3-s run at 4 users and a 3-s open loop: that it runs")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.runs, args.levels = 3, 1, [parse_level("4"), parse_level("4:rate=4")]
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    cpus = Cpus(args.pin)
    print(
        f"server: {1 / args.token_interval_s:.0f} tok/s per stream, max_tokens {args.max_tokens}, prompts of "
        f"{PROMPT_TOKENS} tokens; {args.runs} runs of {args.seconds} s per client and level; {cpus.describe()}",
        flush=True,
    )
    for level in args.levels:
        bench_level(args, level, cpus)


if __name__ == "__main__":
    main()
