"""Found in review (session 22): loads that wrote a state into a buffer it no longer fit, or
into a selector of other settings, state values the format refused without saying where, and
a frame-stack buffer of two shards that failed at its first early eviction."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

import conduit_core.buffer.experience_buffer as buffer_module
from conduit_core import (ExperienceBuffer, ExperienceSpec, FieldSpec, Prioritized, ShardSpec, StateError, Tier,
                          Uniform, state_io)
from conduit_core.schema.framestack import FrameStackCodec
from conduit_core.buffer.migration import begin_migration

from ..helpers import SPEC, rollout


def _rows(buf):
    seqs = buf.ring.live_seqs()
    return seqs, buf.read(seqs)["obs"].numpy()


@pytest.mark.parametrize("selector", [Uniform, Prioritized])
def test_a_migration_that_finishes_during_a_loads_checks_is_checked_against(selector, monkeypatch):
    """The checks ran before the lock: a migration that finished between them (capacity 50 ->
    100) went unseen, and the 50-slot state was written into the 100-slot buffer (garbage rows)."""
    donor = ExperienceBuffer(spec=SPEC, capacity=50, selector=selector(), seed=1)
    for i in range(16):
        donor.add(rollout(5, 5 * i, done_at=4), source=0)
    state = donor.state_dict()
    target = ExperienceBuffer(spec=SPEC, capacity=50, selector=selector(), seed=1)
    target.add(rollout(10, 1000), source=3)
    real = buffer_module.check_state_for
    finished = []

    def checks_then_a_migration_finishes(*args, **kwargs):
        out = real(*args, **kwargs)
        if not finished:
            begin_migration(target, shards=[ShardSpec(Tier.PAGEABLE, 100)], capacity=100).finish()
            finished.append(True)
        return out
    monkeypatch.setattr(buffer_module, "check_state_for", checks_then_a_migration_finishes)
    seqs, obs = _rows(target)
    with pytest.raises(StateError, match="capacity: expected 100, got 50"):
        target.load_state_dict(state)
    after_seqs, after_obs = _rows(target)
    assert target.capacity == 100 and np.array_equal(after_seqs, seqs) and np.array_equal(after_obs, obs)
    assert (target.sample(64)["obs"][:, 0].numpy() >= 1000).all()


@pytest.mark.parametrize("saved, loading, key", [
    (Prioritized(alpha=0.6, eps=1e-6), Prioritized(alpha=1.0, eps=1e-6), "alpha"),
    (Prioritized(alpha=0.6, eps=1e-6), Prioritized(alpha=0.6, eps=0.5), "eps"),
    (Prioritized(alpha=0.6), Prioritized(alpha=0.6, stratified=True), "stratified"),
    (Uniform(replace=True), Uniform(replace=False), "replace"),
])
def test_a_state_of_other_selector_settings_is_refused_naming_the_setting(saved, loading, key):
    """Only the selector's name was compared: (p + eps)^alpha leaves of one setting sat beside
    new leaves of another, a distribution neither setting gives."""
    donor = ExperienceBuffer(spec=SPEC, capacity=40, selector=saved, seed=0)
    donor.add(rollout(12), source=0)
    target = ExperienceBuffer(spec=SPEC, capacity=40, selector=loading, seed=0)
    target.add(rollout(5, 100), source=1)
    with pytest.raises(StateError, match=rf"selector\.{key}: expected"):
        target.load_state_dict(state_io.loads(state_io.dumps(donor.state_dict())))
    assert len(target) == 5


def test_a_state_of_another_beta_loads():
    """beta is only the weights' default (every sample may pass its own): no stored value depends on it."""
    donor = ExperienceBuffer(spec=SPEC, capacity=40, selector=Prioritized(alpha=0.6, beta=0.4), seed=0)
    donor.add(rollout(12), source=0)
    target = ExperienceBuffer(spec=SPEC, capacity=40, selector=Prioritized(alpha=0.6, beta=1.0), seed=0)
    target.load_state_dict(donor.state_dict())
    assert len(target) == 12


def test_state_values_the_format_refuses_are_named_by_their_place():
    back = state_io.loads(state_io.dumps({"a": [np.bool_(True), (1, np.float32(2.5))]}))
    assert back == {"a": [True, (1, 2.5)]} and type(back["a"][0]) is np.bool_ and type(back["a"][1]) is tuple
    assert type(back["a"][1][1]) is np.float32
    with pytest.raises(StateError, match=r"at infos\.obs\[1\]: expected .* got builtins\.object"):
        state_io.dumps({"infos": {"obs": [{}, object()]}})
    with pytest.raises(StateError, match="at infos: expected any other name"):
        state_io.dumps({"infos": {"__conduit_array__": 3}})
    blob = state_io.dumps({"x": np.arange(3)})
    forged = blob.replace(b'"__conduit_array__": 0', b'"__conduit_array__": 7')   # (the checksum re-made below)
    header_len = int.from_bytes(forged[8:16], "little")
    header = forged[20:20 + header_len]
    import zlib
    forged = forged[:16] + zlib.crc32(header).to_bytes(4, "little") + forged[20:]
    with pytest.raises(StateError, match="names no array"):
        state_io.loads(forged)


def test_a_frame_stack_buffer_of_two_shards_evicts_early_as_one_shard_does():
    """Its first early eviction indexed the host column, which two shards do not have (TypeError)."""
    codec = FrameStackCodec(k=3, axis=0, frame_budget=1.0)
    spec = ExperienceSpec([FieldSpec("obs", (3, 5), torch.uint8, codec), FieldSpec("next_obs", (3, 5), torch.uint8, codec),
                           FieldSpec("terminated", (), torch.bool)])
    one = ExperienceBuffer(spec=spec, capacity=40, seed=0)
    two = ExperienceBuffer(spec=spec, capacity=40, seed=0,
                           shards=[ShardSpec(Tier.PAGEABLE, 16), ShardSpec(Tier.PAGEABLE, 24)])
    rng = np.random.default_rng(0)
    for _ in range(40):
        frames = rng.integers(0, 255, (5, 5), dtype=np.uint8)   # a stream of frames, stacked 3 deep
        stacks = np.stack([frames[i:i + 3] for i in range(3)])
        row = {"obs": stacks[:2], "next_obs": stacks[1:], "terminated": np.zeros(2, bool)}
        one.add(row)
        two.add(row)
    assert one.ring.evicted_early == two.ring.evicted_early > 0
    seqs = one.ring.live_seqs()
    assert np.array_equal(seqs, two.ring.live_seqs())
    for name in ("obs", "next_obs"):
        assert torch.equal(one.read(seqs)[name], two.read(seqs)[name])


@settings(max_examples=200, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers(-2**62, 2**62) | st.floats(allow_nan=False) | st.text(max_size=5)
    | st.sampled_from([np.float32(1.5), np.float64(-0.1), np.int8(-3), np.uint64(2**63 + 1), np.bool_(False),
                       np.int64(-2**63), np.float16(0.333)]),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=12))
def test_plain_values_load_as_saved_with_their_types(value):
    """An env's infos (any plain value: tuples, numpy scalars, nested) come back equal and of the same
    types, exactly (a float32 stays a float32 of the same bits); they came back as lists and Python numbers."""
    back = state_io.loads(state_io.dumps({"v": value}))["v"]

    def same(a, b):
        assert type(a) is type(b), (a, b)
        if isinstance(a, (list, tuple)):
            assert len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        elif isinstance(a, dict):
            assert a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        elif isinstance(a, np.generic):
            assert a.tobytes() == b.tobytes()
        else:
            assert a == b
        return True
    same(value, back)


def test_the_tags_are_reserved_and_a_damaged_tag_is_named():
    for tag in ("__conduit_tuple__", "__conduit_scalar__"):
        with pytest.raises(StateError, match="expected any other name"):
            state_io.dumps({"infos": {tag: 1}})
    blob = state_io.dumps({"x": np.float32(1.0)})
    forged = blob.replace(b'"<f4"', b'"<U1"')   # a string dtype, same length
    header_len = int.from_bytes(forged[8:16], "little")
    import zlib
    forged = forged[:16] + zlib.crc32(forged[20:20 + header_len]).to_bytes(4, "little") + forged[20:]
    with pytest.raises(StateError, match="numpy scalar is unreadable"):
        state_io.loads(forged)
