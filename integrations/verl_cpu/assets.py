"""What the CPU run trains on, built offline in a folder: a tiny random Qwen2, a byte-level tokenizer, a
parquet arithmetic dataset.

Why each is shaped this way (verl 0.9.1 / transformers 5.10):
- The tokenizer: verl's agent loop builds prompts with Continuous Token, which needs "\\n" to be a
  single token (utils/tokenizer/continuous_token.py:558), and transformers 5.10 loads
  `Qwen2Tokenizer` for `model_type: qwen2` whatever `tokenizer_class` says, rebuilding it from
  vocab + merges. So: byte-level BPE over the 256 byte symbols with no merges (every byte, "\\n"
  included, is one token), ChatML special tokens, `<|im_end|>` as EOS, a ChatML chat template.
- The model: `Qwen2Config` with random weights, 2 layers, hidden 64, saved as safetensors; vocabulary
  exactly the tokenizer's, so the rollout can never sample an id the tokenizer cannot decode;
  untied embeddings, so the actor's weights and the rollout's have the same names.
- The dataset: verl's RL dataset columns (data_source, prompt as chat messages, ability,
  reward_model.ground_truth, extra_info). Prompts are short ("12+7=") so prompt + ChatML framing fits
  in 32 tokens.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
DATA_SOURCE = "conduit/arithmetic"


@dataclass(frozen=True)
class Assets:
    model_dir: str
    train_files: str
    val_files: str
    reward_path: str


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte (the symbols a ByteLevel pre-tokenizer emits), in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def build_tokenizer(out_dir: str):
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    vocab = {symbol: i for i, symbol in enumerate(_byte_symbols())}
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def build_model(out_dir: str, *, vocab_size: int, eos_id: int, pad_id: int, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=eos_id,
        bos_token_id=None,
        pad_token_id=pad_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out_dir)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(out_dir)


def arithmetic_rows(n: int, *, seed: int, split: str) -> list[dict]:
    rng = random.Random(f"{seed}:{split}")
    rows = []
    for index in range(n):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def write_parquet(rows: list[dict], path: str) -> None:
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path)


def build(out_dir: str, *, seed: int = 0, train_size: int = 64, val_size: int = 8) -> Assets:
    """Write model, tokenizer and datasets under `out_dir` (created if missing)."""
    model_dir = os.path.join(out_dir, "model")
    os.makedirs(model_dir, exist_ok=True)
    tokenizer = build_tokenizer(model_dir)
    build_model(
        model_dir,
        vocab_size=len(tokenizer),
        eos_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        seed=seed,
    )
    train = os.path.join(out_dir, "train.parquet")
    val = os.path.join(out_dir, "val.parquet")
    write_parquet(arithmetic_rows(train_size, seed=seed, split="train"), train)
    write_parquet(arithmetic_rows(val_size, seed=seed, split="test"), val)
    reward_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reward.py")
    with open(os.path.join(out_dir, "assets.json"), "w") as f:
        json.dump({"model_dir": model_dir, "train": train, "val": val, "seed": seed}, f)
    return Assets(model_dir=model_dir, train_files=train, val_files=val, reward_path=reward_path)
