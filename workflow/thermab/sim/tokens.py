"""The simulated server's tokenizer: the byte-level BPE of the tests' tiny Llama.

``tokenizer.json`` beside this module is the one ``tests/support/vllm_cpu/make_tiny_model.py``
trains and builds the tiny model from, so a client given that model's directory as its
tokenizer (``vllm bench serve``, AIPerf) counts the same tokens as the simulated server,
and the same as a real vLLM serving the tiny model.  The chat template is that model's too.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

TOKENIZER = Path(__file__).with_name("tokenizer.json")
BOS = "<s>"
# Words that are one token each with a leading space, so streamed text re-encodes to
# exactly the tokens the server says it sent (the tiny tokenizer's vocabulary has them).
WORDS = (
    " the",
    " heat",
    " of",
    " a",
    " server",
    " and",
    " the",
    " engine",
    " worker",
    " waited",
    " while",
    " the",
    " load",
    " kept",
    " every",
    " token",
    " busy",
)


@lru_cache(maxsize=1)
def tokenizer():
    """Loaded on first use, in the process that tokenizes (after the server's forks)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER))


def encode(text: str) -> list[int]:
    """Token ids of ``text`` as vLLM's tokenizer call gives them (special tokens written in
    the text, such as the template's ``<s>``, are matched; none are added)."""
    return tokenizer().encode(text, add_special_tokens=False).ids


def vocab_size() -> int:
    return tokenizer().get_vocab_size()


def render_chat(messages: list) -> str:
    """The prompt text the engine sees: the messages in the tiny model's chat template."""
    parts = [BOS]
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append("<|%s|>\n%s\n" % (message.get("role", "user"), content))
    return "".join(parts) + "<|assistant|>\n"


def token_text(index: int) -> str:
    """The text of the ``index``-th output token of any answer."""
    return WORDS[index % len(WORDS)]
