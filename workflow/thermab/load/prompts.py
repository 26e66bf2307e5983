"""Prompt text of a chosen size, deterministic, with a unique tag at its very start.

The body is the same plain English-like text for every request (generated from a fixed
word list and a fixed seed, so nothing is downloaded and every run sends the same bytes).
The tag that makes a prompt unique comes first: prefix caches match from the start of the
prompt in whole blocks, so a unique first block means no block of the prompt is reused.

Size is set in tokens, but the tokenizer is the server's, so the character count is only
an estimate (``tokens_per_char``); the load measures ``usage.prompt_tokens`` and
recalibrates once from the first answer (see ``calibrated_tokens_per_char``).
"""

import random
from functools import lru_cache

# English prose runs at about 4 characters a token with the common BPE tokenizers.
DEFAULT_TOKENS_PER_CHAR = 0.25
SEED = 1400
CORPUS_CHARS = 64_000  # ~16k tokens of distinct text; longer prompts repeat it

WORDS = (
    "the a an and but or so of to in on at by for with from over under after before "
    "river field stone house garden window road bridge valley harbour mountain forest "
    "morning evening winter summer rain wind light shadow water fire bread salt iron "
    "farmer miller sailor weaver teacher doctor child mother father neighbour stranger "
    "walked carried watched opened closed built mended counted wrote read sang waited "
    "found lost kept sold bought crossed followed remembered forgot planted gathered "
    "old new small large quiet busy early late narrow wide cold warm bright dark long "
    "slowly quickly carefully again together alone always never often there here then "
    "letter lamp table chair door wall roof cart horse boat market church school mill "
    "because while when where although until since every each many few some all"
).split()


@lru_cache(maxsize=1)
def corpus():
    """Paragraphs of seeded pseudo-prose, identical on every machine and every run."""
    rng = random.Random(SEED)
    paragraphs, length = [], 0
    while length < CORPUS_CHARS:
        sentences = []
        for _ in range(rng.randint(4, 7)):
            words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
            sentences.append(" ".join(words).capitalize() + ".")
        paragraph = " ".join(sentences)
        paragraphs.append(paragraph)
        length += len(paragraph) + 2
    return "\n\n".join(paragraphs)


def filler(n_chars):
    """The first ``n_chars`` of the corpus (repeated if needed), cut back to a word end."""
    text = corpus()
    while len(text) < n_chars:
        text = text + "\n\n" + corpus()
    cut = text[:n_chars]
    if n_chars < len(text) and not text[n_chars].isspace():
        cut = cut[: cut.rfind(" ") + 1]  # drop the partial last word
    return cut.rstrip()


def build_prompt(tag, target_tokens, tokens_per_char=DEFAULT_TOKENS_PER_CHAR):
    """``tag`` first, then filler text sized so the whole prompt is about ``target_tokens``."""
    n_chars = round(target_tokens / tokens_per_char)
    return f"{tag} {filler(max(0, n_chars - len(tag) - 1))}"


def calibrated_tokens_per_char(prompt, measured_tokens):
    """The ratio the server's tokenizer actually gave (chat template tokens included)."""
    return measured_tokens / max(1, len(prompt))
