"""Is our closed loop as good a load as the field's reference client?

Runs, against one fast local OpenAI-compatible server (tests/openai_test_servers.py, in a
process of its own), first thermab's Locust closed loop (``thermab.load.run_load``), then a
minimal asyncio + aiohttp closed loop of the same shape (N workers, zero wait, streaming with
``include_usage``, like vLLM's benchmark client), and prints for each: delivered output
tok/s (the DESIGN.md definition), time-weighted in-flight mean, and client CPU seconds
per 1M output tokens. Targets: in-flight >= 3.99 of 4, tok/s >= 0.99x the reference,
CPU per token <= 1.0x the reference.

    pip install -e ".[bench]"; python bench/bench_load.py [--seconds 20] [--users 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from thermab.load import inflight, run_load  # noqa: E402
from thermab.prompts import build_prompt  # noqa: E402

# The stdlib server listens with a backlog of 5, which drops the SYNs of users connecting
# at once (1 s each to retransmit, idle slots for both clients); uvicorn, vLLM's server,
# listens with 2048.
SERVER = """
import socketserver, sys, time
socketserver.TCPServer.request_queue_size = 2048
sys.path.insert(0, {tests!r})
from openai_test_servers import MisbehavingServer
with MisbehavingServer("normal", token_interval_s={interval}, prefill_s=0.01) as server:
    print(server.url, flush=True)
    time.sleep({lifetime})
"""


def start_server(interval: float, lifetime: float) -> tuple[subprocess.Popen, str]:
    code = SERVER.format(tests=str(REPO / "tests"), interval=interval, lifetime=lifetime)
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return process, process.stdout.readline().strip()


def summarise(name: str, frame: pd.DataFrame, start: float, end: float, users: int, cpu_s: float) -> dict:
    done = frame[(frame["t_end"] >= start) & (frame["t_end"] < end) & frame["ok"]]
    tokens = int(done["completion_tokens"].sum())
    mean_inflight, _ = inflight(frame, start, end, users)
    return {"client": name, "output_tok_s": tokens / (end - start), "inflight_mean": mean_inflight,
            "cpu_s_per_1M_tokens": cpu_s / max(frame["completion_tokens"].sum(), 1) * 1e6}


def bench_locust(url: str, seconds: int, users: int, max_tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        report = run_load(url, Path(tmp) / "requests.parquet", order="B", rep=1, arm="A", users=users,
                          duration_s=seconds, max_tokens=max_tokens, prompt_tokens=600, probe=False,
                          progress=lambda line: None)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        frame = pd.read_parquet(Path(tmp) / "requests.parquet")
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    window = report["window"]
    return summarise("thermab (Locust)", frame[frame["kind"] == "load"], window["start"], window["end"], users, cpu_s)


async def _aiohttp_loop(url: str, seconds: int, users: int, max_tokens: int) -> tuple[list[dict], float, float]:
    import aiohttp

    records: list[dict] = []
    start = time.time()
    end = start + seconds

    async def worker(user: int, session: aiohttp.ClientSession) -> None:
        sequence = 0
        while time.time() < end:
            body = {"model": "test-model", "stream": True, "stream_options": {"include_usage": True},
                    "max_tokens": max_tokens, "ignore_eos": True,
                    "messages": [{"role": "user", "content": build_prompt(f"[ref u{user} #{sequence}]", 600)}]}
            sequence += 1
            t_start, usage = time.time(), None
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                async for line in response.content:
                    if line.startswith(b"data: {"):
                        chunk = json.loads(line[6:])
                        usage = chunk.get("usage") or usage
            records.append({"t_start": t_start, "t_end": time.time(), "ok": usage is not None,
                            "completion_tokens": (usage or {}).get("completion_tokens", 0)})

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(worker(user, session) for user in range(users)))
    return records, start, end


def bench_aiohttp(url: str, seconds: int, users: int, max_tokens: int) -> dict:
    cpu_before = time.process_time()
    records, start, end = asyncio.run(_aiohttp_loop(url, seconds, users, max_tokens))
    cpu_s = time.process_time() - cpu_before
    return summarise("reference (asyncio + aiohttp)", pd.DataFrame(records), start, end, users, cpu_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--token-interval-s", type=float, default=0.005)
    args = parser.parse_args()
    server, url = start_server(args.token_interval_s, lifetime=6 * args.seconds + 120)
    try:
        ours = bench_locust(url, args.seconds, args.users, args.max_tokens)
        reference = bench_aiohttp(url, args.seconds, args.users, args.max_tokens)
    finally:
        server.terminate()
        server.wait()
    print(f"server: {1 / args.token_interval_s:.0f} tok/s per stream, {args.users} users, {args.seconds} s each, "
          f"max_tokens {args.max_tokens}")
    for row in (ours, reference):
        print(f"{row['client']:<30} {row['output_tok_s']:8.1f} output tok/s   in flight {row['inflight_mean']:.3f}"
              f"   {row['cpu_s_per_1M_tokens']:8.1f} client CPU-s per 1M tokens")
    print(f"ratios ours/reference: tok/s {ours['output_tok_s'] / reference['output_tok_s']:.3f} (target >= 0.99), "
          f"CPU per token {ours['cpu_s_per_1M_tokens'] / reference['cpu_s_per_1M_tokens']:.2f} (target <= 1.0)")


if __name__ == "__main__":
    main()
