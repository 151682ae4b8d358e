"""The buffer workloads (CartPole- and Atari-sized transitions, rollouts of an episode's length) and
each system's buffer built for them: the one definition every buffer bench and peer measures on."""

from __future__ import annotations

import numpy as np

from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized, Uniform

SHAPES = {"cartpole": ((4,), np.float32), "atari": ((84, 84, 4), np.uint8)}


def make_rollouts(kind: str, n: int, ep_len: int, seed: int = 0) -> list[dict]:
    shape, dtype = SHAPES[kind]
    rng = np.random.default_rng(seed)
    out = []
    for s in range(0, n, ep_len):
        L = min(ep_len, n - s)
        if dtype == np.uint8:
            obs = rng.integers(0, 256, (L + 1, *shape), dtype=np.uint8)
        else:
            obs = rng.standard_normal((L + 1, *shape)).astype(dtype)
        out.append({"obs_all": obs, "action": rng.integers(0, 2, L).astype(np.int64),
                    "reward": np.ones(L, np.float32), "terminated": np.r_[np.zeros(L - 1, bool), [True]]})
    return out


# ----------------------------------------------------------------------------- Conduit
def conduit_buffer(kind: str, capacity: int, prioritized: bool, reuse: int) -> ExperienceBuffer:
    shape, dtype = SHAPES[kind]
    spec = ExperienceSpec.transition(obs_shape=shape, obs_dtype=dtype)
    sel = Prioritized(alpha=0.6, beta=0.4) if prioritized else Uniform()
    return ExperienceBuffer(spec=spec, capacity=capacity, selector=sel, reuse_outputs=reuse)


def conduit_columns(r: dict) -> dict:
    L = r["action"].shape[0]
    return {"obs": r["obs_all"][:-1], "next_obs": r["obs_all"][1:], "action": r["action"], "reward": r["reward"],
            "terminated": r["terminated"], "truncated": np.zeros(L, bool)}


# ----------------------------------------------------------------------------- RLlib
def rllib_buffer(capacity: int, prioritized: bool):
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (
        PrioritizedEpisodeReplayBuffer,
    )
    if prioritized:
        return PrioritizedEpisodeReplayBuffer(capacity=capacity, alpha=0.6)
    return EpisodeReplayBuffer(capacity=capacity)


def rllib_episode(r: dict):
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    L = r["action"].shape[0]
    ep = SingleAgentEpisode(observations=list(r["obs_all"]), actions=list(r["action"]), rewards=list(r["reward"]),
                            terminated=bool(r["terminated"][-1]), len_lookback_buffer=0)
    return ep.to_numpy()


def rllib_columns(episodes) -> dict:
    """The least work that turns RLlib's sampled 1-step episodes into a columnar batch."""
    return {
        "obs": np.stack([e.get_observations(0) for e in episodes]),
        "next_obs": np.stack([e.get_observations(-1) for e in episodes]),
        "action": np.array([e.get_actions(0) for e in episodes]),
        "reward": np.array([e.get_rewards(0) for e in episodes], dtype=np.float32),
        "terminated": np.array([e.is_terminated for e in episodes]),
        "n_step": np.array([e.get_extra_model_outputs("n_step", 0) for e in episodes]),
    }
