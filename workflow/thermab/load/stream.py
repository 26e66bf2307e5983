"""One streamed chat completion read as its server-sent events arrive: the record the
load keeps of it (first token, gaps and stalls, token arrivals, usage, errors).

Pure and small (``time``, ``orjson`` and the gaps' sketch only: no gevent, no Locust), so
the locustfile imports it and tests feed it crafted streams directly."""

import time

import orjson

from thermab.errors import HostError
from thermab.load.sketch import gap_key

# Text lines handled closer together than this were read from one buffer (handling a line
# takes microseconds): they are one arrival of tokens, not several.
ARRIVAL_GAP_S = 0.001

# Reasoning models stream their thinking in a separate field before any content; those
# tokens are generated tokens too, so they count for the first token and the gaps.
TEXT_FIELDS = ("content", "reasoning_content", "reasoning")


# A token count past this is no request's (and no int32 column's): a server's number, refused
MAX_TOKEN_COUNT = 2**31 - 1


class StreamFailure(HostError):
    """A request the server did not deliver a complete stream for; its text is the record's
    error (it never leaves the load)."""


class StreamReader:
    """What one request's record needs, fed the lines of its server-sent events as they arrive."""

    def __init__(self, stall_gap_s):
        self.stall_gap_s = stall_gap_s
        self.t_start = time.time()
        self.t_first_token = None
        self.first_step_s = None  # the first decode step: the second token chunk after the first
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
        self.itl_bins = {}  # every inter-token gap, as a sketch's bins (load/latency.py)
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
            raise StreamFailure(f"server error in stream: {_shown(event['error'])}")
        if event.get("usage") not in (None, {}):  # vLLM sends "usage": null on every text chunk
            self.usage = usage_counts(event["usage"])
        if any([_text_of(choice) for choice in _choices(event)]):  # every choice read, none skipped
            self._token_chunk(now)

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
            if self.first_step_s is None:
                self.first_step_s = now - self.t_first_token
            gap = now - self.t_last_token
            self.max_gap_s = gap if self.max_gap_s is None else max(self.max_gap_s, gap)
            if gap >= self.stall_gap_s:
                self.stall_gaps += 1
            key = gap_key(gap)
            self.itl_bins[key] = self.itl_bins.get(key, 0) + 1
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
            "cached_tokens": usage.get("cached_tokens"),
            "ok": not self.error,
            "error": self.error,
            "max_gap_s": self.max_gap_s,
            "stall_gaps": self.stall_gaps,
            "usage_source": "usage" if self.usage else "chunks",
            "token_arrivals": self.token_arrivals,
            "token_chunks": self.token_chunks,
            "token_span_s": None if self.t_first_token is None else self.t_last_token - self.t_first_token,
            "first_step_s": self.first_step_s,
            "itl_keys": list(self.itl_bins),
            "itl_counts": list(self.itl_bins.values()),
        }


def _shown(value) -> str:
    text = str(value)
    return text if len(text) <= 200 else text[:199] + "…"


def _choices(event: dict) -> list:
    """The event's choices, each a JSON object; any other shape is a ValueError (a request
    whose reply cannot be read is no ok request)."""
    choices = event.get("choices")
    if choices is None:
        return []
    if not isinstance(choices, list) or not all(isinstance(choice, dict) for choice in choices):
        raise ValueError(f"'choices' is not a list of JSON objects: {_shown(choices)}")
    return choices


def _text_of(choice: dict) -> bool:
    """Whether a choice's delta carries generated text; a delta or text field of another
    shape is a ValueError."""
    delta = choice.get("delta")
    if delta is None:
        return False
    if not isinstance(delta, dict):
        raise ValueError(f"'delta' is not a JSON object: {_shown(delta)}")
    texts = [delta.get(name) for name in TEXT_FIELDS]
    if not all(text is None or isinstance(text, str) for text in texts):
        raise ValueError(f"a text field of 'delta' is not text: {_shown(delta)}")
    return any(texts)


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_COUNT:
        raise ValueError(f"usage {name} {_shown(value)[:40]} is not a token count (a whole number 0–{MAX_TOKEN_COUNT})")
    return value


def usage_counts(usage) -> dict:
    """The server's ``usage`` as counts: ``completion_tokens`` (required), ``prompt_tokens``
    and ``cached_tokens`` (None when not given), each a whole number from 0 to
    MAX_TOKEN_COUNT; anything else is a ValueError naming the field."""
    if not isinstance(usage, dict):
        raise ValueError(f"'usage' is not a JSON object: {_shown(usage)}")
    if "completion_tokens" not in usage:
        raise ValueError(f"'usage' without completion_tokens: {_shown(usage)}")
    details = usage.get("prompt_tokens_details")
    if details is not None and not isinstance(details, dict):
        raise ValueError(f"usage prompt_tokens_details is not a JSON object: {_shown(details)}")
    given = {
        "completion_tokens": usage["completion_tokens"],
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": (details or {}).get("cached_tokens"),
    }
    return {
        name: None if value is None and name != "completion_tokens" else _count(name, value)
        for name, value in given.items()
    }
