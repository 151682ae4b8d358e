"""``get_metrics()``: the replay metrics RLlib's own buffer reports for the same calls, key for
key (per agent and per module included) and value for value where the draws are the same
(a review found it returned {}: DQN's results lost their ``replay_buffer`` entries; later
ones found the draws' shape and the per-agent and per-module entries missing)."""

import copy
import math

import numpy as np
import pytest

from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer

from .rllib_episodes import make_chunks

# what a sample's draws look like (distinct steps and episodes, n-step, redraws): equal where
# the draws are RLlib's own (the uniform buffer sharing its RNG); in distribution otherwise
SHAPE = {"num_episodes_per_sample", "num_env_steps_per_sample", "num_env_steps_per_sample_lifetime",
         "env_step_utilization", "actual_n_step", "num_resamples", "num_agent_episodes_per_sample",
         "num_agent_steps_per_sample", "num_agent_steps_per_sample_lifetime", "agent_step_utilization",
         "agent_actual_n_step", "num_agent_resamples", "num_module_episodes_per_sample", "num_module_steps_per_sample",
         "num_module_steps_per_sample_lifetime", "module_step_utilization", "module_actual_n_step",
         "num_module_resamples"}


def _values(metrics: dict, path=()) -> dict:
    out = {}
    for k, v in metrics.items():
        out.update(_values(v, path + (k,)) if isinstance(v, dict) else {path + (k,): v.peek()})
    return out


def _held(metrics: dict, path=()) -> dict:
    """Each Sum / Mean entry's values as RLlib's reduce leaves them (one value: the logger above
    merges these lists, so their length matters, not only what peek() says)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            out.update(_held(v, path + (k,)))
        elif getattr(v, "values", None) is not None:
            out[path + (k,)] = [float(x) for x in v.values]
    return out


def _same(ours: dict, theirs: dict, when: str, *, shape_too: bool) -> dict:
    mine, want = _values(ours), _values(theirs)
    assert set(mine) == set(want), (when, set(mine) ^ set(want))
    assert list(mine) == list(want), when   # in RLlib's order too (whole-buffer, per-agent, per-module)
    held, held_want = _held(ours), _held(theirs)
    assert {k: len(v) for k, v in held.items()} == {k: len(v) for k, v in held_want.items()}, when
    for k, v in mine.items():
        if k[0] in SHAPE and not shape_too:
            continue
        w = want[k]
        assert (math.isnan(v) and math.isnan(w)) or v == pytest.approx(w, rel=1e-12), (when, k, v, w)
    return mine


@pytest.mark.parametrize("prioritized", [False, True])
def test_get_metrics_reports_what_rllibs_buffer_reports_for_the_same_calls(prioritized):
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer
    chunks, _ = make_chunks(5, episodes=36)
    ours = ConduitEpisodeReplayBuffer(capacity=120, prioritized=prioritized, alpha=0.6)
    theirs = PrioritizedEpisodeReplayBuffer(capacity=120, alpha=0.6) if prioritized else EpisodeReplayBuffer(capacity=120)
    if not prioritized:   # the same draws: the draw-shape values must be equal too
        ours.share_rng(copy.deepcopy(theirs.rng))   # (a generator in the same state, its own)
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
        first = _same(ours.get_metrics(), theirs.get_metrics(), "after adds and a sample", shape_too=not prioritized)
        assert first[("num_episodes_evicted",)] > 0 and first[("num_env_steps_sampled",)] == 8
        assert first[("num_agent_steps_sampled", "default_agent")] == 8
        assert first[("actual_n_step",)] == 1 and first[("num_resamples",)] == 0   # (n=1 always fits)
        assert 1 <= first[("num_episodes_per_sample",)] <= first[("num_env_steps_per_sample",)] <= 8
        _same(ours.get_metrics(), theirs.get_metrics(), "again, nothing in between (per-call sums: NaN)",
              shape_too=True)
        add(chunks[24:])
        _same(ours.get_metrics(), theirs.get_metrics(), "an add, no sample", shape_too=True)
        sample()
        sample()
        _same(ours.get_metrics(), theirs.get_metrics(), "two samples, no add", shape_too=not prioritized)
    finally:
        ours.close()


def _shape_per_sample(buf, n_step, samples: int) -> np.ndarray:
    rows = []
    for _ in range(samples):
        buf.sample(num_items=8, n_step=n_step, beta=0.4, sample_episodes=True)
        v = _values(buf.get_metrics())
        rows.append([v[("num_episodes_per_sample",)], v[("num_env_steps_per_sample",)], v[("actual_n_step",)],
                     v[("num_resamples",)]])
    return np.array(rows, dtype=np.float64)


def test_the_draws_shape_has_rllibs_distribution_with_redraws_at_episode_ends():
    """Prioritized draws of n-step (2, 5) windows over short episodes: RLlib redraws an item whose
    window runs past its episode's end and counts it in ``num_resamples``; so does Conduit's
    buffer. Same stored data, equal priorities (none updated): per-sample episodes, distinct
    steps, mean n-step and redraws have the same means, within five standard errors."""
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer
    chunks, _ = make_chunks(7, episodes=30, lengths=(2, 8), open_last=0, split_every=1000)
    ours = ConduitEpisodeReplayBuffer(capacity=1000, prioritized=True, alpha=0.6)
    theirs = PrioritizedEpisodeReplayBuffer(capacity=1000, alpha=0.6)
    try:
        for buf in (ours, theirs):
            buf.add(chunks)
            buf.get_metrics()
        a, b = _shape_per_sample(ours, (2, 5), 600), _shape_per_sample(theirs, (2, 5), 600)
        assert a[:, 3].mean() > 1   # short episodes: redraws happen
        for j, name in enumerate(("episodes", "distinct steps", "n-step", "redraws")):
            se = math.sqrt(a[:, j].var() / len(a) + b[:, j].var() / len(b)) + 1e-12
            assert abs(a[:, j].mean() - b[:, j].mean()) < 5 * se, (name, a[:, j].mean(), b[:, j].mean(), se)
    finally:
        ours.close()


@pytest.mark.parametrize("form", ["sequences", "batch"])
def test_sequence_and_batch_forms_report_rllibs_keys_and_distribution(form):
    """The uniform buffer's sequence slices and ``[B, T]`` batch form: the same keys as RLlib's
    (no n-step for the batch form), the steps sampled exactly, and episodes and distinct steps
    per sample (and the sequences' n-step figure: slices / B) with RLlib's means."""
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    chunks, _ = make_chunks(9, episodes=30, lengths=(3, 12), open_last=0, split_every=1000)
    ours = ConduitEpisodeReplayBuffer(capacity=1000, prioritized=False)
    theirs = EpisodeReplayBuffer(capacity=1000)
    kw = dict(batch_size_B=16, batch_length_T=4, n_step=1, sample_episodes=form == "sequences")
    try:
        rows = {}
        for name, buf in (("ours", ours), ("theirs", theirs)):
            buf.add(chunks)
            buf.get_metrics()
            got = []
            for _ in range(300):
                buf.sample(**kw)
                v = _values(buf.get_metrics())
                got.append(v)
            rows[name] = got
        assert set(rows["ours"][0]) == set(rows["theirs"][0]), set(rows["ours"][0]) ^ set(rows["theirs"][0])
        assert (("actual_n_step",) in rows["ours"][0]) == (form == "sequences")
        drawn = 16 if form == "sequences" else 64
        assert all(v[("num_env_steps_sampled",)] == drawn for v in rows["ours"])
        keys = [("num_episodes_per_sample",), ("num_env_steps_per_sample",)]
        keys += [("actual_n_step",)] if form == "sequences" else []
        for k in keys:
            a = np.array([v[k] for v in rows["ours"]])
            b = np.array([v[k] for v in rows["theirs"]])
            se = math.sqrt(a.var() / len(a) + b.var() / len(b)) + 1e-12
            assert abs(a.mean() - b.mean()) < 5 * se, (k, a.mean(), b.mean(), se)
    finally:
        ours.close()


@pytest.mark.parametrize("first", [True, False])
def test_an_add_of_nothing_is_reported_as_rllib_reports_it(first):
    """DQN's runners may hand over no episode (``sample_timeout_s``): RLlib's buffer logs the add."""
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer
    chunks, _ = make_chunks(3, episodes=6)
    ours, theirs = ConduitEpisodeReplayBuffer(capacity=200, prioritized=True), PrioritizedEpisodeReplayBuffer(capacity=200)
    try:
        for buf in (ours, theirs):
            if not first:
                buf.add(chunks)
                buf.get_metrics()
            buf.add([])
        _same(ours.get_metrics(), theirs.get_metrics(), "after add([])", shape_too=True)
    finally:
        ours.close()


def test_the_root_logger_averages_per_call_means_as_with_rllibs_buffer():
    """Calls covering different numbers of samples (DreamerV3 samples a varying number of times
    between two ``get_metrics()``): the algorithm's logger merges each call's values, so a call
    must hand over its mean, not every value it saw. Same draws (shared RNG)."""
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    chunks, _ = make_chunks(5, episodes=16, lengths=(2, 4), open_last=0, split_every=1000)
    ours, theirs = ConduitEpisodeReplayBuffer(capacity=1000), EpisodeReplayBuffer(capacity=1000)
    ours.share_rng(copy.deepcopy(theirs.rng))
    got = {}
    try:
        for name, buf in (("ours", ours), ("theirs", theirs)):
            root = MetricsLogger(root=True)
            at = 0
            for calls in (3, 1):
                for _ in range(2 * calls - 1):   # 5 adds, then 1: the stored counts' means weigh unequally
                    buf.add(chunks[at:at + 2])
                    at += 2
                for _ in range(calls):
                    buf.sample(num_items=16, n_step=1, sample_episodes=True)
                root.aggregate([buf.get_metrics()], key="replay")
            r = root.reduce(compile=True)["replay"]
            got[name] = (r["env_step_utilization"], r["num_env_steps_stored"], r["agent_step_utilization"]["default_agent"])
        assert got["ours"] == pytest.approx(got["theirs"], rel=1e-12)
    finally:
        ours.close()


def test_redraws_of_batches_drawn_ahead_and_discarded_count_once():
    """A schedule that draws ahead throws a prepared batch away when the priorities change (DQN
    updates them after every sample) and draws it again: its redraws must count once, as in the
    sequential schedule, which delivers the same rows."""
    chunks, _ = make_chunks(7, episodes=30, lengths=(2, 8), open_last=0, split_every=1000)

    def run(options):
        buf = ConduitEpisodeReplayBuffer(capacity=1000, prioritized=True, alpha=0.6, conduit=dict(seed=3, **options))
        try:
            buf.add(chunks)
            buf.get_metrics()
            seqs, redraws = [], 0.0
            for i in range(20):
                buf.sample(num_items=8, n_step=3, beta=0.4, sample_episodes=True)
                seqs.append(buf.last_sampled.seqs.copy())
                buf.update_priorities(np.full(8, 1.0 + i))
                redraws += buf.get_metrics()["num_resamples"].peek()
            return np.concatenate(seqs), redraws
        finally:
            buf.close()

    base_seqs, base_redraws = run({})
    seqs, redraws = run({"mode": "overlapped"})
    assert np.array_equal(seqs, base_seqs) and base_redraws > 0
    assert redraws == base_redraws


def test_the_stats_maker_builds_what_rllibs_constructors_build():
    """``get_metrics()`` builds its Stats objects from copies of ones RLlib's constructors built:
    every field equal to a freshly constructed object's once the values are set as RLlib's
    reduce sets them, containers never shared between objects, clocks read at the call."""
    import collections
    import time

    from ray.rllib.utils.metrics.stats.lifetime_sum import LifetimeSumStats
    from ray.rllib.utils.metrics.stats.mean import MeanStats
    from ray.rllib.utils.metrics.stats.sum import SumStats

    from conduit_rllib.replay_metrics import StatsMaker

    maker = StatsMaker(SumStats, LifetimeSumStats, MeanStats)
    before = time.perf_counter()
    made = dict(zip(("sum", "lifetime", "mean"), maker.build(
        ((maker.SUM, 3.0), (maker.LIFETIME, 7), (maker.mean_kind(100), 2.5)))))
    want = {"sum": SumStats(), "lifetime": LifetimeSumStats(), "mean": MeanStats(window=100)}
    want["sum"].values = [3.0]
    want["lifetime"].push(7)
    want["mean"].values = [2.5]
    for kind, s in made.items():
        w = want[kind]
        assert type(s) is type(w), kind
        ours, theirs = vars(s), vars(w)
        assert set(ours) == set(theirs), kind
        for field, value in theirs.items():
            if isinstance(value, float) and value > 1e3 and value == pytest.approx(time.perf_counter(), abs=60):
                assert before <= ours[field] <= time.perf_counter(), (kind, field)   # a clock: read at build()
            else:
                assert ours[field] == value and type(ours[field]) is type(value), (kind, field, ours[field], value)
        assert s.peek() == w.peek(), kind
    again = maker.build(((maker.SUM, 1.0), (maker.mean_kind(100), 1.0)))
    for a, b in zip(again, (made["sum"], made["mean"])):
        for field, value in vars(a).items():
            if isinstance(value, (dict, list, collections.deque)):
                assert value is not vars(b)[field], field   # never shared



def test_a_stats_field_the_maker_does_not_know_is_left_to_the_constructor():
    """A field of a type the maker cannot copy safely (a lock, a set: what a later RLlib might add)
    makes it build that kind with RLlib's constructor; a NaN default is not taken for a clock."""
    import threading

    from conduit_rllib.replay_metrics import StatsMaker

    built = []

    class Plain:
        def __init__(self, window=None):
            self.values, self.limit, self.t0 = [], float("nan"), 0.5

    class Locked(Plain):
        def __init__(self, window=None):
            super().__init__(window)
            self.guard = threading.Lock()
            built.append(self)

    maker = StatsMaker(Plain, Plain, Locked)
    kind = maker.mean_kind(10)
    assert kind[1] is None   # Locked: by its constructor
    before = len(built)
    a, b = maker.build(((kind, 1.0), (kind, 2.0)))
    assert len(built) == before + 2 and a.guard is not b.guard and (a.values, b.values) == ([1.0], [2.0])
    assert maker.SUM[1] is not None and maker.SUM[3] == ()   # Plain: copied; its NaN field is no clock
