"""Build a tiny random-weight Llama that vLLM's CPU build can serve, without downloading anything.

Run it with the vLLM environment's python (it needs torch, transformers and tokenizers)::

    .vllm-venv/bin/python -m simulator.live.vllm.tiny_model DIR

The tokenizer is a byte-level BPE trained on ASCII lines of the Python standard library's source,
so every token decodes to non-empty ASCII text and a streamed chunk is never empty. Its only special
token is ``<|endoftext|>`` (id 0, used as BOS, EOS and padding); ids 1 .. vocab_size-1 are ordinary
text tokens, the safe range for token-id prompts (the stamp file's ``safe_token_ids`` is that range,
half-open). Text with non-ASCII characters loses them when tokenized. Training and weights are
seeded: two builds with the same Python give identical files.

This file imports nothing from the rest of the package, so it can be run by path as well.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import time
from pathlib import Path

SPECIAL_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 1024
HIDDEN_SIZE = 256
LAYERS = 2
HEADS = 4  # head size 64: vLLM's CPU attention supports only some head sizes (32, 64, 80, ...)
MAX_POSITIONS = 4096
SEED = 1234
CORPUS_BYTES = 2_000_000
BUILDER_VERSION = 1
STAMP = "agentload-tiny-model.json"

# Role headers are plain text, so the chat template adds no special token beyond the end of turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '### ' + message['role'] + '\\n' + message['content'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### assistant\\n' }}{% endif %}"
)


def corpus_lines(limit_bytes: int = CORPUS_BYTES) -> list[str]:
    """ASCII lines from the standard library's top-level modules, in a fixed (sorted) order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lines: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        for line in path.read_bytes().splitlines():
            if not line.strip() or not line.isascii():
                continue
            text = line.decode("ascii")
            lines.append(text + "\n")
            total += len(text) + 1
            if total >= limit_bytes:
                return lines
    return lines


def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """Train the byte-level BPE (a `tokenizers.Tokenizer`) on the ASCII corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # No initial_alphabet: the alphabet is only the ASCII bytes seen, so no token is a stray UTF-8 byte.
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[SPECIAL_TOKEN], show_progress=False)
    tok.train_from_iterator(corpus_lines(), trainer=trainer, length=None)
    return tok


def build(out_dir: Path, *, force: bool = False) -> dict:
    """Write the model (config, safetensors weights, tokenizer, generation config) into `out_dir`.

    Skips the work when `out_dir` already holds a build of this builder version (unless `force`).
    Returns the stamp: vocabulary size, safe token-id range, build seconds.
    """
    out_dir = Path(out_dir)
    stamp_path = out_dir / STAMP
    if not force and stamp_path.exists():
        stamp = json.loads(stamp_path.read_text())
        if stamp.get("builder_version") == BUILDER_VERSION:
            return stamp

    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp_path.unlink(missing_ok=True)
    vocab_size, eos_id = _save_tokenizer(out_dir)
    _save_model(out_dir, vocab_size, eos_id)

    stamp = {
        "builder_version": BUILDER_VERSION,
        "vocab_size": vocab_size,
        "special_token_ids": [eos_id],
        "safe_token_ids": [1, vocab_size],
        "max_model_len": MAX_POSITIONS,
        "seed": SEED,
        "build_seconds": round(time.perf_counter() - started, 3),
    }
    stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
    return stamp


def _save_tokenizer(out_dir: Path) -> tuple[int, int]:
    """Train the tokenizer and save it with the chat template; returns (vocabulary size, EOS id)."""
    from transformers import PreTrainedTokenizerFast

    tok = build_tokenizer()
    eos_id = tok.token_to_id(SPECIAL_TOKEN)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKEN,
        eos_token=SPECIAL_TOKEN,
        pad_token=SPECIAL_TOKEN,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return tok.get_vocab_size(), eos_id


def _save_model(out_dir: Path, vocab_size: int, eos_id: int) -> None:
    """Save the seeded random-weight Llama (float32, safetensors) and its generation config."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=4 * HIDDEN_SIZE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HIDDEN_SIZE // HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    model.save_pretrained(out_dir, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    """Command line: build into DIR and print the stamp as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="output folder")
    parser.add_argument("--force", action="store_true", help="rebuild even when DIR holds a build")
    args = parser.parse_args(argv)
    print(json.dumps(build(args.dir, force=args.force)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
