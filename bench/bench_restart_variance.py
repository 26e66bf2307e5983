"""How much a restart moves the simulated server's speed: one arm, restarted again and again.

Builds a simulated head and worker node (thermab.sim.node) in a temporary directory, then
for each of ``--restarts`` starts both servers (each start draws its own acceptance and
step-time factor, thermab.sim.restart), waits ``--warmup`` s under a closed loop of
``--users`` streams of ``--max-tokens``-token requests (zero think time, the study's
load), measures ``--seconds`` s and stops the servers.  Per restart it prints the output
throughput and, from the server's /metrics (vLLM's counters), the acceptance length
(1 + Δaccepted / Δdrafts), engine steps per second and tokens per step; then the CV of each
across restarts.  Throughput is the server's generated tokens over the window
(Δ``vllm:generation_tokens_total`` / Δt), the figure the client's count approaches over a
window much longer than one request.

    python bench/bench_restart_variance.py [--restarts 8] [--users 4] [--seconds 30]
                                           [--warmup 5] [--max-tokens 400]
                                           [--no-restart-variance] [--acceptance P]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from thermab.sim import node, restart, vllm
from thermab.telemetry import server_metrics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(root: Path, port: int, *args) -> None:
    subprocess.run(vllm.serve_command(root, port, *args), check=True, capture_output=True, timeout=60)


def wait_healthy(port: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return server_metrics.parse(response.read().decode())


def closed_loop(port: int, users: int, max_tokens: int, stop: threading.Event) -> list[threading.Thread]:
    body = {"model": "sim", "max_tokens": max_tokens, "ignore_eos": True}

    def user(index: int) -> None:
        n = 0
        while not stop.is_set():
            data = json.dumps(dict(body, prompt=f"[u{index}-{n}] measure the restart " * 20)).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=data)
            with urllib.request.urlopen(request, timeout=120) as response:
                response.read()
            n += 1

    threads = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(users)]
    for thread in threads:
        thread.start()
    return threads


def one_restart(head: Path, worker: Path, args) -> dict[str, float]:
    head_port, worker_port = free_port(), free_port()
    serve(worker, worker_port, "--role", "worker", "--model", "sim")
    serve(head, head_port, "--role", "head", "--peer-port", worker_port, "--model", "sim")
    stop = threading.Event()
    try:
        wait_healthy(head_port)
        threads = closed_loop(head_port, args.users, args.max_tokens, stop)
        time.sleep(args.warmup)
        before, t0 = scrape(head_port), time.monotonic()
        time.sleep(args.seconds)
        after, t1 = scrape(head_port), time.monotonic()
        stop.set()
        for thread in threads:
            thread.join(120)
    finally:
        node.stop(head, "vllm")
        node.stop(worker, "vllm")

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    steps = delta("vllm:iteration_tokens_total_count")
    generated = delta("vllm:generation_tokens_total")
    drafts = delta("vllm:spec_decode_num_drafts_total")
    return {
        "output tok/s": generated / (t1 - t0),
        "acceptance length": 1 + delta("vllm:spec_decode_num_accepted_tokens_total") / drafts,
        "steps/s": steps / (t1 - t0),
        "tokens/step": generated / steps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=8)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--no-restart-variance", dest="restart_variance", action="store_false")
    parser.add_argument("--acceptance", help=f"set {restart.ENV_ACCEPTANCE} for the servers")
    parser.add_argument("--quick", action="store_true", help="two short restarts: that it runs")
    args = parser.parse_args()
    if args.quick:
        args.restarts, args.seconds, args.warmup = 2, 3.0, 1.0
    if args.acceptance is not None:
        os.environ[restart.ENV_ACCEPTANCE] = args.acceptance
    with tempfile.TemporaryDirectory(prefix="thermab-restarts-") as tmp:
        head, worker = Path(tmp) / "head", Path(tmp) / "worker"
        node.create_node(head, "head", restart_variance=args.restart_variance)
        node.create_node(worker, "worker", restart_variance=args.restart_variance)
        rows = []
        for index in range(args.restarts):
            rows.append(one_restart(head, worker, args))
            print(f"restart {index + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in rows[-1].items()), flush=True)
    print(
        f"{args.restarts} restarts, {args.users} users, {args.seconds:g} s measured after {args.warmup:g} s,"
        f" restart variance {'on' if args.restart_variance else 'off'}:"
    )
    for name in rows[0]:
        values = [row[name] for row in rows]
        mean, sd = statistics.mean(values), statistics.stdev(values)
        print(f"  {name}: mean {mean:.3f}, CV {100 * sd / mean:.1f} %, range {min(values):.3f}–{max(values):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
