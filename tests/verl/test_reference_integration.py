"""The CPU reference integration: GRPO through Conduit with verl's functions learns."""

import importlib.util
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("verl", reason="needs verl[verl-core]")


def load_integration():
    path = Path(__file__).resolve().parents[2] / "integrations" / "verl_grpo_cpu.py"
    spec = importlib.util.spec_from_file_location("verl_grpo_cpu", path)
    mod = importlib.util.module_from_spec(spec)
    import sys
    sys.modules["verl_grpo_cpu"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_reward_rises_over_the_run():
    mod = load_integration()
    rewards = mod.main(mod.Args(iterations=200, seed=0))
    first, last = sum(rewards[:20]) / 20, sum(rewards[-20:]) / 20
    assert first < 0.15, first          # a random policy rarely answers
    assert last > 0.5 and last > 4 * first, (first, last)
