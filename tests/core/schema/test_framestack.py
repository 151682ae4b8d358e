"""Frame stacks stored once per frame: lossless, ~1 frame per transition, safe eviction."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core import AffineCodec, CapacityError, ExperienceBuffer, ExperienceSpec, Fifo, Prioritized
from conduit_core.schema.framestack import FrameStackCodec

H, K = 12, 4


def episode(T, rng, *, axis=-1):
    """RLlib-style: frames normalised as q/128 - 1, stacked on `axis`, reset repeats frame 0."""
    frames = rng.integers(0, 256, (T + 1, H, H), dtype=np.uint8)
    stacks = np.stack([np.stack([frames[max(0, t - K + 1 + i)] for i in range(K)], axis=axis) for t in range(T + 1)])
    return stacks.astype(np.float32) / 128.0 - 1.0


def make(capacity, *, axis=-1, selector=None, budget=1.125):
    codec = FrameStackCodec(k=K, axis=axis, inner=AffineCodec.divide(128, offset=-1.0), frame_budget=budget)
    shape = (H, H, K) if axis == -1 else (K, H, H)
    spec = ExperienceSpec.transition(obs_shape=shape, obs_codec=codec)
    return ExperienceBuffer(spec=spec, capacity=capacity, selector=selector, seed=0)


def fill(buf, rng, lengths, chunk=16, axis=-1):
    truth, gid = {}, 0
    for e, T in enumerate(lengths):
        st = episode(T, rng, axis=axis)
        for s in range(0, T, chunk):
            n = min(chunk, T - s)
            term = np.zeros(n, bool)
            term[-1] = s + n == T
            ids = np.arange(gid, gid + n)
            buf.add({"obs": st[s:s + n], "next_obs": st[s + 1:s + n + 1], "action": ids, "reward": np.zeros(n, np.float32),
                     "terminated": term, "truncated": np.zeros(n, bool)}, source=e % 3)
            for i in range(n):
                truth[gid + i] = (st[s + i], st[s + i + 1])
            gid += n
    return truth


def assert_exact(batch, truth):
    for i in range(batch.size):
        o, no = truth[int(batch["action"][i])]
        assert np.array_equal(batch["obs"][i].numpy(), o) and np.array_equal(batch["next_obs"][i].numpy(), no)


@pytest.mark.parametrize("axis", [-1, 0])
def test_stacks_round_trip_bit_exact_with_about_one_frame_per_transition(axis):
    rng = np.random.default_rng(0)
    buf = make(3000, axis=axis)
    truth = fill(buf, rng, [300, 250, 400], axis=axis)
    assert_exact(buf.sample(300), truth)
    pool = buf.storage.pools["frames"]
    assert pool.cursor <= len(truth) + 3 * (K + 1) * 3  # ~1 new frame per step, k per episode start
    b = buf.sample(8)
    assert b["obs"].dtype == torch.float32 and b["obs"].is_contiguous()


def test_short_episodes_evict_oldest_rows_early_and_never_deliver_garbage():
    rng = np.random.default_rng(1)
    buf = make(200, budget=1.0)
    truth = fill(buf, rng, [2] * 150, chunk=2)  # 2-step episodes need ~3.5 frames per step
    assert buf.ring.evicted_early > 0
    assert len(buf) < 200
    for _ in range(20):
        b = buf.sample(64, n_step=3, gamma=0.9)
        assert (b.seqs >= buf.inserted - len(buf)).all()  # only live rows
        for i in range(b.size):
            assert np.array_equal(b["obs"][i].numpy(), truth[int(b["action"][i])][0])


def test_prioritized_never_samples_early_evicted_rows():
    rng = np.random.default_rng(2)
    buf = make(100, selector=Prioritized(), budget=1.0)
    truth = fill(buf, rng, [1] * 120, chunk=1)
    assert buf.ring.evicted_early > 0
    b = buf.sample(500)
    assert (b.seqs >= buf.inserted - len(buf)).all()
    assert_exact(b, truth)


def test_fifo_refuses_to_evict_unconsumed_rows():
    rng = np.random.default_rng(3)
    buf = make(100, selector=Fifo(), budget=1.0)
    with pytest.raises(CapacityError, match="unconsumed"):
        fill(buf, rng, [1] * 80, chunk=1)


def test_state_round_trip_includes_the_frame_pool():
    rng = np.random.default_rng(4)
    a = make(500)
    fill(a, rng, [120, 90])
    b = make(500)
    b.load_state_dict(a.state_dict())
    x, y = a.sample(32), b.sample(32)
    assert all(torch.equal(x[k], y[k]) for k in x)


def test_bad_stack_axis_is_a_clear_error():
    from conduit_core import SpecError
    with pytest.raises(SpecError, match="stacked frames"):
        ExperienceSpec.transition(obs_shape=(H, H, 3), obs_codec=FrameStackCodec(k=4, axis=-1))


@pytest.mark.parametrize("k", [1, 3, 4])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("inner", ["atari", "divide255", "identity"])
def test_native_stack_gather_equals_the_numpy_route(k, axis, inner):
    """The C pass (gather + layout + table decode) returns bit for bit what the numpy route does,
    for every layout, stack depth and codec, including ids that wrap the pool's ring."""
    from conduit_core.schema.codecs import IdentityCodec
    from conduit_core.schema.framestack import FramePool, PooledDecoder

    codec_inner = {"atari": AffineCodec.divide(128, offset=-1.0), "divide255": AffineCodec.divide(255),
                   "identity": IdentityCodec()}[inner]
    codec = FrameStackCodec(k=k, axis=axis, inner=codec_inner)
    pool = FramePool(name="frames", frames=97, frame_shape=(5, 7), dtype=torch.uint8, k=k)
    pool.frames[:] = np.random.default_rng(k).integers(0, 256, pool.frames.shape, dtype=np.uint8)
    pool.cursor = 500
    native, plain = PooledDecoder(pool, codec), PooledDecoder(pool, codec)
    assert native._native == (axis != 1)  # a middle stacking axis keeps the numpy route
    plain._native = False
    ids = torch.from_numpy(np.random.default_rng(1).integers(400, 500, (6, 5)))  # any batch shape
    dtype = torch.uint8 if inner == "identity" else torch.float32
    a, b = native.decode(ids, dtype), plain.decode(ids, dtype)
    assert a.dtype == b.dtype == dtype and a.shape == b.shape
    assert torch.equal(a, b)
    if inner != "identity":  # float64 has no table: the numpy route, same values
        assert torch.equal(native.decode(ids, torch.float64), plain.decode(ids, torch.float64))


@pytest.mark.parametrize("frame_shape", [(84, 84), (5, 7), (4, 4), (3, 5)])
@pytest.mark.parametrize("inner", ["atari", "divide255", "divide127.5", "scale0.1", "divide3"])
def test_vectorised_decode_equals_the_table_bit_for_bit(frame_shape, inner):
    """RLlib's layout (k = 4 last) decoded with vector arithmetic (q * a + offset or q / a +
    offset, chosen only where it reproduces the codec's table for all 256 values) against the
    lookup per byte: the same bits, for frames whose pixel count leaves a tail (35, 15) or none."""
    from conduit_core.schema.framestack import FramePool, PooledDecoder

    codec_inner = {"atari": AffineCodec.divide(128, offset=-1.0), "divide255": AffineCodec.divide(255),
                   "divide127.5": AffineCodec.divide(127.5, offset=-1.0), "scale0.1": AffineCodec(scale=0.1, offset=0.5),
                   "divide3": AffineCodec.divide(3, offset=0.25)}[inner]
    codec = FrameStackCodec(k=4, axis=-1, inner=codec_inner)
    pool = FramePool(name="frames", frames=300, frame_shape=frame_shape, dtype=torch.uint8, k=4)
    values = np.resize(np.arange(256, dtype=np.uint8), pool.frames.size)   # every value occurs
    pool.frames[:] = np.random.default_rng(0).permutation(values).reshape(pool.frames.shape)
    vectorised, table = PooledDecoder(pool, codec), PooledDecoder(pool, codec, vectorise=False)
    args = vectorised._affine_args(torch.float32, vectorised._table(torch.float32))
    assert args is not None   # each of these codecs has an exact vector form
    ids = torch.from_numpy(np.random.default_rng(1).integers(3, 300, 40))
    a, b = vectorised.decode(ids, torch.float32), table.decode(ids, torch.float32)
    assert a.shape == b.shape == (40, *frame_shape, 4)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("misaligned", [False, True])
def test_a_batch_beyond_the_caches_decodes_the_same_bits(misaligned, monkeypatch):
    """From 16 MB a batch is written with non-temporal stores (aligned output only; a misaligned
    one, as a plain malloc gives, takes the ordinary stores): the same bits as the table route."""
    from conduit_core.schema import framestack
    from conduit_core.schema.framestack import FramePool, PooledDecoder

    if misaligned:   # 16 bytes past a 64-byte boundary: no 32-byte aligned store exists
        aligned = framestack.aligned_empty
        monkeypatch.setattr(framestack, "aligned_empty",
                            lambda shape, dtype: aligned((int(np.prod(shape)) + 4,), dtype)[4:].reshape(shape))
    codec = FrameStackCodec(k=4, axis=-1, inner=AffineCodec.divide(128, offset=-1.0))
    pool = FramePool(name="frames", frames=600, frame_shape=(84, 84), dtype=torch.uint8, k=4)
    pool.frames[:] = np.random.default_rng(0).integers(0, 256, pool.frames.shape, dtype=np.uint8)
    vectorised, table = PooledDecoder(pool, codec), PooledDecoder(pool, codec, vectorise=False)
    ids = torch.from_numpy(np.random.default_rng(1).integers(3, 600, 160))   # 18 MB of float32
    a, b = vectorised.decode(ids, torch.float32), table.decode(ids, torch.float32)
    assert a.numpy().nbytes >= 16 << 20 and (a.data_ptr() % 32 == 0) != misaligned
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("k", [1, 2, 4])
def test_native_stack_links_equal_the_numpy_route(k, monkeypatch):
    """FramePool.plan finds equal and shifted-by-one stacks with memcmp in C; the numpy route it
    replaced must give the same plan, including the link to the last stack written before."""
    from conduit_core.schema import framestack
    from conduit_core.schema.framestack import FramePool

    assert framestack._c_stack_links is not None
    rng = np.random.default_rng(k)
    frames = rng.integers(0, 4, (40, 3, 3), dtype=np.uint8)   # few values: equal frames happen
    idx = np.clip(np.cumsum(rng.integers(0, 3, 30)), 0, 39 - k)
    stacks = np.stack([frames[i:i + k] for i in idx])           # repeats (same), steps of one (shift), jumps

    def plan(native: bool):
        pool = FramePool(name="f", frames=64, frame_shape=(3, 3), dtype=torch.uint8, k=k)
        with monkeypatch.context() as m:
            if not native:
                m.setattr(framestack, "_c_stack_links", None)
            first = pool.plan(stacks[:10])
            pool.write(stacks[:10], first[1], first[2], first[0])
            second = pool.plan(stacks[10:])                      # links to the previous call's last stack
        return first, second

    for a, b in zip(plan(True), plan(False)):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("fields", [1, 2])
def test_klast_plan_and_write_equal_the_transposed_route(k, fields):
    """Stacks in their fields' own layout with the frames last (RLlib's Atari [n, 84, 84, 4]),
    read in place (``plan_klast``, C), against ``plan`` on the transposed [m, k, *frame] copy
    it spares: the same links, frame ids, new frames and pool contents over several calls
    (each linking to the last stack the call before wrote), for one field or obs + next obs."""
    from conduit_core.schema.framestack import FramePool

    rng = np.random.default_rng(10 * k + fields)
    frames = rng.integers(0, 3, (60, 5, 7), dtype=np.uint8)   # few values: equal frames happen
    idx = np.clip(np.cumsum(rng.integers(0, 3, 48)), 0, 59 - k)
    stacks = np.stack([frames[i:i + k] for i in idx])           # repeats, steps of one, jumps: [48, k, 5, 7]
    klast = np.ascontiguousarray(np.moveaxis(stacks, 1, -1))    # [48, 5, 7, k]
    pools = [FramePool(name="f", frames=50, frame_shape=(5, 7), dtype=torch.uint8, k=k) for _ in range(2)]
    for lo, hi in ((0, 6), (6, 14), (14, 24)):
        rows = hi - lo
        # field f of row r is stack lo + fields * r + f (obs, next obs interleaved as plan_frames orders them)
        cols = tuple(np.ascontiguousarray(klast[lo * fields:hi * fields][f::fields]) for f in range(fields))
        flat = np.ascontiguousarray(stacks[lo * fields:hi * fields])
        a = pools[0].plan_klast(cols)
        b = pools[1].plan(flat)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2], (lo, hi)
        assert a[0].shape == (rows * fields,)
        pools[0].write(cols, a[1], a[2], a[0])
        pools[1].write(flat, b[1], b[2], b[0])
        assert (pools[0].cursor, pools[0].last_id) == (pools[1].cursor, pools[1].last_id)
        written = np.arange(max(0, pools[0].cursor - 50), pools[0].cursor) % 50   # (unwritten slots hold garbage)
        assert np.array_equal(pools[0].frames[written], pools[1].frames[written])


@pytest.mark.parametrize("where", ["none", "first block", "late block", "tail", "dropped frame"])
@pytest.mark.parametrize("frame", [0, 1, 2])
@pytest.mark.parametrize("odd_pixel", [False, True])
def test_klast_shift_links_on_atari_sized_frames(where, frame, odd_pixel):
    """The shift test reads two 84x84 pixels per 64-bit word, block by block, with a byte loop
    for the tail: a one-byte difference anywhere a shift would carry (any of the three carried
    frames, either pixel of a word) must break the link, and one in the frame a shift drops must
    not; the same links as ``plan`` on the transposed copy."""
    from conduit_core.schema.framestack import FramePool

    rng = np.random.default_rng(7)
    frames = rng.integers(0, 256, (6, 84, 84), dtype=np.uint8)
    stacks = np.stack([frames[0:4], frames[1:5].copy()])        # the second: the first shifted by one frame
    pixel = {"none": None, "first block": 2, "late block": 84 * 84 - 400, "tail": 84 * 84 - 4,
             "dropped frame": 5000}[where]
    if pixel is not None:
        r, c = divmod(pixel + odd_pixel, 84)
        if where == "dropped frame":
            stacks[0, 0, r, c] ^= 1          # the first stack's oldest frame: no part of the shifted one
        else:
            stacks[1, frame, r, c] ^= 1      # a frame the shift carries over
    klast = np.ascontiguousarray(np.moveaxis(stacks, 1, -1))     # [2, 84, 84, 4]
    pools = [FramePool(name="f", frames=16, frame_shape=(84, 84), dtype=torch.uint8, k=4) for _ in range(2)]
    a = pools[0].plan_klast((klast,))
    b = pools[1].plan(np.ascontiguousarray(stacks))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
    assert a[2] == (5 if where in ("none", "dropped frame") else 8)   # linked: 4 + 1 new frames; else 4 + 4


@settings(max_examples=200, deadline=None)
@given(links=st.lists(st.tuples(st.booleans(), st.booleans()), max_size=64), k=st.integers(1, 5),
       cursor=st.integers(0, 10_000))
def test_frame_ids_of_a_few_stacks_equal_the_vectorised_route(links, k, cursor):
    """An env step's handful of stacks gets its frame ids from a Python loop; any number of
    stacks from numpy: the same last ids, the same (stack, frame) picks, the same count."""
    from conduit_core.schema import framestack
    from conduit_core.schema.framestack import FramePool

    pool = FramePool(name="f", frames=8, frame_shape=(1,), dtype=torch.uint8, k=k)
    pool.cursor = cursor
    same = np.array([s for s, _ in links], dtype=bool)
    shift = np.array([h for _, h in links], dtype=bool)
    few = pool._ids_from_links(len(links), same.copy(), shift.copy())
    with pytest.MonkeyPatch.context() as m:
        m.setattr(framestack, "_FEW_STACKS", -1)
        many = pool._ids_from_links(len(links), same.copy(), shift.copy())
    assert few[0].dtype == many[0].dtype == np.int64 and few[1].dtype == many[1].dtype
    assert np.array_equal(few[0], many[0]) and np.array_equal(few[1], many[1]) and few[2] == many[2]
    assert few[1].shape == (2, few[2])
