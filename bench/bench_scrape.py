"""What the controller's ``/metrics`` scrape costs (thermab.telemetry.server_metrics).

Against a simulated head started here (``--step-ms``, 20 by default; a free port) or a running server
(``--url``, with ``--server-pid`` to count its CPU), it prints:

1. **client CPU per scrape**: ``--scrapes`` scrapes back to back through
   ``Scraper.scrape`` (fetch, the prefilter to the kept lines, prometheus_client's parse,
   the CSV rows), this process's CPU time (user + system) and wall time per scrape, and
   the body's size;
2. **server CPU per scrape**: the server's process tree's CPU time (psutil) over the same
   scrapes, less that of an equal idle time without them, per scrape (where the server's
   pid is known);
3. **latency added under load**: thermab's own closed loop (the study's shape: 4 users,
   1400-token prompts, 400 output tokens, ``ignore_eos``) for ``--seconds``, with no scrape,
   the default 1 Hz, and 10 Hz, in an order that rotates from run to run so a drift in the
   machine's load favours none; per setting the mean TTFT, the mean inter-token interval
   ((t_end - t_first_token) / (tokens - 1)), the mean request latency and output tok/s, and
   each one's difference from no scrape.

    python bench/bench_scrape.py [--scrapes 200] [--seconds 20] [--runs 2] [--quick]
    python bench/bench_scrape.py --url http://127.0.0.1:8000 --server-pid PID --model M
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pandas as pd
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))  # the bench runs from a checkout, installed or not

from thermab.load import runner  # noqa: E402
from thermab.sim import node, vllm  # noqa: E402
from thermab.telemetry import server_metrics  # noqa: E402

STUDY = runner.LoadSpec(duration_s=1)  # the schema's load: 4 users, 1400-token prompts, 400 out
USERS, PROMPT_TOKENS, MAX_TOKENS = STUDY.users, STUDY.prompt_tokens, STUDY.max_tokens
SETTINGS = {"none": None, "1 Hz": 1.0, "10 Hz": 0.1}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_sim(root: Path, step_ms: int) -> tuple[str, int]:
    node.create_node(root, "head")
    port = free_port()
    subprocess.run(
        vllm.serve_command(root, port, "--model", "sim", "--role", "head", "--step-ms", step_ms),
        check=True,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "workflow")},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                sys.exit("the simulated server did not start")
            time.sleep(0.3)  # a busy wait would add its own CPU to what this bench measures
    return url, int((root / "run/vllm.pid").read_text())


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children now."""
    total = 0.0
    parent = psutil.Process(pid)
    for process in [parent, *parent.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def scrape_cost(url: str, pid: int | None, scrapes: int, directory: Path) -> None:
    scraper = server_metrics.Scraper(url, directory / "server.csv", 1.0, progress=lambda line: None)
    body = server_metrics.fetch(scraper.url, 5.0)
    scraper.stopped.set()  # its thread ends at once: the scrapes are the loop's below
    with scraper:
        server0 = tree_cpu_s(pid) if pid else 0.0
        cpu0, wall0 = time.process_time(), time.monotonic()
        for _ in range(scrapes):
            scraper.scrape()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        server = tree_cpu_s(pid) - server0 if pid else 0.0
    samples = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    print(f"/metrics body: {len(body.encode())} bytes, {samples} samples")
    print(
        f"client, per scrape: {cpu / scrapes * 1e3:.2f} ms CPU, {wall / scrapes * 1e3:.2f} ms wall "
        f"({scrapes} back to back): {cpu / scrapes * 100:.3f} % of one core at 1 Hz"
    )
    if pid:  # the server's own CPU over an idle stretch as long, its baseline
        idle0 = tree_cpu_s(pid)
        time.sleep(wall)
        idle = tree_cpu_s(pid) - idle0
        per_scrape = (server - idle) / scrapes
        print(
            f"server, per scrape: {per_scrape * 1e3:.2f} ms CPU ({server:.3f} CPU-s over the scrapes, "
            f"{idle:.3f} over as long idle): {per_scrape * 100:.3f} % of one core at 1 Hz"
        )


def load_once(url: str, model: str, seconds: int, interval_s: float | None, directory: Path) -> dict:
    spec = runner.LoadSpec(
        duration_s=seconds,
        users=USERS,
        max_tokens=MAX_TOKENS,
        prompt_tokens=PROMPT_TOKENS,
        probe=False,
        stop_timeout_s=30,
        model=model,
    )
    out = directory / "requests.parquet"
    directory.mkdir(parents=True)

    def run():
        return runner.run_load(url, out, spec, order="AB", rep=1, arm="A", progress=lambda line: None)

    if interval_s is None:
        report = run()
    else:
        with server_metrics.Scraper(url, directory / "server.csv", interval_s, progress=lambda line: None):
            report = run()
    frame = pd.read_parquet(out)
    start, end = report["window"]["start"], report["window"]["end"]
    done = frame[frame["ok"] & (frame["kind"] == "load") & (frame["t_end"] >= start) & (frame["t_end"] < end)]
    return {
        "ttft_s": (done["t_first_token"] - done["t_start"]).mean(),
        "itl_s": ((done["t_end"] - done["t_first_token"]) / (done["completion_tokens"] - 1)).mean(),
        "latency_s": (done["t_end"] - done["t_start"]).mean(),
        "tok_s": report["throughput"]["output_tok_s"],
        "requests": len(done),
    }


def load_cost(url: str, model: str, seconds: int, runs: int, directory: Path) -> None:
    names = list(SETTINGS)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for run in range(runs):
        for k in range(len(names)):
            name = names[(run + k) % len(names)]
            results[name].append(load_once(url, model, seconds, SETTINGS[name], directory / f"{run}-{k}"))
            print(
                f"  run {run + 1}, {name}: "
                + ", ".join(f"{key} {value:.4g}" for key, value in results[name][-1].items()),
                flush=True,
            )
    pooled = {name: pd.DataFrame(rows).mean() for name, rows in results.items()}
    base = pooled["none"]
    print(f"under load ({USERS} users, {PROMPT_TOKENS} in, {MAX_TOKENS} out, {seconds:g} s x {runs} runs each):")
    print("| scrape | TTFT ms | inter-token ms | request s | output tok/s |")
    print("| --- | --- | --- | --- | --- |")
    for name, row in pooled.items():
        cells = [
            f"{row[key] * scale:.{digits}f}"
            + ("" if name == "none" else f" ({(row[key] - base[key]) * scale:+.{digits}f})")
            for key, scale, digits in (("ttft_s", 1e3, 1), ("itl_s", 1e3, 2), ("latency_s", 1, 3), ("tok_s", 1, 1))
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (default: a simulated head started here)")
    parser.add_argument("--server-pid", type=int, help="the running server's pid, to count its CPU")
    parser.add_argument("--model", default="sim")
    parser.add_argument("--step-ms", type=int, default=20, help="the simulated head's decode step")
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--quick", action="store_true", help="10 scrapes and one 5-s load per setting, 5-ms steps: that it runs"
    )
    args = parser.parse_args()
    if args.quick:
        args.scrapes, args.seconds, args.runs, args.step_ms = 10, 5, 1, 5
    with tempfile.TemporaryDirectory(prefix="bench-scrape-") as tmp:
        directory = Path(tmp)
        root = directory / "head"
        if args.url:
            url, pid = args.url.rstrip("/"), args.server_pid
        else:
            url, pid = start_sim(root, args.step_ms)
        try:
            scrape_cost(url, pid, args.scrapes, directory)
            if args.seconds > 0 and args.runs > 0:
                load_cost(url, args.model, args.seconds, args.runs, directory / "load")
        finally:
            if not args.url:
                node.stop(root, "vllm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
