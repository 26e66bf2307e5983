"""Deliberately misbehaving OpenAI-compatible streaming servers: test peers for the load.

Each server is a real HTTP server on 127.0.0.1 (stdlib ``http.server``, one thread per
connection) that answers ``/health``, ``/v1/models`` and streamed ``/v1/chat/completions``
the way vLLM does: HTTP/1.1 chunked transfer, one ``data: {json}`` event per step, a first
chunk carrying only the role, a final chunk with ``finish_reason``, then (when
``stream_options.include_usage``) a usage chunk with empty ``choices``, then ``data: [DONE]``.

``behaviour`` picks how it misbehaves:

- ``normal``: one token per chunk, correct usage.
- ``no_usage``: never sends usage, whatever the client asks (older or non-vLLM servers).
- ``packed``: several tokens per chunk, as speculative decoding does; usage stays correct,
  so counting chunks undercounts.
- ``drop``: cuts the TCP connection halfway through the stream.
- ``truncated``: ends the HTTP body cleanly halfway, without a usage chunk or ``[DONE]``.
- ``http_error``: answers 500 with an OpenAI-style error body.

Like vLLM it stops at half of ``max_tokens`` unless ``ignore_eos`` is set (an "EOS"), keeps
a prefix cache of 16-token blocks (4 characters a token) and reports hits in
``usage.prompt_tokens_details.cached_tokens``, and answers 404 for an unknown model, so a
client that forgets ``ignore_eos``, repeats a prompt prefix or sends the wrong model shows.
``kill()`` stops the server and cuts every open connection: a server dying mid-load.
"""

import hashlib
import json
import math
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BEHAVIOURS = ("normal", "no_usage", "packed", "drop", "truncated", "http_error")
CHARS_PER_TOKEN = 4
CHAT_FIELDS = {"model", "messages", "max_tokens", "ignore_eos", "stream", "stream_options"}  # the load's own
BLOCK_TOKENS = 16
WORDS = ("alpha", "beta", "gamma", "delta", "omega")


class PrefixCache:
    """vLLM-style automatic prefix caching: a prompt reuses its longest run of full blocks
    seen before, counted from the start (a block's identity includes everything before it)."""

    def __init__(self):
        self._seen = set()
        self._lock = threading.Lock()

    def lookup_and_store(self, text):
        block_chars = BLOCK_TOKENS * CHARS_PER_TOKEN
        prefixes = [
            hashlib.sha256(text[:end].encode()).digest() for end in range(block_chars, len(text) + 1, block_chars)
        ]
        with self._lock:
            hits = 0
            for digest in prefixes:
                if digest not in self._seen:
                    break
                hits += 1
            self._seen.update(prefixes)
        return hits * BLOCK_TOKENS


def count_prompt_tokens(prompt: str) -> int:
    return math.ceil(len(prompt) / CHARS_PER_TOKEN) + 5  # + chat template


def tokens_to_generate(body: dict) -> tuple[int, int]:
    """(max_tokens, how many to stream): all of them with ``ignore_eos``, else half, as if
    the model stopped early."""
    max_tokens = int(body.get("max_tokens", 16))
    return max_tokens, max_tokens if body.get("ignore_eos") else max(1, max_tokens // 2)


class MisbehavingServer:
    """One misbehaving OpenAI-compatible server; use as a context manager."""

    def __init__(
        self, behaviour="normal", *, token_interval_s=0.01, prefill_s=0.02, tokens_per_chunk=3, model="test-model"
    ):
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"behaviour must be one of {BEHAVIOURS}, not {behaviour!r}")
        self.behaviour = behaviour
        self.token_interval_s = token_interval_s
        self.prefill_s = prefill_s
        self.tokens_per_chunk = tokens_per_chunk if behaviour == "packed" else 1
        self.model = model
        self.cache = PrefixCache()
        self.prompts = []  # every prompt received, in arrival order
        self.extra_fields = []  # per streamed request, its fields beyond the chat request's own
        self._connections = set()
        self._lock = threading.Lock()
        self._httpd = None
        self._thread = None

    @property
    def url(self):
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self):
        peer = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def process_request(self, request, client_address):
                with peer._lock:
                    peer._connections.add(request)
                super().process_request(request, client_address)

            def handle_error(self, request, client_address):
                if not isinstance(sys.exc_info()[1], OSError):  # a client gone mid-stream is routine here
                    super().handle_error(request, client_address)

            def shutdown_request(self, request):
                with peer._lock:
                    peer._connections.discard(request)
                super().shutdown_request(request)

        self._httpd = Server(("127.0.0.1", 0), self._handler_class())
        # A short poll interval makes kill() prompt: shutdown() waits for the next poll.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def kill(self):
        """Stop listening and cut every open connection, streams included."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its handler
        self._thread.join(timeout=5)
        self._httpd = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.kill()

    def _handler_class(self):
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass  # keep pytest output readable

            def do_GET(self):
                if self.path == "/health":
                    self._send_json(200, {})
                elif self.path == "/v1/models":
                    self._send_json(200, {"object": "list", "data": [{"id": peer.model, "object": "model"}]})
                else:
                    self._send_json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path != "/v1/chat/completions":
                    self._send_json(404, {"error": {"message": f"no route {self.path}"}})
                elif peer.behaviour == "http_error":
                    self._send_json(500, {"error": {"message": "test peer: internal error", "code": 500}})
                elif body.get("model") != peer.model:
                    self._send_json(404, {"error": {"message": f"model {body.get('model')!r} does not exist"}})
                elif not body.get("stream"):
                    self._send_json(400, {"error": {"message": "test peer only streams"}})
                else:
                    self._stream(body)

            def _send_json(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _write_chunk(self, data):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _event(self, obj):
                self._write_chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

            def _stream(self, body):
                prompt = "".join(m.get("content", "") for m in body.get("messages", []))
                peer.prompts.append(prompt)
                peer.extra_fields.append({k: v for k, v in body.items() if k not in CHAT_FIELDS})
                prompt_tokens = count_prompt_tokens(prompt)
                cached_tokens = peer.cache.lookup_and_store(prompt)
                max_tokens, n_tokens = tokens_to_generate(body)
                include_usage = (body.get("stream_options") or {}).get("include_usage", False)
                base = {
                    "id": "chatcmpl-test",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": peer.model,
                }

                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                time.sleep(peer.prefill_s)
                self._event(
                    {
                        **base,
                        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                    }
                )
                sent = 0
                while sent < n_tokens:
                    if peer.behaviour in ("drop", "truncated") and sent >= n_tokens // 2:
                        self._misbehave()
                        return
                    step = min(peer.tokens_per_chunk, n_tokens - sent)
                    time.sleep(peer.token_interval_s * step)
                    text = "".join(f" {WORDS[(sent + i) % len(WORDS)]}" for i in range(step))
                    self._event({**base, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
                    sent += step
                finish = "length" if n_tokens == max_tokens else "stop"
                self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
                if include_usage and peer.behaviour != "no_usage":
                    self._event(
                        {
                            **base,
                            "choices": [],
                            "usage": {
                                "prompt_tokens": prompt_tokens,
                                "completion_tokens": n_tokens,
                                "total_tokens": prompt_tokens + n_tokens,
                                "prompt_tokens_details": {"cached_tokens": cached_tokens},
                            },
                        }
                    )
                self._write_chunk(b"data: [DONE]\n\n")
                self._write_chunk(b"")

            def _misbehave(self):
                if peer.behaviour == "truncated":
                    self._write_chunk(b"")  # a well-formed end of body, but no usage and no [DONE]
                else:
                    self.connection.shutdown(socket.SHUT_RDWR)  # mid-chunk-stream: no terminating chunk
                self.close_connection = True

        return Handler
