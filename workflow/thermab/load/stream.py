"""One streamed chat completion read as its server-sent events arrive: the record the
load keeps of it (first token, gaps and stalls, token arrivals, usage, errors).

Pure and small (``time`` and ``orjson`` only: no gevent, no Locust), so the locustfile
imports it and tests feed it crafted streams directly."""

import time

import orjson

from thermab.errors import HostError

# Text lines handled closer together than this were read from one buffer (handling a line
# takes microseconds): they are one arrival of tokens, not several.
ARRIVAL_GAP_S = 0.001

# Reasoning models stream their thinking in a separate field before any content; those
# tokens are generated tokens too, so they count for the first token and the gaps.
TEXT_FIELDS = ("content", "reasoning_content", "reasoning")


class StreamFailure(HostError):
    """A request the server did not deliver a complete stream for; its text is the record's
    error (it never leaves the load)."""


class StreamReader:
    """What one request's record needs, fed the lines of its server-sent events as they arrive."""

    def __init__(self, stall_gap_s):
        self.stall_gap_s = stall_gap_s
        self.t_start = time.time()
        self.t_first_token = None
        self.t_last_token = None
        self.t_end = None
        self.responded = False
        self.done = False
        self.token_chunks = 0
        self.bytes = 0
        self.usage = None
        self.max_gap_s = None
        self.stall_gaps = 0
        self.token_arrivals = 0
        self.error = ""

    def line(self, line, now):
        """One line of the body (its line ending included or not), arrived at ``now``."""
        self.bytes += len(line)
        line = line.strip()
        if not line.startswith(b"data:"):
            return  # blank separators, comments and event names carry nothing we count
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        # Every event is parsed, so a malformed one anywhere fails the request; orjson does
        # it in a fraction of the json module's time (the profile in docs/benchmarks.md).
        event = orjson.loads(payload)
        if not isinstance(event, dict):
            raise ValueError(f"an event that is not a JSON object: {payload[:100]!r}")
        if event.get("error"):
            raise StreamFailure(f"server error in stream: {event['error']}")
        if event.get("usage"):
            self.usage = event["usage"]
        for choice in event.get("choices") or ():
            delta = choice.get("delta")
            if delta and any(delta.get(field) for field in TEXT_FIELDS):
                self._token_chunk(now)
                return

    def end(self):
        """The body has ended: without ``[DONE]`` the stream was cut short."""
        if not self.done:
            raise StreamFailure(
                f"stream truncated: the body ended without [DONE] after {self.token_chunks} token chunks"
            )

    def _token_chunk(self, now):
        if self.t_first_token is None:
            self.t_first_token = now
        else:
            gap = now - self.t_last_token
            self.max_gap_s = gap if self.max_gap_s is None else max(self.max_gap_s, gap)
            if gap >= self.stall_gap_s:
                self.stall_gaps += 1
        # lines read from one buffer are handled back to back, microseconds apart: one arrival
        if self.t_last_token is None or now - self.t_last_token >= ARRIVAL_GAP_S:
            self.token_arrivals += 1
        self.t_last_token = now
        self.token_chunks += 1

    def fail(self, error):
        self.error = error

    def record(self, kind, user, tag):
        usage = self.usage or {}
        return {
            "kind": kind,
            "user": user,
            "tag": tag,
            "t_start": self.t_start,
            "t_first_token": self.t_first_token,
            "t_end": self.t_end,
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage["completion_tokens"] if self.usage else self.token_chunks,
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "ok": not self.error,
            "error": self.error,
            "max_gap_s": self.max_gap_s,
            "stall_gaps": self.stall_gaps,
            "usage_source": "usage" if self.usage else "chunks",
            "token_arrivals": self.token_arrivals,
            "token_span_s": None if self.t_first_token is None else self.t_last_token - self.t_first_token,
        }
