"""An OpenAI-compatible server that behaves like vLLM where heat and CPU are concerned.

::

    python -m thermab.sim.vllm serve --node ROOT --port P --model NAME --role head|worker
                                     [--peer-port Q] [--step-ms 40] [--host H] [--detach]
    python -m thermab.sim.vllm stop --node ROOT

ROOT is a node tree made by :func:`thermab.sim.node.create_node` (an absolute path).
``--detach`` starts the server in a new session logging to ROOT/run/vllm.log, writes
ROOT/run/vllm.pid and returns once the server has passed its checks (its settings, the
node's patched file, ``THERMAB_SIM_DRAFT_ACCEPTANCE``), printing its pid; a server that
ended before that is exit status 1 with its log's last line.  Poll ``/health`` for readiness.  ``stop`` sends
SIGTERM to that session, waits, then SIGKILL; it exits 0 when nothing was running.

A head node is three processes, all forked from the API server so all carry its command
line (``vllm`` and ``--node ROOT``, which is how the agent and the thermal model find a
node's processes):

- API server: ``GET /health``, ``/v1/models``, ``/version``, ``/metrics`` (vLLM's metric
  names in Prometheus text, :mod:`thermab.sim.prometheus`), ``POST /v1/chat/completions`` and
  ``/v1/completions`` (text or token-id prompt; streaming SSE or not; ``max_tokens``,
  ``ignore_eos``, ``stream_options.include_usage``; unknown keys such as
  ``reasoning_effort`` are accepted and ignored), ``/tokenize`` and ``/detokenize``
  (which ``vllm bench serve`` asks to check its tokenizer against the server's).  A POST's body is
  read whatever its path,
  so a 404 leaves the keep-alive connection ready for the next request.
- EngineCore: continuous batching.  Each step takes ``--step-ms`` of GPU time, plus 0.05 ms
  per uncached prompt token of newly admitted requests, and yields every running request
  one token plus the drafted tokens it accepts (speculative decoding with a 5-token MTP
  drafter, as in the study: 2.4 tokens a step on average, the first step of a request
  one), so the four streams of a closed loop drift apart.  Each start draws the drafter's
  acceptance per position and a factor on the step time (:mod:`thermab.sim.restart`,
  restart variance, on unless the node's sim.json turns ``restart_variance`` off;
  ``THERMAB_SIM_DRAFT_ACCEPTANCE`` in the environment sets the acceptance instead).  The engine broadcasts a step
  to the local worker as two messages through a :class:`~thermab.sim.shm.ShmQueue`,
  ``execute`` then ``sample`` (vLLM's execute_model and sample_tokens), 1-6 ms apart
  when the batch changed (the sampler's state is rebuilt), and waits for the reply on a
  second queue.  Both readers spin for ``busy_loop_s`` after each read, the value read at
  start-up from the node's own ``shm_broadcast.py``.  ``--seed`` fixes the engine's
  draws, as vLLM's ``--seed`` fixes its sampling: the rebuild times, and each request's
  accepted drafts, a stream of its own that the n-th request of a length gets in every run,
  so two arms under the same load accept the same drafts (``Engine.request_draws``).
- VllmWorker: reads a step's two messages, launches it on the emulated GPU (a thread that
  sleeps the step's duration, then replies) and returns to the queue at once.  With stock
  vLLM's 1 s, the engine's and the worker's readers both spin for as long as the GPU is
  busy: two GB10 cores.  With 2 ms both park during each 40-ms step and pay a wake-up
  (``shm.WAKE_LATENCY_S``) on the next: the step's host path is the worker's launch
  (``LAUNCH_S_PER_STEP``) plus the wake-ups its readers paid, and the GPU idles for what
  the batch does not hide of it (``OVERLAP_S_PER_REQUEST`` a running request,
  :func:`exposed_host_s`): one stream's decode is ~4 % slower, three or more streams hide
  it all.

CPU is accounted in GB10 cores, per thread, not burnt (:mod:`thermab.sim.cpu`): each
reader busy from a read until it parks (``busy_loop_s`` later, unless the next message
came first); ``LAUNCH_S_PER_STEP`` and ``API_S_PER_TOKEN`` of host work; and
``GPU_WAIT_THREADS``, the threads that poll while the GPU runs (CUDA stream sync, NCCL
proxies, output copy), a share of a core each for every second the node's GPU is busy.  With
``lost_wakeup`` in the node's sim.json a
notification sent while the previous one is still queued is dropped (:mod:`thermab.sim.shm`):
with ``busy_loop_s`` 0.002 the worker parks again 2 ms after it read a step's ``execute``,
often before the ``sample`` of a batch change comes, misses it about one time in ten
(:func:`batch_change_stall_probability`), and the whole engine waits for the 5-s re-check;
spins of 5 ms or longer outlast every rebuild and never stall.

With ``--peer-port`` the engine also sends every step over TCP to a worker node on
127.0.0.1 and waits for its reply (blocking, no spin), as tensor parallelism across two
nodes does; start the worker node first (the head retries for 60 s and reports /health
only once connected).  A worker node is one process that runs the head's steps on its
emulated GPU and accounts its own GPU-waiting threads.

Tokens: counted by the tests' tiny Llama's tokenizer, shipped beside this module
(:mod:`thermab.sim.tokens`), so a client given that tokenizer counts what the server
counts.  The chat is rendered in that model's template first, so the prompt's token count
includes a few template tokens; each streamed token is one word that re-encodes to one
token.  Prefix cache: a
prompt reuses the 16-token blocks of the longest prompt prefix seen before (whole blocks,
never the last token), reported as ``cached_tokens``; a unique tag at the very start of
each prompt therefore gives 0.  Without ``ignore_eos`` a request stops at a length fixed
by the prompt (crc32, at most 512 tokens and at most ``max_tokens``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import queue
import random
import signal
import socket
import sys
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from thermab.sim import node, restart, tokens
from thermab.sim.cpu import Account, Thread
from thermab.sim.prometheus import CONTENT_TYPE, ServerMetrics
from thermab.sim.shm import ShmQueue, stall_probability

MODULE = "thermab.sim.vllm"  # what python -m runs
BLOCK_TOKENS = 16
MAX_MODEL_LEN = 8192
VLLM_VERSION = "0.32.0+thermab.sim"  # the vLLM whose API and metrics this server speaks
KV_CACHE_BLOCKS = 32768  # 512k tokens of KV cache: a GB10's memory after the weights
NATURAL_MAX_TOKENS = 512
PREFILL_S_PER_TOKEN = 0.05e-3
SAMPLER_REBUILD_S = (0.001, 0.006)  # host time to rebuild the sampling state when the batch changed (uniform)
# What of a step's host path (the worker's launch and the wake-ups its readers paid) the GPU
# hides: vLLM's async scheduling prepares the next step while the GPU still runs the batch's
# per-request work (sampling, MTP drafting, output copy), this long for each request.
# Calibrated with shm.WAKE_LATENCY_S to the study (docs/simulation.md).
OVERLAP_S_PER_REQUEST = 0.0009
HOST_LAG_S = 0.5  # host lags up to this long are this machine's: the GPU's schedule goes on (Gpu)
# GB10 CPU time the node's threads account (thermab.sim.cpu), chosen so that the nodes read
# what the study measured: a worker node ~208 % (its GPU-waiting threads), the patched head
# ~212 % (the same, plus the readers busy 2 ms after each read and the API server), the
# stock head ~400 % (the engine's and the worker's readers never park under load).  The
# readers' own host work falls inside their busy windows (thermab.sim.shm).
GPU_WAIT_THREADS = {"cuda-sync": 0.6, "nccl-proxy-0": 0.55, "nccl-proxy-1": 0.5, "async-output": 0.35}
LAUNCH_S_PER_STEP = 0.0005  # the worker node's main thread: receive and launch a step
API_S_PER_TOKEN = 0.0001  # detokenize and stream
PEER_HOST = "127.0.0.1"
PEER_CONNECT_TIMEOUT_S = 60.0
STATS_EVERY_S = 10.0
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15


def log(message: str) -> None:
    print("INFO %s [pid %d] %s" % (time.strftime("%m-%d %H:%M:%S"), os.getpid(), message), flush=True)


# ---- tokens, prompts, prefix cache -------------------------------------------------


def completion_length(prompt_ids: list, max_tokens: int, ignore_eos: bool) -> int:
    """Exactly max_tokens with ignore_eos; otherwise an end-of-sequence fixed by the
    prompt, so the same request always gets the same answer length."""
    if ignore_eos:
        return max_tokens
    return min(max_tokens, 1 + zlib.crc32(repr(prompt_ids).encode()) % NATURAL_MAX_TOKENS)


class PrefixCache:
    """vLLM's automatic prefix caching as far as ``usage`` shows it: chained hashes of
    16-token blocks, least recently used evicted first."""

    def __init__(self, capacity_blocks: int = 200_000):
        self.blocks = OrderedDict()
        self.capacity = capacity_blocks
        self.lock = threading.Lock()

    def cached_tokens(self, prompt_ids: list) -> int:
        """Tokens reused from earlier prompts; records this prompt's blocks."""
        tokens = len(prompt_ids)
        hashes, chained = [], 0
        for index in range(tokens // BLOCK_TOKENS):
            chained = hash((chained, tuple(prompt_ids[index * BLOCK_TOKENS : (index + 1) * BLOCK_TOKENS])))
            hashes.append(chained)
        with self.lock:
            hits = 0
            while hits < len(hashes) and hashes[hits] in self.blocks:
                hits += 1
            for block in hashes:
                self.blocks[block] = None
                self.blocks.move_to_end(block)
            while len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)
        # The last prompt token is always computed: it is what samples the first output.
        return min(hits, (tokens - 1) // BLOCK_TOKENS) * BLOCK_TOKENS


# ---- GPU, worker, engine -----------------------------------------------------------


def become_child(name: str) -> None:
    """Set up a forked node process: a name for top/ps, and death with the API server,
    so a SIGKILLed server never leaves an engine spinning."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the API server's to handle
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_NAME, name.encode(), 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != multiprocessing.parent_process().pid:
        os._exit(1)  # the parent died before the death signal was armed


class Gpu:
    """The emulated GPU of a node.  A step takes its duration in wall time and no CPU here.
    While the batch runs on, a step is due one step time after the previous one was due
    (plus the host path the batch does not hide), and ends then, or, if this machine
    launched it later than that, the exposed host path after its launch: vLLM schedules the
    next step while the GPU runs the current one, so host work hides behind the GPU's.  A
    host that lags up to ``HOST_LAG_S`` behind the schedule is this loaded machine, not a
    GB10, whose GPU would have stayed busy on time: the schedule goes on, and the steps
    after the lag end that soon after their launch until they are due again, so this
    machine's load moves neither the cadence nor the GPU's busy share (only a host slower
    than the step on average sets the cadence), and the exposed host path is paid in every
    step, lag or not: a lag is caught up by the same steps whatever the spin, never by
    leaving out a wake-up.  A longer gap (a stream waiting out a lost wake-up) is the GPU
    idling, and the schedule starts again from the launch.  Busy time adds up in
    run/gpu_busy_s, which the thermal model differentiates, and keeps the node's
    GPU-waiting threads busy (``GPU_WAIT_THREADS``, accounted in GB10 cores)."""

    def __init__(self, root: Path, account: Account):
        self.path = node.run_dir(root) / "gpu_busy_s"
        try:
            self.busy_s = float(self.path.read_text())
        except (OSError, ValueError):
            self.busy_s = 0.0
        self.waiters = [(account.thread(name), share) for name, share in GPU_WAIT_THREADS.items()]
        self.finished_at = None  # when the last step ended here
        self.due_at = None  # when it was due on the GB10's schedule

    def run(self, step: dict, launched_at: float, host_s: float = 0.0) -> None:
        """Run ``step`` launched at ``launched_at`` (time.monotonic); return when it is done.
        ``host_s`` is the step's GB10 host path; what the batch does not hide of it
        (:func:`exposed_host_s`) the GPU idles before the step, while the batch runs on."""
        if step["ran_on"] and self.due_at is not None:
            finished_at, due_at, busy = scheduled_step(
                self.due_at,
                self.finished_at,
                launched_at,
                step["duration_s"],
                exposed_host_s(host_s, step.get("requests", 0)),
            )
        else:
            finished_at = due_at = launched_at + step["duration_s"]
            busy = step["duration_s"]
        self.finished_at, self.due_at = finished_at, due_at
        time.sleep(max(0.0, finished_at - time.monotonic()))
        self.busy_s += busy
        node.write_atomic(self.path, "%.6f\n" % self.busy_s)
        for thread, share in self.waiters:
            thread.add(share * busy)


def scheduled_step(
    due_at: float, finished_at: float, launched_at: float, duration_s: float, exposed_s: float
) -> tuple[float, float, float]:
    """(when it ends, when it was due, GPU busy seconds) of a step of a batch that runs on,
    the previous step due at ``due_at`` and ended at ``finished_at``: due one step (plus the
    exposed host path) after the previous one was due, it ends then or the exposed host
    path after its launch if that was later.  Up to ``HOST_LAG_S`` late the schedule goes
    on, so the steps after a lag catch up; later, the GPU idled and the schedule starts
    again from the launch.

    A lag is this machine's, the same in every arm; the exposed host path is the model's.
    Both add: a step's lateness is the previous one's plus its launch's delay less the step
    time, whatever ``exposed_s`` is, so a lag never hides the wake-ups a short spin pays
    (with the launch alone, a lag would swallow up to ``exposed_s`` a step, shrinking the
    cost in the arm that pays it the more this machine is loaded).  The GPU idles for the
    exposed path after the previous step's end (which is never before it was due); a lag
    before that idle counts as busy."""
    due = due_at + exposed_s + duration_s
    finished = max(due, launched_at + exposed_s)
    if finished - due <= HOST_LAG_S:
        return finished, due, max(0.0, finished - finished_at - exposed_s)
    return finished, finished, duration_s


def exposed_host_s(host_s: float, requests: int) -> float:
    """The part of a step's host path that the GPU waits for: what the batch's per-request
    work (``OVERLAP_S_PER_REQUEST`` each) does not cover.  One stream hides little of the
    wake-ups a short spin pays; four hide them all."""
    return max(0.0, host_s - OVERLAP_S_PER_REQUEST * requests)


def batch_change_stall_probability(busy_loop_s: float) -> float:
    """With ``lost_wakeup``: the chance that a batch change stalls the engine until the
    re-check, the worker missing the step's ``sample`` (:func:`thermab.sim.shm.stall_probability`
    over the sampler's rebuild time)."""
    return stall_probability(busy_loop_s, SAMPLER_REBUILD_S)


def run_gpu(gpu: Gpu, launched: queue.Queue, replies: ShmQueue) -> None:
    """The local worker's GPU stream: runs each launched step, then replies (the step's
    sampling request has come by then)."""
    while True:
        step, launched_at, host_s = launched.get()
        gpu.run(step, launched_at, host_s)
        replies.put({"step": step["step"], "due_at": gpu.due_at})


def run_local_worker(root: Path, broadcast: ShmQueue, replies: ShmQueue) -> None:
    """The head's worker: its main thread reads a step's two messages (execute, then
    sample), launches the step on the GPU and goes straight back to the queue, so it
    waits there (spinning, with a long busy_loop_s) while the GPU runs."""
    become_child("VllmWorker")
    account = Account(root)
    main = account.thread("VllmWorker")
    gpu = Gpu(root, account)
    account.start()
    broadcast.spin_meter = main
    launched = queue.Queue()
    threading.Thread(target=run_gpu, args=(gpu, launched, replies), name="gpu", daemon=True).start()
    while True:
        step = broadcast.get()
        launched_at = time.monotonic()
        host_s = step["host_s"] + broadcast.wake_s + LAUNCH_S_PER_STEP
        broadcast.get()  # the step's sampling request
        launched.put((step, launched_at, host_s + broadcast.wake_s))


def connect_peer(port: int) -> socket.socket:
    deadline = time.monotonic() + PEER_CONNECT_TIMEOUT_S
    while True:
        try:
            peer = socket.create_connection((PEER_HOST, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    peer.settimeout(None)
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return peer


def accepted_tokens(rng: random.Random, acceptance=restart.FIXED.acceptance) -> int:
    """Tokens one decode step yields for a request: one, plus the drafted tokens accepted
    in a row (speculative decoding with an MTP drafter, as the study ran), position k
    accepted with ``acceptance[k]`` while the ones before it were."""
    tokens = 1
    while tokens <= len(acceptance) and rng.random() < acceptance[tokens - 1]:
        tokens += 1
    return tokens


class Engine:
    """Continuous batching over requests sent by the API server on ``conn``:
    ("add", rid, uncached_prompt_tokens, completion_tokens, prompt_tokens) or ("abort", rid).
    After each step it sends back ([(rid, tokens_emitted, finished), ...], state), where
    state is the scheduler's view after the step, as vLLM's SchedulerStats give it to the
    metrics: requests running and waiting, the share of KV-cache blocks in use, and the
    step's own figures (``iteration``: its tokens, the drafts made and accepted per
    position, and ``due_at``, when it ended on the head GPU's schedule, :class:`Gpu`).
    ``start``: this start's draw (:mod:`thermab.sim.restart`), the drafter's acceptance
    and the factor on the step time."""

    def __init__(
        self, conn, broadcast: ShmQueue, replies: ShmQueue, step_s: float, peer, seed=None, start=restart.FIXED
    ):
        self.conn = conn
        self.start = start
        self.broadcast = broadcast
        self.replies = replies
        self.step_s = step_s
        self.peer = peer
        self.peer_lines = peer.makefile("rb") if peer else None
        self.seed = seed
        self.rng = random.Random(seed)  # the rebuild times
        self.draws = {}  # rid -> the drafter's draws for that request (request_draws)
        self.admitted = {}  # completion length -> requests of that length admitted so far
        self.waiting = {}  # rid -> (uncached prompt tokens, completion tokens, prompt tokens)
        self.running = {}  # rid -> [completion tokens, emitted, prompt tokens]
        self.batch_changed = False  # a request finished or left since the last step
        self.steps = 0
        self.stats = {"since": time.monotonic(), "tokens": 0, "steps": 0}

    def run(self) -> None:
        while True:
            self.receive(block=not (self.running or self.waiting))
            if self.running or self.waiting:
                self.step()

    def receive(self, block: bool) -> None:
        if block:
            self.conn.poll(None)
        while self.conn.poll(0):
            kind, rid, *rest = self.conn.recv()
            if kind == "add":
                self.waiting[rid] = tuple(rest)
            else:
                self.waiting.pop(rid, None)
                self.draws.pop(rid, None)
                self.batch_changed |= self.running.pop(rid, None) is not None

    def request_draws(self, length: int) -> random.Random:
        """The drafter's draws for a request of ``length`` tokens, a stream of its own.  Seeded,
        the n-th request of a length since start-up gets the same stream in every run, so two
        arms given the same load accept the same drafts request by request (common random
        numbers: what the drafter accepts depends on the text, not on the host), whatever
        else ran between them; unseeded, a fresh stream each."""
        ordinal = self.admitted.get(length, 0)
        self.admitted[length] = ordinal + 1
        return random.Random(None if self.seed is None else "%s/%d/%d" % (self.seed, length, ordinal))

    def step(self) -> None:
        ran_on = bool(self.running)
        changed = self.batch_changed or bool(self.waiting)
        prefill = sum(uncached for uncached, _, _ in self.waiting.values())
        admitted = set(self.waiting)
        for rid, (_, length, prompt_tokens) in self.waiting.items():
            self.running[rid] = [length, 0, prompt_tokens]
            self.draws[rid] = self.request_draws(length)
        self.waiting.clear()
        self.steps += 1
        # host_s: the wake-up the engine paid for the previous step's reply, on this step's path
        step = {
            "step": self.steps,
            "duration_s": self.step_s * self.start.step_factor + PREFILL_S_PER_TOKEN * prefill,
            "ran_on": ran_on,
            "requests": len(self.running),
            "host_s": self.replies.wake_s,
        }
        if self.peer:
            self.peer.sendall(json.dumps(step).encode() + b"\n")
        sent_at = self.broadcast.put(step)
        # a new batch shape: the sampler's per-request state is rebuilt first; the sample is
        # stamped as sent after the rebuild's modelled time, whatever this machine's sleep took
        rebuild = self.rng.uniform(*SAMPLER_REBUILD_S) if changed else 0.0
        time.sleep(rebuild)
        self.broadcast.put({"sample": self.steps}, written_at=sent_at + rebuild)
        reply = self.replies.get()  # the spin: stock vLLM keeps a core busy here while the GPU works
        if self.peer and not self.peer_lines.readline():
            raise ConnectionError("the worker node closed the connection")
        outputs, tokens = [], 0
        accepted = [0] * len(self.start.acceptance)  # per draft position
        drafts = 0
        self.batch_changed = False
        for rid, state in list(self.running.items()):
            before = state[1]
            made = 1
            if rid not in admitted:  # a request's first step is its prefill: nothing drafted yet
                drafts += 1
                made = accepted_tokens(self.draws[rid], self.start.acceptance)
                for position in range(made - 1):
                    accepted[position] += 1
            state[1] = min(state[0], state[1] + made)
            tokens += state[1] - before
            outputs.append((rid, state[1], state[1] >= state[0]))
            if state[1] >= state[0]:
                del self.running[rid]
                del self.draws[rid]
                self.batch_changed = True
        self.receive(block=False)  # the requests that came during the step are waiting now
        iteration = {
            "tokens": prefill + tokens,
            "drafts": drafts,
            "accepted_per_position": accepted,
            "due_at": reply["due_at"],
        }
        self.conn.send((outputs, dict(self.state(), iteration=iteration)))
        self.report(tokens)

    def state(self) -> dict:
        """Every waiting request is admitted at the next step (no batch limit): waiting are
        those that arrived during this one."""
        blocks = sum(-(-(prompt + emitted) // BLOCK_TOKENS) for _, emitted, prompt in self.running.values())
        return {
            "running": len(self.running),
            "waiting": len(self.waiting),
            "kv_cache_usage": min(1.0, blocks / KV_CACHE_BLOCKS),
        }

    def report(self, tokens: int) -> None:
        self.stats["tokens"] += tokens
        self.stats["steps"] += 1
        elapsed = time.monotonic() - self.stats["since"]
        if elapsed >= STATS_EVERY_S:
            log(
                "engine: %d running, generation %.1f tok/s, %.1f steps/s"
                % (len(self.running), self.stats["tokens"] / elapsed, self.stats["steps"] / elapsed)
            )
            self.stats = {"since": time.monotonic(), "tokens": 0, "steps": 0}


def run_engine(root: Path, conn, broadcast: ShmQueue, replies: ShmQueue, step_s: float, peer_port, seed, start) -> None:
    become_child("EngineCore")
    account = Account(root)
    main = account.thread("EngineCore")
    account.start()
    replies.spin_meter = main
    peer = connect_peer(peer_port) if peer_port else None
    conn.send("ready")
    Engine(conn, broadcast, replies, step_s, peer, seed, start).run()


# ---- API server --------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class EngineGone(Exception):
    pass


class EngineClient:
    """The API server's end of the engine pipe: submits requests, routes each step's
    tokens to the queue of the request they belong to, and keeps the metrics."""

    def __init__(self, conn, model: str):
        self.conn = conn
        self.send_lock = threading.Lock()
        self.streams = {}
        self.streams_lock = threading.Lock()
        self.prefix_cache = PrefixCache()
        self.metrics = ServerMetrics(model)

    def submit(self, rid: str, uncached: int, length: int, prompt_tokens: int) -> queue.Queue:
        stream = queue.Queue()
        with self.streams_lock:
            self.streams[rid] = stream
        with self.send_lock:
            self.conn.send(("add", rid, uncached, length, prompt_tokens))
        return stream

    def abort(self, rid: str) -> None:
        with self.streams_lock:
            self.streams.pop(rid, None)
        with self.send_lock:
            self.conn.send(("abort", rid))

    def dispatch(self, on_engine_exit) -> None:
        """Thread body: runs until the engine process ends."""
        try:
            while True:
                outputs, state = self.conn.recv()
                self.metrics.engine_state(state)
                for rid, emitted, finished in outputs:
                    with self.streams_lock:
                        stream = self.streams.pop(rid) if finished else self.streams.get(rid)
                    if stream:
                        stream.put((emitted, finished, state["iteration"]["due_at"]))
        except (EOFError, OSError):
            with self.streams_lock:
                for stream in self.streams.values():
                    stream.put(None)
            on_engine_exit()

    def outputs(self, stream: queue.Queue, request: dict):
        """Yield (tokens emitted so far, finished) until finished, observed by the metrics
        (with each step's due time on the GPU's schedule)."""

        def items():
            while True:
                item = stream.get()
                if item is None:
                    raise EngineGone("the engine process ended")
                yield item
                if item[1]:
                    return

        return self.metrics.track(items(), request["prompt_tokens"], request["finish_reason"])


def completions_prompt(body) -> list:
    """The prompt token ids of a /v1/completions body: text, or token ids (one prompt)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return tokens.encode(prompt)
    if isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < tokens.vocab_size() for t in prompt):
        return prompt
    raise ApiError(400, "prompt must be a non-empty string or list of token ids (one prompt)")


def parse_request(body, model: str, kind: str) -> dict:
    """Validate a completion request (``kind`` "chat" or "completions") the way vLLM
    answers it (400/404); vLLM's /v1/completions defaults max_tokens to 16."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if body.get("model", model) != model:
        raise ApiError(404, "The model `%s` does not exist." % body.get("model"))
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "messages must be a non-empty list of objects")
        prompt_ids = tokens.encode(tokens.render_chat(messages))
    else:
        prompt_ids = completions_prompt(body)
    prompt_tokens = len(prompt_ids)
    room = MAX_MODEL_LEN - prompt_tokens
    max_tokens = next(
        (body[key] for key in ("max_completion_tokens", "max_tokens") if body.get(key) is not None),
        room if kind == "chat" else min(16, room),
    )
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ApiError(400, "max_tokens must be a positive integer")
    if max_tokens > room:
        raise ApiError(
            400,
            "This model's maximum context length is %d tokens; the prompt has "
            "%d and max_tokens is %d." % (MAX_MODEL_LEN, prompt_tokens, max_tokens),
        )
    stream_options = body.get("stream_options") or {}
    length = completion_length(prompt_ids, max_tokens, bool(body.get("ignore_eos")))
    return {
        "kind": kind,
        "prompt_ids": prompt_ids,
        "prompt_tokens": prompt_tokens,
        "max_tokens": max_tokens,
        "length": length,
        "finish_reason": "length" if length == max_tokens else "stop",
        "stream": bool(body.get("stream")),
        "include_usage": bool(stream_options.get("include_usage")),
    }


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, model: str, engine: EngineClient, cpu: Thread):
        super().__init__(address, Handler)
        self.model = model
        self.engine = engine
        self.cpu = cpu  # the API server's GB10 CPU: detokenizing and streaming


def tokenize(body) -> dict:
    """vLLM's /tokenize: a prompt or chat messages -> their token ids (as the engine counts)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if "messages" in body:
        ids = tokens.encode(tokens.render_chat(body["messages"]))
    else:
        ids = completions_prompt(body)
    return {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids, "token_strs": None}


def detokenize(body) -> dict:
    ids = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not all(type(t) is int and 0 <= t < tokens.vocab_size() for t in ids):
        raise ApiError(400, "tokens must be a list of token ids")
    return {"prompt": tokens.tokenizer().decode(ids, skip_special_tokens=False)}


TOKEN_PATHS = {"tokenize": tokenize, "detokenize": detokenize}
POST_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
}
ID_PREFIX = {"chat": "chatcmpl-", "completions": "cmpl-"}
OBJECT = {"chat": ("chat.completion", "chat.completion.chunk"), "completions": ("text_completion", "text_completion")}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked streaming
    server: ApiServer

    def send_body(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, status: int, obj) -> None:
        self.send_body(status, json.dumps(obj).encode(), "application/json")

    def send_error_json(self, status: int, message: str) -> None:
        self.send_json(
            status,
            {
                "object": "error",
                "message": message,
                "type": "BadRequestError" if status == 400 else "NotFoundError",
                "param": None,
                "code": status,
            },
        )

    def do_GET(self):
        if self.path == "/health":
            self.send_body(200, b"", "text/plain")
        elif self.path == "/v1/models":
            model = self.server.model
            self.send_json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": model,
                            "object": "model",
                            "created": int(time.time()),
                            "owned_by": "vllm",
                            "root": model,
                            "parent": None,
                            "max_model_len": MAX_MODEL_LEN,
                        }
                    ],
                },
            )
        elif self.path == "/version":
            self.send_json(200, {"version": VLLM_VERSION})
        elif self.path.split("?")[0] == "/metrics":
            self.send_body(200, self.server.engine.metrics.exposition(), CONTENT_TYPE)
        else:
            self.send_error_json(404, "Not Found")

    def do_POST(self):
        # The body is read whatever the path, so the connection's next request starts clean.
        try:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        except ValueError:
            self.close_connection = True
            self.send_error_json(400, "bad Content-Length")
            return
        kind = POST_PATHS.get(self.path)
        if kind is None:
            self.send_error_json(404, "Not Found")
            return
        try:
            if kind in TOKEN_PATHS:
                self.send_json(200, TOKEN_PATHS[kind](json.loads(raw)))
                return
            request = parse_request(json.loads(raw), self.server.model, kind)
        except json.JSONDecodeError as error:
            self.send_error_json(400, "invalid JSON: %s" % error)
            return
        except ApiError as error:
            self.send_error_json(error.status, str(error))
            return
        engine = self.server.engine
        rid = ID_PREFIX[kind] + uuid.uuid4().hex
        cached = engine.prefix_cache.cached_tokens(request["prompt_ids"])
        outputs = engine.outputs(
            engine.submit(rid, request["prompt_tokens"] - cached, request["length"], request["prompt_tokens"]), request
        )
        usage = {
            "prompt_tokens": request["prompt_tokens"],
            "completion_tokens": request["length"],
            "total_tokens": request["prompt_tokens"] + request["length"],
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        head = {"id": rid, "created": int(time.time()), "model": self.server.model}
        try:
            if request["stream"]:
                self.stream(outputs, head, usage, request)
            else:
                for _ in outputs:
                    pass
                text = "".join(tokens.token_text(i) for i in range(request["length"]))
                self.send_json(
                    200,
                    dict(
                        head,
                        object=OBJECT[kind][0],
                        usage=usage,
                        choices=[choice(kind, text, request["finish_reason"], streamed=False)],
                    ),
                )
        except (BrokenPipeError, ConnectionResetError):
            engine.abort(rid)  # the client left: free its slot in the batch, as vLLM does
            self.close_connection = True
        except EngineGone:
            self.close_connection = True

    def stream(self, outputs, head, usage, request) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        kind = request["kind"]

        def event(data) -> None:
            payload = b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))

        def chunk(text, finish=None, first=False):
            return dict(head, object=OBJECT[kind][1], choices=[choice(kind, text, finish, True, first)])

        if kind == "chat":
            event(chunk("", first=True))
        sent = 0
        for emitted, finished in outputs:
            text = "".join(tokens.token_text(i) for i in range(sent, emitted))
            self.server.cpu.add(API_S_PER_TOKEN * (emitted - sent))
            sent = emitted
            event(chunk(text, request["finish_reason"] if finished else None))
        if request["include_usage"]:
            event(dict(head, object=OBJECT[kind][1], choices=[], usage=usage))
        event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")


def choice(kind: str, text: str, finish, streamed: bool, first: bool = False) -> dict:
    """One choice of an answer or of a streamed chunk, in the endpoint's own shape."""
    if kind == "completions":
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    content = {"role": "assistant", "content": text} if first or not streamed else {"content": text}
    return {"index": 0, "delta" if streamed else "message": content, "logprobs": None, "finish_reason": finish}


# ---- processes and CLI -------------------------------------------------------------


def exit_on_sigterm() -> None:
    def handler(signum, frame):
        raise SystemExit(0)  # unwinds through the finally blocks that stop the children

    signal.signal(signal.SIGTERM, handler)


def serve_head(args, busy_loop_s: float, lost_wakeup: bool, start: restart.StartDraw) -> int:
    fork = multiprocessing.get_context("fork")  # children keep this cmdline (--node ROOT)
    broadcast, replies = ShmQueue(busy_loop_s, lost_wakeup=lost_wakeup), ShmQueue(busy_loop_s, lost_wakeup=lost_wakeup)
    worker = fork.Process(target=run_local_worker, args=(args.node, broadcast, replies), daemon=True)
    worker.start()
    # The pipe is made after the worker is forked and our copy of the engine's end is
    # closed after the engine is, so the engine alone holds it: its death reads as EOF.
    api_end, engine_end = fork.Pipe()
    engine = fork.Process(
        target=run_engine,
        daemon=True,
        args=(args.node, engine_end, broadcast, replies, args.step_ms / 1000.0, args.peer_port, args.seed, start),
    )
    engine.start()
    engine_end.close()
    children = [worker, engine]
    account = Account(args.node)  # after the forks: the account's writer thread is ours alone
    api_cpu = account.thread("APIServer")
    account.start()
    exit_on_sigterm()  # after forking: the children keep the default (die on SIGTERM)
    engine_died = threading.Event()
    try:
        if not api_end.poll(PEER_CONNECT_TIMEOUT_S + 10):
            raise TimeoutError("the engine did not become ready")
        api_end.recv()
        client = EngineClient(api_end, args.model)
        with ApiServer((args.host, args.port), args.model, client, api_cpu) as server:

            def on_engine_exit():
                engine_died.set()
                server.shutdown()

            threading.Thread(target=client.dispatch, args=(on_engine_exit,), daemon=True).start()
            log(
                "head ready: http://%s:%d, model %s, step %g ms, peer %s"
                % (args.host, args.port, args.model, args.step_ms, args.peer_port)
            )
            server.serve_forever()
    except EOFError:
        engine_died.set()
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.join(5)
            if child.is_alive():
                child.kill()
    if engine_died.is_set():
        log("the engine process ended; shutting down")
        return 1
    return 0


def serve_worker(args) -> int:
    """A worker node: runs the head's steps as they come over TCP (a blocking read, no
    spin: this node waits in NCCL/CUDA, as the study's worker did)."""
    exit_on_sigterm()
    account = Account(args.node)
    main = account.thread("VllmWorker")
    gpu = Gpu(args.node, account)
    account.start()
    with socket.create_server((args.host, args.port)) as listener:
        log("worker ready: listening for the head's steps on %s:%d" % (args.host, args.port))
        while True:
            connection, address = listener.accept()
            log("head connected from %s:%d" % address)
            with connection, connection.makefile("rb") as lines:
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    for line in lines:
                        step = json.loads(line)
                        main.add(LAUNCH_S_PER_STEP)
                        gpu.run(step, time.monotonic())
                        connection.sendall(b'{"step": %d}\n' % step["step"])
                except OSError as error:
                    log("head connection lost: %s" % error)


def absolute_node(text: str) -> Path:
    """--node must be absolute: it is matched verbatim in the processes' command lines."""
    if not os.path.isabs(text):
        raise argparse.ArgumentTypeError("must be an absolute path, got %r" % text)
    return Path(text)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m thermab.sim.vllm", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run a simulated vLLM server on a node")
    serve.add_argument("--node", type=absolute_node, required=True)
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--model", required=True)
    serve.add_argument("--role", choices=node.ROLES, required=True)
    serve.add_argument("--peer-port", type=int, help="head only: the worker node's port")
    serve.add_argument("--step-ms", type=float, default=40.0, help="decode step time (GPU)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument(
        "--seed", type=int, help="head only: seed of the engine's draws (accepted drafts, rebuild times)"
    )
    serve.add_argument("--detach", action="store_true", help="run in a new session and return")
    stop = commands.add_parser("stop", help="stop the server recorded in ROOT/run/vllm.pid")
    stop.add_argument("--node", type=Path, required=True)
    args = parser.parse_args(argv)

    if args.command == "stop":
        print("stopped" if node.stop(args.node, "vllm") else "not running")
        return 0
    try:
        settings = node.load_settings(args.node)
    except FileNotFoundError as error:
        parser.error(str(error))
    if settings["role"] != args.role:
        parser.error("%s is a %s node, not a %s" % (args.node, settings["role"], args.role))
    running = node.running_pid(args.node, "vllm")
    if running and running != os.getpid():  # a detached server finds its own pid there
        parser.error("a server is already running on %s (pid %d): stop it first" % (args.node, running))
    if args.detach:
        argv.remove("--detach")
        try:
            print(node.start_detached(args.node, "vllm", MODULE, argv, confirm=True))
        except node.StartFailed as error:
            print("%s: the server ended before it started (%s)" % (parser.prog, error), file=sys.stderr)
            return 1
        return 0

    busy_loop_s = node.read_busy_loop_s(args.node)
    log(
        "busy_loop_s = %g (SpinCondition default in %s)%s"
        % (busy_loop_s, args.node / node.SHM_BROADCAST, ", lost wake-ups on" if settings["lost_wakeup"] else "")
    )
    try:  # a fresh stream whatever --seed says: restarts differ as real servers' do
        start = restart.start_draw(random.Random(), settings.get("restart_variance", False), os.environ)
    except ValueError as error:
        parser.error(str(error))
    if args.role == "head":
        log("this start: %s" % start.describe())
    node.claim_pid_file(args.node, "vllm")
    node.report_started()  # its checks passed: a detached start returns (before any fork)
    try:
        if args.role == "head":
            return serve_head(args, busy_loop_s, settings["lost_wakeup"], start)
        return serve_worker(args)
    finally:
        node.release_pid_file(args.node, "vllm")


def serve_command(root: Path, port: int, *options) -> list[str]:
    """The command that starts the simulated server of the node at ``root`` on ``port`` with
    ``options`` (``--role``, ``--model``, ``--step-ms`` ...), detached: it returns once the
    server runs, which answers ``/health`` when it is ready (the way tests and benches start
    one of their own; a cluster's config spells its own start command)."""
    node_and_port = ["--node", str(root), "--port", str(port)]
    return [sys.executable, "-m", MODULE, "serve", *node_and_port, *map(str, options), "--detach"]


if __name__ == "__main__":
    sys.exit(main())
