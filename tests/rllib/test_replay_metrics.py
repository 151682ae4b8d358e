"""``get_metrics()``: the whole-buffer replay metrics RLlib's own buffer reports for the same
calls, key for key and value for value (a review found it returned {}: DQN's results lost their
``replay_buffer`` entries)."""

import math

import pytest

from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer

from .rllib_episodes import make_chunks


def _values(metrics: dict) -> dict:
    return {k: v.peek() for k, v in metrics.items()}


def _same(ours: dict, theirs: dict, when: str) -> None:
    assert ours and set(ours) <= set(theirs), (when, set(ours) - set(theirs))
    for k, v in _values(ours).items():
        want = theirs[k].peek()
        assert (math.isnan(v) and math.isnan(want)) or v == want, (when, k, v, want)


@pytest.mark.parametrize("prioritized", [False, True])
def test_get_metrics_reports_what_rllibs_buffer_reports_for_the_same_calls(prioritized):
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer
    chunks, _ = make_chunks(5, episodes=36)
    ours = ConduitEpisodeReplayBuffer(capacity=120, prioritized=prioritized, alpha=0.6)
    theirs = PrioritizedEpisodeReplayBuffer(capacity=120, alpha=0.6) if prioritized else EpisodeReplayBuffer(capacity=120)
    try:
        def sample():
            for buf in (ours, theirs):
                buf.sample(num_items=8, n_step=1, beta=0.4, sample_episodes=True)
        def add(part):   # a few chunks a call, as an env runner's sample (RLlib's prioritized buffer
            for i in range(0, len(part), 3):   # fails on one call that overflows it with new episodes)
                for buf in (ours, theirs):
                    buf.add(part[i:i + 3])
        add(chunks[:24])                    # evictions start (capacity 120)
        sample()
        first = ours.get_metrics()
        _same(first, theirs.get_metrics(), "after adds and a sample")
        assert _values(first)["num_episodes_evicted"] > 0 and _values(first)["num_env_steps_sampled"] == 8
        _same(ours.get_metrics(), theirs.get_metrics(), "again, nothing in between (per-call sums: NaN)")
        add(chunks[24:])
        _same(ours.get_metrics(), theirs.get_metrics(), "an add, no sample")
        sample()
        sample()
        _same(ours.get_metrics(), theirs.get_metrics(), "two samples, no add")
    finally:
        ours.close()
