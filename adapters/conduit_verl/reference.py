"""The CPU reference workload for the verl adapter: a tiny random Qwen2 and an offline
character tokenizer on a small arithmetic task, with verl's reward manager.

Everything is built from configs: no weights or datasets are downloaded.

    prompt  "a+b="       (a, b in 0..4)
    answer  the sum, then <eos>; reward 1 when the decoded response equals it, 0.5 when it
            starts with it (verl's NaiveRewardManager with a rule-based compute_score), else 0
"""

from __future__ import annotations

import numpy as np
import torch

CHARS = list("0123456789+= ")
SPECIAL = ["<pad>", "<eos>", "<unk>"]


def make_tokenizer():
    """A character-level tokenizer built offline (tokenizers WordLevel + a one-char split)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {t: i for i, t in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters join without spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def make_model(vocab_size: int, *, seed: int = 0, layers: int = 2, hidden: int = 64):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg)


def arithmetic_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """verl compute_score signature: 1.0 for exactly the sum, 0.5 when it starts with it."""
    s, t = solution_str.strip(), str(ground_truth)
    return 1.0 if s == t else (0.5 if s.startswith(t) else 0.0)


def make_reward_manager(tokenizer):
    from verl.workers.reward_manager.naive import NaiveRewardManager
    return NaiveRewardManager(tokenizer=tokenizer, num_examine=0, compute_score=arithmetic_score)


def prompts(rng: np.random.Generator, n: int) -> list[tuple[str, int]]:
    ab = rng.integers(0, 5, (n, 2))
    return [(f"{a}+{b}=", int(a + b)) for a, b in ab]


def log_probs(model, input_ids, attention_mask, resp_len: int, *, grad: bool = False):
    from verl.utils.torch_functional import logprobs_from_logits
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        return logprobs_from_logits(logits[:, -resp_len - 1:-1], input_ids[:, -resp_len:])


def rollout(model, tokenizer, items: list[tuple[str, int]], *, n: int, resp_len: int, seed: int):
    """Sample ``n`` responses per prompt (the upstream actor) and build verl's DataProto."""
    from verl import DataProto
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    p_ids = torch.tensor([tokenizer.encode(p) for p, _ in items]).repeat_interleave(n, 0)
    g = torch.Generator().manual_seed(seed)
    seq = p_ids
    with torch.no_grad():
        for _ in range(resp_len):
            logits = model(input_ids=seq).logits[:, -1]
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)
            seq = torch.cat([seq, nxt], 1)
    resp = seq[:, p_ids.shape[1]:].clone()
    # everything after the first <eos> is padding (kept in the mask as invalid)
    after = torch.cumsum((resp == eos).int(), 1) - (resp == eos).int() > 0
    resp[after] = pad
    am = torch.cat([torch.ones_like(p_ids), (~after).long()], 1)
    B = p_ids.shape[0]
    uid = np.array([f"q{i // n}" for i in range(B)], dtype=object)
    truth = [items[i // n][1] for i in range(B)]
    return DataProto.from_dict(
        tensors={"prompts": p_ids, "responses": resp, "input_ids": torch.cat([p_ids, resp], 1), "attention_mask": am},
        non_tensors={"uid": uid, "data_source": np.array(["arith"] * B, dtype=object),
                     "reward_model": np.array([{"ground_truth": t} for t in truth], dtype=object)})


def policy_update(model, optimizer, batches, *, resp_len: int, clip: float = 0.2, epochs: int = 1):
    """The learner: verl's vanilla PPO-clip policy loss on the delivered update batches."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    cfg = OmegaConf.create({"clip_ratio": clip, "clip_ratio_low": None, "clip_ratio_high": None,
                            "clip_ratio_c": 3.0, "global_batch_info": {}})
    losses = []
    for _ in range(epochs):
        for b in batches:
            lp = log_probs(model, b.batch["input_ids"], b.batch["attention_mask"], resp_len, grad=True)
            loss, _metrics = compute_policy_loss_vanilla(
                old_log_prob=b.batch["old_log_probs"], log_prob=lp, advantages=b.batch["advantages"],
                response_mask=b.batch["response_mask"], loss_agg_mode="token-mean", config=cfg)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    return losses
