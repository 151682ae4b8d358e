"""Synthetic RLlib episodes whose observations say where they come from, for differential
tests: obs = [episode number, t], so every delivered row can be checked against the truth."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class TrueEpisode:
    """One episode as stored: rewards[t] and obs[t] for t in 0..len, and how it ends."""

    number: int
    rewards: np.ndarray
    terminated: bool
    truncated: bool

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    def obs(self, t: int) -> np.ndarray:
        return np.array([self.number, t], dtype=np.float32)

    def n_step_return(self, t: int, k: int, gamma: float) -> float:
        return float(sum(gamma ** i * float(self.rewards[t + i]) for i in range(k)))


def info_of(e: int, t: int) -> dict:
    return {"episode": e, "t": t}


def extras_of(e: int, t: int) -> dict:
    """Per-step extra model outputs that name their step: a flat one and a nested one (a
    stateful module's ``state_out`` is a nesting)."""
    return {"logp": np.float32(e * 1000 + t), "state_out": {"h": np.array([e, t, -t], dtype=np.float32)}}


def make_chunks(seed: int, *, episodes: int = 40, lengths=(2, 14), open_last: int = 3, split_every: int = 4,
                with_extras: bool = False, action_dims: int | None = None, reward_dtype=np.float32):
    """RLlib ``SingleAgentEpisode`` chunks in the order an env runner hands them over, and the
    true episodes they make up. Episodes end terminated or truncated (alternating by
    number); the last ``open_last`` are still running (not done); every ``split_every``-th
    episode comes in two chunks with the same id, as RLlib's env runners send them.
    ``with_extras``: infos and extra model outputs that name their (episode, step).
    ``action_dims``: continuous actions of that many float32 dimensions (SAC's), not Discrete(2).
    ``reward_dtype``: float64 gives rewards no float32 holds (Meta-World's)."""
    import gymnasium as gym
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    rng = np.random.default_rng(seed)
    obs_space = gym.spaces.Box(-1e9, 1e9, (2,), np.float32)
    act_space = gym.spaces.Discrete(2) if action_dims is None else gym.spaces.Box(-2, 2, (action_dims,), np.float32)
    chunks, truth = [], []
    for e in range(episodes):
        n = int(rng.integers(*lengths))
        rewards = rng.normal(size=n).astype(reward_dtype)
        is_open = e >= episodes - open_last
        term = (not is_open) and e % 2 == 0
        trunc = (not is_open) and e % 2 == 1
        ep = TrueEpisode(e, rewards, term, trunc)
        truth.append(ep)
        actions = rng.integers(0, 2, n) if action_dims is None else \
            rng.uniform(-2, 2, (n, action_dims)).astype(np.float32)
        cuts = [0, n // 2, n] if (e % split_every == 0 and n >= 2) else [0, n]
        ep_id = f"ep{e}"
        for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            last = b == n
            more = {}
            if with_extras:
                steps = [extras_of(e, t) for t in range(a, b)]
                more = {"infos": [info_of(e, t) for t in range(a, b + 1)],
                        "extra_model_outputs": {"logp": [x["logp"] for x in steps],
                                                "state_out": [x["state_out"] for x in steps]}}
            chunk = SingleAgentEpisode(
                id_=ep_id, observations=[ep.obs(t) for t in range(a, b + 1)], actions=list(actions[a:b]),
                rewards=list(rewards[a:b]), terminated=term and last, truncated=trunc and last,
                observation_space=obs_space, action_space=act_space, t_started=a, len_lookback_buffer=0, **more)
            chunk.to_numpy()
            chunks.append(chunk)
    return chunks, truth


@dataclass
class Rows:
    """Delivered n-step rows, one entry per row: where the window starts (episode, t), its
    length k, the t of its next observation, the return, the flags and the weight."""

    episode: np.ndarray
    t: np.ndarray
    k: np.ndarray
    next_t: np.ndarray
    next_episode: np.ndarray
    ret: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    weight: np.ndarray

    def categories(self, truth: list[TrueEpisode]) -> list[tuple]:
        """(steps left in the episode after the window, window length, terminated,
        truncated) per row: the joint distribution a data plane must not change."""
        lens = np.array([len(truth[e]) for e in self.episode])
        left = lens - self.t - self.k
        return list(zip(left.tolist(), self.k.tolist(), self.terminated.tolist(), self.truncated.tolist()))


def rows_from_rllib(episodes) -> Rows:
    """Rows of RLlib's sample(): a list of 1-step episodes."""
    o0 = np.stack([e.get_observations(0) for e in episodes])
    o1 = np.stack([e.get_observations(-1) for e in episodes])
    emo = [{k: e.get_extra_model_outputs(k) for k in ("n_step", "weights")} for e in episodes]
    return Rows(episode=o0[:, 0].astype(int), t=o0[:, 1].astype(int),
                k=np.array([int(np.asarray(m["n_step"]).reshape(-1)[0]) for m in emo]),
                next_t=o1[:, 1].astype(int), next_episode=o1[:, 0].astype(int),
                ret=np.array([float(np.asarray(e.get_rewards()).reshape(-1)[0]) for e in episodes]),
                terminated=np.array([e.is_terminated for e in episodes]),
                truncated=np.array([e.is_truncated for e in episodes]),
                weight=np.array([float(np.asarray(m["weights"]).reshape(-1)[0]) for m in emo]))


def rows_from_conduit(delivered) -> Rows:
    """Rows of ConduitEpisodeReplayBuffer.sample(): one DeliveredBatch."""
    b = delivered[0].batch
    obs, nxt = b["obs"].numpy(), b["next_obs"].numpy()
    w = b.weights.numpy() if b.weights is not None else np.ones(b.size)
    return Rows(episode=obs[:, 0].astype(int), t=obs[:, 1].astype(int), k=b["n_step"].numpy().astype(int),
                next_t=nxt[:, 1].astype(int), next_episode=nxt[:, 0].astype(int),
                ret=b["reward"].numpy().astype(np.float64), terminated=b["terminated"].numpy().astype(bool),
                truncated=b["truncated"].numpy().astype(bool), weight=w.astype(np.float64))


def check_rows_against_truth(rows: Rows, truth: list[TrueEpisode], gamma: float) -> None:
    """Every delivered row is a true n-step window of its episode: next obs k steps on,
    the discounted return of those k rewards, and the flags of the episode's end exactly
    when the window reaches it."""
    for i in range(rows.t.shape[0]):
        ep, t, k = truth[rows.episode[i]], int(rows.t[i]), int(rows.k[i])
        where = f"row {i} (episode {ep.number}, t={t}, k={k})"
        assert 1 <= k and t + k <= len(ep), f"{where}: the window runs past the episode's {len(ep)} steps"
        assert rows.next_episode[i] == ep.number and rows.next_t[i] == t + k, f"{where}: next obs {rows.next_t[i]}"
        assert abs(rows.ret[i] - ep.n_step_return(t, k, gamma)) < 1e-4, f"{where}: return {rows.ret[i]}"
        at_end = t + k == len(ep)
        assert rows.terminated[i] == (at_end and ep.terminated), f"{where}: terminated={rows.terminated[i]}"
        assert rows.truncated[i] == (at_end and ep.truncated), f"{where}: truncated={rows.truncated[i]}"
