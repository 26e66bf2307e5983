"""An OpenAI-compatible streaming server that keeps to a schedule, for bench_load.py.

Token k of a request is due ``prefill_s + k * token_interval_s`` after the request arrived,
whatever the server's own work took, so while the server keeps pace every request lasts the
same time and a closed loop's tok/s is fixed by how full its client keeps the slots and how
fast it reads: the client's share, not the server's. The thread-per-connection test server
(tests/support/openai_test_servers.py) sleeps after each token's work instead, so under 64
streams its speed is its share of a core and moves by several per cent from run to run.

It streams the way vLLM does (HTTP/1.1 chunked, one ``data:`` event per token, the usage
chunk when asked, ``data: [DONE]``), on one asyncio loop (aiohttp, with vLLM's listen backlog
of 2048 so that 64 users connecting at once are not dropped). ``GET /lag`` answers how late
it wrote its tokens since the last ask (median, 99th percentile, the worst, in seconds): the
proof that the server kept pace, and the reason to distrust a run where it did not.

    python bench/paced_server.py --token-interval-s 0.005 --lifetime 600   # prints its URL
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.openai_test_servers import WORDS, count_prompt_tokens, tokens_to_generate  # noqa: E402  (after the path above)

MODEL = "test-model"
BACKLOG = 2048


def event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class PacedServer:
    def __init__(self, token_interval_s: float, prefill_s: float):
        self.token_interval_s = token_interval_s
        self.prefill_s = prefill_s
        self.lateness: list[float] = []
        self.base = base = {
            "id": "chatcmpl-paced",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": MODEL,
        }
        self.role = event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        self.tokens = [event({**base, "choices": [{"index": 0, "delta": {"content": f" {w}"}}]}) for w in WORDS]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/lag", self.lag)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def lag(self, request: web.Request) -> web.Response:
        late, self.lateness = sorted(self.lateness), []
        if not late:
            return web.json_response({"tokens": 0})
        p50, p99 = (late[min(len(late) - 1, int(q * len(late)))] for q in (0.5, 0.99))
        return web.json_response({"tokens": len(late), "p50_s": p50, "p99_s": p99, "max_s": late[-1]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        body = await request.json()
        if body.get("model") != MODEL:
            return web.json_response({"error": {"message": f"model {body.get('model')!r} does not exist"}}, status=404)
        if not body.get("stream"):
            return web.json_response({"error": {"message": "the paced server only streams"}}, status=400)
        prompt = "".join(m.get("content", "") for m in body.get("messages", []))
        prompt_tokens = count_prompt_tokens(prompt)
        max_tokens, n_tokens = tokens_to_generate(body)

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        first = arrived + self.prefill_s
        await asyncio.sleep(first - loop.time())
        await response.write(self.role)
        for k in range(n_tokens):
            due = first + (k + 1) * self.token_interval_s
            await asyncio.sleep(due - loop.time())
            self.lateness.append(loop.time() - due)
            await response.write(self.tokens[k % len(self.tokens)])
        finish = "length" if n_tokens == max_tokens else "stop"
        await response.write(event({**self.base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n_tokens,
                "total_tokens": prompt_tokens + n_tokens,
            }
            await response.write(event({**self.base, "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def serve(args: argparse.Namespace) -> None:
    runner = web.AppRunner(PacedServer(args.token_interval_s, args.prefill_s).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=BACKLOG)
    await site.start()
    host, port = runner.addresses[0][:2]
    print(f"http://{host}:{port}", flush=True)
    await asyncio.sleep(args.lifetime)
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--token-interval-s", type=float, default=0.005)
    parser.add_argument("--prefill-s", type=float, default=0.01)
    parser.add_argument("--lifetime", type=float, default=600.0, help="seconds until it exits by itself")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
