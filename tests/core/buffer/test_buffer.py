import numpy as np
import pytest
import torch
from scipy import stats

from conduit_core import (CapacityError, ConfigError, ExperienceBuffer, ExperienceTimeout, Fifo, Prioritized,
                          RateLimiter, RateLimitError, RateLimitTimeout, SemanticError, ShardSpec, Tier, even_shards)
from conduit_core.buffer.experience_buffer import prioritized_replay, queue, replay

from ..helpers import SPEC, rollout

TIERS_CPU = ["pageable", "shared"]
TIERS_GPU = ["pinned", "device"]


def tier_param(t):
    marks = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pinned/device tier)")] \
        if t in TIERS_GPU else []
    return pytest.param(t, marks=marks, id=t)


ALL_TIERS = [tier_param(t) for t in TIERS_CPU + TIERS_GPU]


@pytest.mark.parametrize("tier", ALL_TIERS)
@pytest.mark.parametrize("nshards", [1, 3])
def test_write_gather_round_trip_on_every_tier_and_sharding(tier, nshards):
    shards = even_shards(50, [tier] * nshards, device="cuda" if tier == "device" else None)
    buf = ExperienceBuffer(spec=SPEC, capacity=50, shards=shards)
    for i in range(7):  # 70 items: wraps around the ring and across shard boundaries
        buf.add(rollout(10, 10 * i))
    b = buf.sample(64)
    assert b["obs"].device.type == "cpu"
    np.testing.assert_array_equal(b["obs"][:, 0].numpy(), b.seqs.astype(np.float32))
    assert (b.seqs >= 20).all()  # the first 20 were overwritten
    buf.close()


def test_mixed_tier_shards_and_output_device():
    shards = [ShardSpec("pageable", 10), ShardSpec("shared", 15)]
    buf = ExperienceBuffer(spec=SPEC, capacity=25, shards=shards, reuse_outputs=2)
    buf.add(rollout(25))
    b = buf.sample(100)
    np.testing.assert_array_equal(b["obs"][:, 0].numpy(), b.seqs.astype(np.float32))
    buf.close()


def test_unavailable_tier_gets_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="tier.*pageable"):
        ExperienceBuffer(spec=SPEC, capacity=10, tier="pinned")
    with pytest.raises(ConfigError, match="one of"):
        ExperienceBuffer(spec=SPEC, capacity=10, tier="nvme")


def test_batch_larger_than_capacity_is_rejected():
    buf = ExperienceBuffer(spec=SPEC, capacity=5)
    with pytest.raises(CapacityError, match="capacity=5.*got 6.*Fix"):
        buf.add(rollout(6))
    assert len(buf) == 0


def test_uniform_sampling_passes_chi_square():
    buf = replay(spec=SPEC, capacity=64, seed=3)
    buf.add(rollout(64))
    counts = np.zeros(64)
    for _ in range(200):
        b = buf.sample(256)
        counts += np.bincount(b.seqs, minlength=64)
    p = stats.chisquare(counts).pvalue
    assert p > 1e-3, p


def test_prioritized_sampling_passes_chi_square_and_weights_match_rllib_formula():
    alpha, beta = 0.7, 0.5
    buf = prioritized_replay(spec=SPEC, capacity=40, alpha=alpha, beta=beta, seed=5)
    buf.add(rollout(40))
    b = buf.sample(40)
    prios = np.linspace(0.1, 4.0, 40)
    buf.update_priorities(np.arange(40), prios, slots_only=True)
    counts = np.zeros(40)
    for _ in range(300):
        b = buf.sample(256)
        counts += np.bincount(b.slots, minlength=40)
    p = (prios + 1e-6) ** alpha
    expected = p / p.sum() * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    # weights: (N P(i))^-beta normalised by the max weight (from the min priority), as RLlib
    b = buf.sample(16)
    P = p / p.sum()
    want = (40 * P[b.slots]) ** -beta / (40 * P.min()) ** -beta
    np.testing.assert_allclose(b.weights.numpy(), want, rtol=1e-5)


def test_prioritized_never_samples_empty_or_zero_priority_slots():
    buf = prioritized_replay(spec=SPEC, capacity=1000, seed=0)
    buf.add(rollout(10))
    buf.update_priorities(np.arange(10), np.r_[np.zeros(9), [1.0]] , slots_only=True)
    b = buf.sample(500)
    assert set(b.slots.tolist()) <= set(range(10))


def test_priority_updates_skip_overwritten_slots():
    buf = prioritized_replay(spec=SPEC, capacity=10, seed=0)
    buf.add(rollout(10))
    b = buf.sample(10)
    buf.add(rollout(5, 100))  # overwrites slots 0..4
    n = buf.update_priorities(b.slots, np.full(10, 9.0), seqs=b.seqs)
    assert n == int((b.slots >= 5).sum())


def test_bad_priorities_are_rejected():
    buf = prioritized_replay(spec=SPEC, capacity=10)
    buf.add(rollout(4))
    with pytest.raises(ValueError, match="finite"):
        buf.update_priorities(np.arange(2), [1.0, np.nan], slots_only=True)
    with pytest.raises(ValueError, match="one per"):
        buf.update_priorities(np.arange(2), [1.0], slots_only=True)


def test_n_step_returns_respect_episode_end_and_interleaved_sources():
    buf = replay(spec=SPEC, capacity=100, seed=0)
    # Source A: steps 0..5 with termination at step 3; source B interleaved in the ring.
    a = rollout(6, 0, done_at=3)
    a["reward"] = np.arange(6, dtype=np.float32)
    buf.add({k: v[:2] for k, v in a.items()}, source=1)
    buf.add(rollout(3, 1000, source_tag=2), source=2)
    buf.add({k: v[2:] for k, v in a.items()}, source=1)
    g = 0.5
    b = buf.sample(400, n_step=3, gamma=g)
    obs0 = b["obs"][:, 0].numpy()
    for i in np.flatnonzero(obs0 == 0):
        assert b["n_step"][i] == 3 and b["reward"][i] == pytest.approx(0 + g * 1 + g * g * 2)
        assert b["next_obs"][i, 0] == 3  # next_obs of step 2
    for i in np.flatnonzero(obs0 == 2):  # 2 -> 3 (terminal): only 2 steps
        assert b["n_step"][i] == 2 and b["reward"][i] == pytest.approx(2 + g * 3)
        assert bool(b["terminated"][i])
    for i in np.flatnonzero(obs0 == 4):  # new episode after the terminal step; 5 is the chunk's end
        assert b["n_step"][i] == 2 and b["reward"][i] == pytest.approx(4 + g * 5)


def test_random_n_step_range_follows_rllib_half_open_convention():
    buf = replay(spec=SPEC, capacity=100, seed=0)
    buf.add(rollout(100))
    b = buf.sample(2000, n_step=(2, 5))
    inside = b["obs"][:, 0].numpy() < 96  # the last items have no successors yet
    assert set(np.unique(b["n_step"].numpy()[inside])) == {2, 3, 4}


def test_sequences_mask_after_episode_end():
    buf = replay(spec=SPEC, capacity=100, seed=0)
    buf.add(rollout(5, 0, done_at=2), source=0)
    buf.add(rollout(5, 10), source=1)
    b = buf.sample_sequences(200, 4)
    obs = b["obs"][..., 0].numpy()
    mask = b["mask"].numpy()
    for row, m in zip(obs, mask):
        real = row[m]
        assert np.all(np.diff(real) == 1)  # consecutive steps of one episode
        if real[0] <= 2:
            assert real[-1] <= 2  # never crosses the terminal step 2
    assert obs.shape == (200, 4)


def test_fifo_consume_once_in_order_with_policy_version_isolation():
    buf = queue(spec=SPEC, capacity=30)
    buf.add(rollout(5, 0), policy_version=0)
    buf.add(rollout(5, 5), policy_version=1)
    b = buf.take(None, policy_version=1)
    np.testing.assert_array_equal(b.seqs, np.arange(5, 10))
    assert buf.dropped_stale == 5 and len(buf) == 0
    buf.add(rollout(4, 10), policy_version=1)
    assert buf.take(2, policy_version=1).seqs.tolist() == [10, 11]
    assert buf.take(2, policy_version=1).seqs.tolist() == [12, 13]
    buf.add(rollout(2, 20), policy_version=3)
    with pytest.raises(SemanticError, match="version"):
        buf.take(None, policy_version=2)
    with pytest.raises(ExperienceTimeout):
        buf.take(5, policy_version=3, wait=False)


def test_fifo_never_overwrites_unconsumed_data():
    buf = ExperienceBuffer(spec=SPEC, capacity=10, selector=Fifo(),
                           rate_limiter=RateLimiter(on_limit="block", timeout=0.2))
    buf.add(rollout(8))
    with pytest.raises(RateLimitTimeout, match="lose on-policy data"):
        buf.add(rollout(5))
    assert len(buf) == 8
    buf.take(5)
    buf.add(rollout(5))
    assert len(buf) == 8


def test_rate_limiter_min_size_and_samples_per_insert():
    rl = RateLimiter(min_size=5, samples_per_insert=2.0, tolerance=4.0, on_limit="raise")
    buf = ExperienceBuffer(spec=SPEC, capacity=100, rate_limiter=rl)
    buf.add(rollout(3))
    with pytest.raises(RateLimitError, match="min_size is 5"):
        buf.sample(1)
    buf.add(rollout(2))  # 5 inserted -> 10 samples allowed (+4 tolerance)
    buf.sample(10)
    buf.sample(4)
    with pytest.raises(RateLimitError, match="samples_per_insert"):
        buf.sample(1)
    with pytest.raises(ConfigError, match="deadlock"):
        RateLimiter(samples_per_insert=8, tolerance=1)


def test_rate_limiter_blocks_then_times_out_with_reason():
    rl = RateLimiter(min_size=3, on_limit="block", timeout=0.1)
    buf = ExperienceBuffer(spec=SPEC, capacity=10, rate_limiter=rl)
    with pytest.raises(RateLimitTimeout, match="min_size"):
        buf.sample(1)


@pytest.mark.parametrize("selector", ["uniform", "prioritized", "fifo"])
def test_state_dict_round_trip_is_exact(tmp_path, selector):
    from conduit_core import Uniform, state_io
    sel = {"uniform": Uniform, "prioritized": Prioritized, "fifo": Fifo}[selector]
    a = ExperienceBuffer(spec=SPEC, capacity=30, selector=sel(), seed=7)
    for i in range(3 if selector == "fifo" else 5):
        a.add(rollout(8, 8 * i), source=i % 2, policy_version=0 if selector == "fifo" else i)
    if selector == "prioritized":
        b0 = a.sample(8)
        a.update_priorities(b0.slots, np.arange(8) + 1.0, slots_only=True)
    if selector == "fifo":
        a.take(3)
    path = tmp_path / "buf.conduit"
    state_io.save(a.state_dict(), path)
    b = ExperienceBuffer(spec=SPEC, capacity=30, selector=sel(), seed=99)
    b.load_state_dict(state_io.load(path))
    for _ in range(3):
        if selector == "fifo":
            x, y = a.take(4), b.take(4)
        else:
            x, y = a.sample(16, n_step=2), b.sample(16, n_step=2)
        assert all(torch.equal(x[k], y[k]) for k in x)
        np.testing.assert_array_equal(x.seqs, y.seqs)
    a.add(rollout(3, 500), source=1)
    b.add(rollout(3, 500), source=1)
    assert a.state_dict()["counters"] == b.state_dict()["counters"]


def test_state_mismatch_is_rejected_before_anything_changes():
    from conduit_core import StateError
    a = ExperienceBuffer(spec=SPEC, capacity=30)
    a.add(rollout(4))
    b = ExperienceBuffer(spec=SPEC, capacity=31)
    with pytest.raises(StateError, match="capacity"):
        b.load_state_dict(a.state_dict())
    assert len(b) == 0


def test_close_frees_shared_memory_and_rejects_calls():
    import glob
    from conduit_core import ClosedError
    buf = ExperienceBuffer(spec=SPEC, capacity=100, tier=Tier.SHARED)
    names = [n for names in buf.storage.shared_segment_names().values() for n in names]
    assert names and all(glob.glob(f"/dev/shm/{n}") for n in names)
    buf.close()
    assert not any(glob.glob(f"/dev/shm/{n}") for n in names)
    with pytest.raises(ClosedError):
        buf.add(rollout(1))


def test_n_step_c_walk_equals_numpy_walk():
    import conduit_core.buffer.episodes as ep
    if ep._c_nstep is None:
        pytest.skip("C helper not built")
    buf = replay(spec=SPEC, capacity=64, seed=0)
    rng = np.random.default_rng(0)
    for i in range(30):  # interleaved sources, random episode ends, ring overwrites
        r = rollout(int(rng.integers(1, 6)), 10 * i, done_at=None)
        r["reward"] = rng.standard_normal(r["reward"].shape).astype(np.float32)
        r["terminated"] = rng.random(r["terminated"].shape) < 0.2
        buf.add(r, source=int(rng.integers(0, 3)))
    slots = rng.integers(0, 64, 500)
    n = rng.integers(1, 6, 500)
    a = buf.walk.n_step_returns(buf.ring, buf.storage, slots, n, 0.9)
    b = buf.walk.n_step_returns_numpy(buf.ring, buf.storage, slots, n, 0.9)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
