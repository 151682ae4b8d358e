"""Reward for the arithmetic prompts, loaded by verl as `reward.custom_reward_function.path=<this file>`.

GRPO's advantage is the reward's z-score inside each prompt's group: a 0/1 exact-match score on an
untrained random model is 0 for every sample, every advantage is 0 and the update does nothing. The
partial credit below varies between samples of one group, so the run exercises a real update:
    0.5 * (fraction of the response's characters that are digits)      format credit
  + 0.5 * (fraction of the answer's digits found, in order, in it)     partial answer credit
  = 1.0 when the exact answer is the first number in the response.
"""

from __future__ import annotations

import re


def _in_order_fraction(answer: str, text: str) -> float:
    found, pos = 0, 0
    for ch in answer:
        hit = text.find(ch, pos)
        if hit < 0:
            break
        found, pos = found + 1, hit + 1
    return found / max(len(answer), 1)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    text = solution_str or ""
    answer = str(ground_truth).strip()
    numbers = re.findall(r"\d+", text)
    if numbers and numbers[0] == answer:
        return 1.0
    digits = sum(ch.isdigit() for ch in text) / max(len(text), 1)
    return 0.5 * digits + 0.5 * _in_order_fraction(answer, text)
