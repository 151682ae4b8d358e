"""Differential: where a config needs RLlib's own sample objects (infos, extra model
outputs, sequences for stateful modules, learner connector pieces of the user's), Conduit's
buffer returns the objects RLlib's buffers return, built from the same stored data.

Every observation, info and extra model output names its (episode, step), so each object
is checked against the truth, and against RLlib's own slice of the same stored episode;
distributions are compared with RLlib's buffers on the same chunks (chi-square)."""

import numpy as np
import pytest

from conduit_core import ConfigError, SemanticError
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer
from conduit_conformance.stats import two_sample_chi2

from .rllib_episodes import extras_of, info_of, make_chunks

P_BOUND = 1e-3


def filled(prioritized: bool, seed: int = 5, **kw):
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer
    chunks, truth = make_chunks(seed, with_extras=True, **kw)
    if prioritized:
        native = PrioritizedEpisodeReplayBuffer(capacity=10_000, alpha=0.6)
    else:
        native = EpisodeReplayBuffer(capacity=10_000)
    native.rng = np.random.default_rng(seed)  # RLlib 2.60 ignores seed= (its rng is default_rng(None))
    ours = ConduitEpisodeReplayBuffer(capacity=10_000, prioritized=prioritized, seed=seed + 1)
    for c in chunks:
        native.add([c])
        ours.add([c])
    return native, ours, truth


def nested_equal(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(nested_equal(a[k], b[k]) for k in a)
    return np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("prioritized", [True, False])
def test_one_step_episodes_carry_infos_and_extra_model_outputs_of_the_true_steps(prioritized):
    native, ours, truth = filled(prioritized)
    gamma = 0.9
    eps = ours.sample(400, sample_episodes=True, n_step=(1, 4), gamma=gamma, include_infos=True,
                      include_extra_model_outputs=True)
    ref = native.sample(num_items=50, n_step=(1, 4), gamma=gamma, include_infos=True,
                        include_extra_model_outputs=True, sample_episodes=True)
    assert len(eps) == 400
    # the form RLlib's buffer of this kind returns: the same keys, lengths and lookbacks
    assert set(eps[0].extra_model_outputs) == set(ref[0].extra_model_outputs)
    assert (len(eps[0]), eps[0].observations.lookback) == (len(ref[0]), ref[0].observations.lookback)
    assert (eps[0].id_ in {f"ep{e}" for e in range(len(truth))}) == (not prioritized)  # uniform keeps ids
    for ep in eps:
        (e, t), (_, t_next) = ep.get_observations(0).astype(int), ep.get_observations(-1).astype(int)
        k = int(np.asarray(ep.get_extra_model_outputs("n_step")).reshape(-1)[0])
        true = truth[e]
        assert t_next == t + k <= len(true)
        assert ep.get_infos() == [info_of(e, t), info_of(e, t + k)]
        assert nested_equal(ep.get_extra_model_outputs("logp")[0], extras_of(e, t)["logp"])
        assert nested_equal(ep.get_extra_model_outputs("state_out")[0], extras_of(e, t)["state_out"])
        assert abs(float(ep.get_rewards()[0]) - true.n_step_return(t, k, gamma)) < 1e-4
        at_end = t + k == len(true)
        assert (ep.is_terminated, ep.is_truncated) == (at_end and true.terminated, at_end and true.truncated)
        assert ep.t_started == t


def test_rllib_uniform_buffer_gives_step_zero_extra_model_outputs():
    """RLlib's uniform buffer reads a one-step item's extra model outputs at index 0 of the
    stored episode (``episode.get_extra_model_outputs(k, 0)``), not at the sampled step: a
    bug of RLlib's that Conduit does not copy (the test above checks the true step)."""
    native, _, _ = filled(False)
    eps = native.sample(num_items=300, n_step=1, include_extra_model_outputs=True, sample_episodes=True)
    wrong = [ep for ep in eps if int(ep.get_observations(0)[1]) > 0]
    assert wrong and all(int(ep.get_extra_model_outputs("logp")[0]) % 1000 == 0 for ep in wrong)


def sequence_rows(eps, lookback: int) -> list[tuple]:
    """(length, steps left after the slice, lookback held) per sequence."""
    return [(len(ep), int(ep.get_observations(-1)[1]), ep.observations.lookback) for ep in eps]


@pytest.mark.parametrize("min_T", [0, 3])
def test_sequences_match_rllib_slices_and_distribution(min_T):
    """Stateful modules (DQN with an LSTM): batch_length_T=5, lookback=1, burn-in
    min_batch_length_T. Each Conduit sequence equals RLlib's own slice of the same stored
    episode field by field; sequence lengths, positions and counts per batch match RLlib's
    distribution."""
    native, ours, truth = filled(False)
    T, lookback, B = 5, 1, 32
    a_seq, b_seq, a_count, b_count = [], [], [], []
    for _ in range(300):
        a = native.sample(num_items=B, batch_length_T=T, n_step=1, lookback=lookback, min_batch_length_T=min_T,
                          sample_episodes=True)
        b = ours.sample(num_items=B, batch_length_T=T, n_step=1, lookback=lookback, min_batch_length_T=min_T,
                        sample_episodes=True)
        a_count.append(len(a))
        b_count.append(len(b))
        a_seq += [(len(e), len(truth[int(e.get_observations(0)[0])]) - int(e.get_observations(0)[1]) - len(e),
                   e.observations.lookback) for e in a]
        b_seq += [(len(e), len(truth[int(e.get_observations(0)[0])]) - int(e.get_observations(0)[1]) - len(e),
                   e.observations.lookback) for e in b]
    p = two_sample_chi2(a_seq, b_seq)
    assert p > P_BOUND, f"(length, steps left, lookback) differ from RLlib's (p={p:.2g})"
    p = two_sample_chi2(a_count, b_count)
    assert p > P_BOUND, f"sequences per batch differ from RLlib's (p={p:.2g})"
    if min_T:
        assert all(length > min_T for length, *_ in b_seq)
    # object for object: RLlib's slice of the same stored episode, at the same start
    for ep in ours.sample(num_items=200, batch_length_T=T, sample_episodes=True, n_step=1, lookback=lookback,
                          min_batch_length_T=min_T):
        e, t = (int(x) for x in ep.get_observations(0))
        stored = native.episodes[native.episode_id_to_index[ep.id_] - native._num_episodes_evicted]
        ref = stored.slice(slice(t, t + len(ep)), len_lookback_buffer=lookback)
        lb = ep.observations.lookback
        assert (ep.id_, len(ep), lb, ep.t_started) == (ref.id_, len(ref), ref.observations.lookback, ref.t_started)
        assert (ep.is_terminated, ep.is_truncated) == (ref.is_terminated, ref.is_truncated)
        span = slice(-lb, len(ep) + 1)
        kw = {"neg_index_as_lookback": True}
        assert np.array_equal(ep.get_observations(span, **kw), ref.get_observations(span, **kw))
        assert ep.get_infos(span, **kw) == ref.get_infos(span, **kw)
        steps = slice(-lb, len(ep))
        assert np.array_equal(ep.get_actions(steps, **kw), ref.get_actions(steps, **kw))
        assert np.allclose(ep.get_rewards(steps, **kw), ref.get_rewards(steps, **kw))
        for key in ("logp", "state_out"):
            assert nested_equal(ep.get_extra_model_outputs(key, steps, **kw),
                                ref.get_extra_model_outputs(key, steps, **kw)), key
        assert ep.extra_model_outputs["n_step"].lookback == lookback  # RLlib sizes these by the asked lookback
        assert len(ep.extra_model_outputs["weights"].data) == len(ep) + lookback


def test_the_prioritized_buffer_ignores_sequence_arguments_as_rllib_does():
    native, ours, _ = filled(True)
    a = native.sample(num_items=16, batch_length_T=5, lookback=1, min_batch_length_T=2, n_step=1)
    b = ours.sample(num_items=16, batch_length_T=5, lookback=1, min_batch_length_T=2, sample_episodes=True, n_step=1)
    assert len(a) == 16 and all(len(e) == 1 for e in a)
    assert b[0].batch.size == 16


def test_sequence_arguments_are_checked():
    _, ours, _ = filled(False)
    with pytest.raises(ConfigError, match="n_step"):
        ours.sample(num_items=8, batch_length_T=5, sample_episodes=True, n_step=3)
    with pytest.raises(SemanticError, match="min_batch_length_T"):  # RLlib would loop forever
        ours.sample(num_items=8, batch_length_T=5, sample_episodes=True, n_step=1, min_batch_length_T=100)


def test_infos_and_sequences_survive_a_state_round_trip():
    _, ours, _ = filled(False)
    state = ours.get_state()
    again = ConduitEpisodeReplayBuffer(capacity=10_000, prioritized=False, seed=99)
    again.set_state(state)
    a = ours.sample(num_items=40, batch_length_T=4, sample_episodes=True, n_step=1, lookback=1)
    b = again.sample(num_items=40, batch_length_T=4, sample_episodes=True, n_step=1, lookback=1)
    assert [(e.id_, e.t_started, len(e)) for e in a] == [(e.id_, e.t_started, len(e)) for e in b]
    assert all(x.get_infos() == y.get_infos() for x, y in zip(a, b))


def test_episodes_for_several_learners_line_up_with_the_rows():
    """With delivery='episodes' and k learners, RLlib's ShardEpisodesIterator must hand
    learner i rows i*m.. in order, so the TD errors (concatenated in learner order) land on
    the rows they were computed on."""
    from ray.rllib.utils.minibatch_utils import ShardEpisodesIterator
    chunks, _ = make_chunks(2, with_extras=True)
    buf = ConduitEpisodeReplayBuffer(capacity=10_000, prioritized=True, seed=3, learner_shards=2,
                                     conduit={"delivery": "episodes"})
    for c in chunks:
        buf.add([c])
    eps = buf.sample(32, sample_episodes=True, n_step=1)
    rows = buf.last_sampled["obs"].numpy()
    parts = list(ShardEpisodesIterator(eps, 2))
    got = np.concatenate([np.stack([e.get_observations(0) for e in part]) for part in parts])
    assert np.array_equal(got, rows)


def check_batch_form_row(b: dict, i: int, truth) -> tuple:
    """One row of RLlib's sample_episodes=False dict against the true episodes: pieces of
    consecutive observations, the first from any step, later ones from an episode's start;
    returns the row's shape (pieces, where the first piece ends, flags) for comparison."""
    obs, rew, first = b["obs"][i], b["rewards"][i], b["is_first"][i]
    T = obs.shape[0]
    starts = np.flatnonzero(first).tolist()
    assert starts and starts[0] == 0
    for k, s0 in enumerate(starts):
        s1 = starts[k + 1] if k + 1 < len(starts) else T
        e, t0 = (int(x) for x in obs[s0])
        assert k == 0 or t0 == 0, f"row {i}: a continuation starts at step {t0}, not 0"
        ep = truth[e]
        assert np.array_equal(obs[s0:s1, 0], np.full(s1 - s0, e)) and np.array_equal(obs[s0:s1, 1], np.arange(t0, t0 + s1 - s0))
        want_first = float(ep.rewards[t0 - 1]) if (k == 0 and t0 > 0) else 0.0
        assert abs(rew[s0] - want_first) < 1e-6
        assert np.allclose(rew[s0 + 1:s1], ep.rewards[t0:t0 + s1 - s0 - 1])
        ends_inside = t0 + (s1 - s0) - 1 == len(ep)
        if s1 < T or ends_inside:
            assert b["is_last"][i, s1 - 1]
            assert b["is_terminated"][i, s1 - 1] == (ends_inside and ep.terminated)
            assert b["is_truncated"][i, s1 - 1] == (ends_inside and ep.truncated)
    return (len(starts), starts[1] if len(starts) > 1 else T, int(b["is_terminated"][i].sum()),
            int(b["is_truncated"][i].sum()), bool(b["is_last"][i, -1]))


def test_the_batch_form_matches_rllib():
    """sample_episodes=False (RLlib's [B, T] dict, DreamerV3's kind): every row as RLlib
    builds it, checked against the truth for both buffers, and the same distribution of row
    shapes (pieces, first piece's length, flags)."""
    native, ours, truth = filled(False)
    a_rows, b_rows = [], []
    for _ in range(60):
        a = native.sample(batch_size_B=16, batch_length_T=8, sample_episodes=False)
        b = ours.sample(batch_size_B=16, batch_length_T=8, sample_episodes=False)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
        a_rows += [check_batch_form_row(a, i, truth) for i in range(16)]
        b_rows += [check_batch_form_row(b, i, truth) for i in range(16)]
    p = two_sample_chi2(a_rows, b_rows)
    assert p > P_BOUND, f"row shapes differ from RLlib's (p={p:.2g})"


def test_without_stored_infos_a_sample_that_carries_them_is_refused():
    chunks, _ = make_chunks(4, with_extras=True)
    buf = ConduitEpisodeReplayBuffer(capacity=10_000, prioritized=False, seed=1, conduit={"store_infos": False})
    for c in chunks:
        buf.add([c])
    assert buf.sample(16, sample_episodes=True, n_step=1)[0].batch.size == 16          # columns carry no infos: fine
    with pytest.raises(ConfigError, match="store_infos"):
        buf.sample(16, sample_episodes=True, n_step=1, include_infos=True)
    with pytest.raises(ConfigError, match="store_infos"):
        buf.sample(num_items=16, batch_length_T=4, sample_episodes=True, n_step=1)
    assert buf.get_state()["infos"]["seqs"] == []


def test_a_restored_buffer_rebuilds_episodes_with_the_spaces_and_ids():
    """The spaces and agent/module ids of rebuilt episodes come from the chunks; a restored
    buffer takes them from its next chunk (they are not part of the saved state)."""
    chunks, _ = make_chunks(6, with_extras=True)
    ours = ConduitEpisodeReplayBuffer(capacity=10_000, prioritized=False, seed=1)
    for c in chunks[:-1]:
        ours.add([c])
    again = ConduitEpisodeReplayBuffer(capacity=10_000, prioritized=False, seed=1)
    again.set_state(ours.get_state())
    again.add([chunks[-1]])
    ep = again.sample(num_items=8, batch_length_T=3, sample_episodes=True, n_step=1)[0]
    assert ep.observation_space == chunks[0].observation_space and ep.action_space == chunks[0].action_space


def test_uneven_learner_parts_are_refused_not_duplicated():
    from conduit_rllib.delivered_episodes import shard_order
    assert sorted(shard_order(12, 3)) == list(range(12))
    with pytest.raises(ConfigError, match="multiple of the 3 learners"):
        shard_order(10, 3)


def test_a_stored_episode_that_starts_mid_way_keeps_its_chunks_lookback():
    """RLlib's env runners hand a running episode's next chunk over with one lookback step;
    a stored episode that starts with such a chunk (its earlier steps evicted) keeps it, and
    RLlib's slices at its first step hold it as lookback, which a stateful module reads its
    state from. Conduit's slices equal RLlib's there, lookback step and all, also after a
    state round trip."""
    import gymnasium as gym
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    e, t0, n = 3, 8, 6   # steps 8..13 of episode 3, with step 7 as lookback
    steps = range(t0 - 1, t0 + n)
    chunk = SingleAgentEpisode(
        id_="ep3", observations=[np.array([e, t], np.float32) for t in range(t0 - 1, t0 + n + 1)],
        actions=[t % 2 for t in steps], rewards=[float(t) for t in steps],
        infos=[info_of(e, t) for t in range(t0 - 1, t0 + n + 1)],
        extra_model_outputs={"logp": [extras_of(e, t)["logp"] for t in steps],
                             "state_out": [extras_of(e, t)["state_out"] for t in steps]},
        observation_space=gym.spaces.Box(-1e9, 1e9, (2,), np.float32), action_space=gym.spaces.Discrete(2),
        t_started=t0, len_lookback_buffer=1)
    chunk.to_numpy()
    native = EpisodeReplayBuffer(capacity=100)
    native.add([chunk])
    ours = ConduitEpisodeReplayBuffer(capacity=100, prioritized=False, seed=2)
    ours.add([chunk])
    restored = ConduitEpisodeReplayBuffer(capacity=100, prioritized=False, seed=2)
    restored.set_state(ours.get_state())
    stored = native.episodes[0]
    kw = {"neg_index_as_lookback": True}
    for buf in (ours, restored):
        for ep in buf.sample(num_items=60, batch_length_T=3, sample_episodes=True, n_step=1, lookback=1):
            t = int(ep.get_observations(0)[1]) - t0
            ref = stored.slice(slice(t, t + len(ep)), len_lookback_buffer=1)
            lb = ep.observations.lookback
            assert (lb, ep.t_started, len(ep)) == (ref.observations.lookback, ref.t_started, len(ref)) and lb == 1
            assert np.array_equal(ep.get_observations(slice(-lb, len(ep) + 1), **kw),
                                  ref.get_observations(slice(-lb, len(ep) + 1), **kw))
            assert ep.get_infos(slice(-lb, len(ep) + 1), **kw) == ref.get_infos(slice(-lb, len(ep) + 1), **kw)
            for key in ("logp", "state_out"):
                assert nested_equal(ep.get_extra_model_outputs(key, slice(-lb, len(ep)), **kw),
                                    ref.get_extra_model_outputs(key, slice(-lb, len(ep)), **kw)), key
            assert np.allclose(ep.get_rewards(slice(-lb, len(ep)), **kw), ref.get_rewards(slice(-lb, len(ep)), **kw))
