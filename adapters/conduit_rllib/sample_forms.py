"""The buffer's sample forms other than the fast path's ``DeliveredBatch``, read from
the data plane and the ledger.

- ``episodes_of``: delivered rows (a ``Batch`` the data plane selected) as RLlib's
  one-step episodes, with infos if asked (``include_infos``, or a learner pipeline that
  reads episodes);
- ``sequence_slices``: the uniform buffer's slices of stored episodes
  (``sample_episodes=True`` with ``batch_length_T``), drawn by ``sequences.draw_slices``;
- ``batch_form``: the uniform buffer's ``sample_episodes=False`` dict of ``[B, T]``
  arrays (``sequences.batch_rows``).

Each is a function of what it reads (the data plane, the ledger, the infos, the lookback
rows the ingestion kept) and of the RNG and rules it draws with; the buffer keeps the
counts (``get_sampled_timesteps``) and the last batch for ``update_priorities``.
"""

from __future__ import annotations

import numpy as np

from conduit_core import Batch, ConfigError

from .delivered_episodes import EpisodeContext, one_step_episodes, sequence_episode, shard_order
from .sequences import SequenceRules, assemble_batch, batch_rows, draw_slices


def check_infos_stored(store_infos: bool, needed: bool) -> None:
    if needed and not store_infos:
        raise ConfigError("conduit_rllib.enable(store_infos=...)", "True for samples that carry infos "
                          "(include_infos, episode delivery from the uniform buffer, sequences)", False,
                          "drop store_infos=False (RLlib's buffers keep infos with every episode)")


def episodes_of(b: Batch, ledger, infos, *, include_infos: bool, include_extras: bool, uniform: bool,
                lookback: int, ctx: EpisodeContext, learner_shards: int) -> list:
    """The delivered rows as RLlib's one-step episodes (see delivered_episodes)."""
    cols = {k: v.cpu().numpy() for k, v in b.items()}
    index = ledger.index()
    ep, pos = index.locate(b.seqs)
    first = last = None
    if include_infos:
        first = infos.obs_infos(b.seqs)
        last = infos.next_infos(index.seq_at(ep, pos + cols["n_step"].astype(np.int64) - 1))
    episodes = one_step_episodes(
        cols, weights=None if b.weights is None else b.weights.cpu().numpy(), starts=pos, first_infos=first,
        last_infos=last, ids=[index.records[e].id_ for e in ep], include_extras=include_extras,
        uniform=uniform, lookback=lookback, ctx=ctx)
    if learner_shards > 1:  # learner i gets rows i*m.. in order, as on the fast path
        episodes = [episodes[j] for j in shard_order(len(episodes), learner_shards)]
    return episodes


def sequence_slices(edp, ledger, infos, lookback_rows: dict, *, rng: np.random.Generator, rules: SequenceRules,
                    ctx: EpisodeContext, store_infos: bool, B: int, T: int, n_step, lookback: int,
                    min_T: int) -> list:
    """RLlib's uniform sequence slices (``sequences.draw_slices``), as its episodes."""
    if n_step not in (None, 1):
        raise ConfigError("n_step", "1 when sampling sequences (batch_length_T > 0)", repr(n_step),
                          "sample sequences with n_step=1 (RLlib's buffer asserts the same)")
    if lookback < 0 or min_T < 0:
        raise ConfigError("lookback/min_batch_length_T", ">= 0", (lookback, min_T), "pass non-negative ints")
    check_infos_stored(store_infos, True)
    index = ledger.index()
    chosen = draw_slices(index, rng, B, T, min_T, rules)
    extra = [lookback_rows.get(int(index.sources[e])) for e, _, _ in chosen]
    held = [rules.lookback_steps(t, lookback, 0 if x is None else 1) for (_, t, _), x in zip(chosen, extra)]
    # stored rows from max(t - held, 0); a held step before the episode's first is its chunk's lookback
    seqs = [index.seq_at(np.full(t + L - max(t - h, 0), e), np.arange(max(t - h, 0), t + L))
            for (e, t, L), h in zip(chosen, held)]
    cols = {k: v.cpu().numpy() for k, v in edp.read(np.concatenate(seqs)).items()}
    out, at = [], 0
    for (e, t, L), s, h, x in zip(chosen, seqs, held, extra):
        part = {k: v[at:at + s.size] for k, v in cols.items()}
        at += s.size
        rec = index.records[e]
        step_infos = infos.obs_infos(s) + infos.next_infos(s[-1:])
        if h > t:  # the chunk's own lookback step comes first
            part = {k: np.concatenate([np.asarray(x["cols"][k], dtype=v.dtype), v]) for k, v in part.items()}
            step_infos = [x["info"], *step_infos]
        out.append(sequence_episode(part, lookback_steps=h, lookback=lookback, infos=step_infos, id_=rec.id_,
                                    t_started=rec.t_started + t, ctx=ctx))
    return out


def batch_form(edp, ledger, *, rng: np.random.Generator, fields: tuple, B: int,
               T: int) -> tuple[dict[str, np.ndarray], list]:
    """RLlib's ``sample_episodes=False`` dict of ``[B, T]`` arrays (``sequences.batch_rows``),
    and the rows' (episode, first step) pieces it was made of."""
    if not T or T < 1:
        raise ConfigError("batch_length_T", "an int >= 1 for sample_episodes=False", repr(T),
                          "pass batch_length_T (or build the buffer with batch_length_T=...)")
    index = ledger.index()
    rows = batch_rows(index, rng, B, T)
    read = lambda seqs: {k: v.cpu().numpy() for k, v in edp.read(seqs, fields=fields).items()}
    return assemble_batch(rows, index, read, T), rows


def check_rllib_n_step(n_step) -> None:
    """An n-step range as RLlib's buffers take it: a tuple ``(lo, hi)`` with ``lo < hi``
    (``rng.integers(lo, hi)``: RLlib fails on ``lo >= hi`` and on a list)."""
    ints = type(n_step) is tuple and len(n_step) == 2 and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in n_step)
    if not (ints and 1 <= n_step[0] < n_step[1]):
        raise ConfigError("sample(n_step=...)", "an int >= 1 or a tuple (lo, hi) of ints with 1 <= lo < hi (drawn "
                          "from [lo, hi) per item, as RLlib draws it)", repr(n_step), "e.g. n_step=3 or n_step=(2, 5)")
