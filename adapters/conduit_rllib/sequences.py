"""Sequences from RLlib's uniform ``EpisodeReplayBuffer``, drawn over Conduit's rows.

Two forms, as RLlib 2.60 draws them (``episode_replay_buffer.py``):

- ``sample_episodes=True`` with ``batch_length_T`` (a stateful module's training data,
  ``_sample_episodes``): slices of stored episodes, each ``T`` steps or to the stored end,
  with up to ``lookback`` steps before it; a start with at most ``min_batch_length_T``
  steps left is drawn again (burn-in); slices are drawn until their lengths plus one per
  slice reach ``batch_size_B``.
- ``sample_episodes=False`` (``_sample_batch``, DreamerV3's kind): ``B`` rows of exactly
  ``T`` steps; a row starts at a uniform stored step and, where its episode ends first,
  goes on from the *start* of another episode drawn the same way, with ``is_first`` /
  ``is_last`` / ``is_terminated`` / ``is_truncated`` flags and each row's first reward the
  one before its first observation (0 at an episode's start).

Starts are uniform over stored steps in RLlib's order (``EpisodeIndex``); the decisions
are the methods of ``SequenceRules`` (one each, so a test can break one at a time).
"""

from __future__ import annotations

import numpy as np

from conduit_core import SemanticError


class SequenceRules:
    """RLlib's sequence rules, one decision each."""

    @staticmethod
    def keeps_start(t: int, stored: int, min_T: int) -> bool:
        """Burn-in: a start with at most ``min_T`` steps left in its stored episode is redrawn."""
        return not (min_T > 0 and t + min_T >= stored)

    @staticmethod
    def slice_length(t: int, stored: int, T: int) -> int:
        """``T`` steps, or to the stored episode's end."""
        return min(t + T, stored) - t

    @staticmethod
    def slice_cost(length: int) -> int:
        """What a slice counts toward ``batch_size_B``: its steps plus one, as RLlib counts."""
        return length + 1

    @staticmethod
    def lookback_steps(t: int, lookback: int, stored: int = 0) -> int:
        """Lookback held: none before a stored episode's first step, except the ``stored``
        lookback its first chunk came with (RLlib: ``min(lookback, t + episode.lookback)``)."""
        return min(lookback, t + stored)


def draw_slices(index, rng: np.random.Generator, B: int, T: int, min_T: int,
                rules: SequenceRules) -> list[tuple[int, int, int]]:
    """(episode, start step, length) of each slice of one ``sample_episodes=True`` batch."""
    chosen: list[tuple[int, int, int]] = []
    steps, draws = 0, 0
    while steps < B:
        if draws > 64 * B + 4096:
            raise SemanticError(f"min_batch_length_T={min_T}: {draws} draws found no stored step with more than "
                                f"{min_T} steps left in its episode. Fix: lower min_batch_length_T or store longer "
                                "episodes (RLlib's buffer would loop forever here).")
        g = rng.integers(0, index.total, size=max(8, B // (T + 1) + 1))
        draws += g.size
        ep, ts = index.from_global(g)
        for e, t, n in zip(ep.tolist(), ts.tolist(), index.lengths[ep].tolist()):
            if not rules.keeps_start(t, n, min_T):
                continue
            length = rules.slice_length(t, n, T)
            chosen.append((e, t, length))
            steps += rules.slice_cost(length)
            if steps >= B:
                break
    return chosen


def batch_rows(index, rng: np.random.Generator, B: int, T: int) -> list[list[tuple[int, int]]]:
    """The pieces (episode, first step) each of the ``B`` rows of a ``sample_episodes=False``
    batch is made of: the first at a uniform stored step, the next ones at the start of
    an episode drawn the same way (its drawn step unused, as RLlib discards it)."""
    rows: list[list[tuple[int, int]]] = []
    for _ in range(B):
        pieces, have = [], 0
        while have < T:
            e, t = (int(x[0]) for x in index.from_global(rng.integers(0, index.total, size=1)))
            if pieces:
                t = 0
            pieces.append((e, t))
            have += int(index.lengths[e]) - t + 1  # its observations: steps left plus the last one
        rows.append(pieces)
    return rows


def assemble_batch(rows, index, read, T: int) -> dict[str, np.ndarray]:
    """RLlib's ``_sample_batch`` dict for ``rows`` (see ``batch_rows``): per piece, the
    observations from its first step to its episode's last one, the actions with the last
    one repeated, the reward before the first observation (0 at a step 0 or a continuation)
    then the rewards; cut to ``T`` per row. ``read(seqs) -> columns`` reads stored rows."""
    B = len(rows)
    out = {"is_first": np.zeros((B, T), bool), "is_last": np.zeros((B, T), bool),
           "is_terminated": np.zeros((B, T), bool), "is_truncated": np.zeros((B, T), bool)}
    obs_rows, act_rows, rew_rows = [], [], []
    for b, pieces in enumerate(rows):
        obs, act, rew = [], [], []
        for k, (e, t) in enumerate(pieces):
            n = int(index.lengths[e])
            cols = read(index.seq_at(np.full(n - t, e), np.arange(t, n)))
            out["is_first"][b, min(len(obs), T - 1)] = True
            before = 0.0
            if k == 0 and t > 0:
                before = float(read(index.seq_at(np.array([e]), np.array([t - 1])))["reward"][0])
            obs += list(cols["obs"]) + [cols["next_obs"][-1]]
            act += list(cols["action"]) + [cols["action"][-1]]
            rew += [before] + [float(r) for r in cols["reward"]]
            cut = min(len(obs), T)
            out["is_last"][b, cut - 1] = True
            if cut == len(obs):  # the episode's end is inside the row
                out["is_terminated"][b, cut - 1] = bool(cols["terminated"][-1])
                out["is_truncated"][b, cut - 1] = bool(cols["truncated"][-1]) and not bool(cols["terminated"][-1])
        obs_rows.append(np.stack(obs[:T]))
        act_rows.append(np.stack(act[:T]))
        rew_rows.append(np.asarray(rew[:T]))
    return {"obs": np.stack(obs_rows), "actions": np.stack(act_rows), "rewards": np.stack(rew_rows), **out}
