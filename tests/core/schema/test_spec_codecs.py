import os

import numpy as np
import pytest
import torch

from conduit_core import AffineCodec, CodecError, ExperienceBuffer, ExperienceSpec, FieldSpec, SpecError
from conduit_core.schema.spec import ExperienceSpec as _ES

from ..helpers import SPEC, rollout


def test_transition_preset_fields_and_bytes():
    spec = ExperienceSpec.transition(obs_shape=(4,), extras={"logp": ((), torch.float32)})
    assert spec.names == ["obs", "action", "reward", "next_obs", "terminated", "truncated", "logp"]
    assert spec.bytes_per_transition == 16 + 8 + 4 + 16 + 1 + 1 + 4


@pytest.mark.parametrize("mutate, field, words", [
    (lambda b: b.update(obs=np.zeros((3, 5), np.float32)), "obs", ["shape", "[N, 4]", "[3, 5]"]),
    (lambda b: b.update(reward=np.zeros(3, np.float64)), "reward", ["float32", "float64", "cast"]),
    (lambda b: b.pop("action"), "action", ["missing"]),
    (lambda b: b.update(bogus=np.zeros(3)), "bogus", ["unknown", "declare"]),
    (lambda b: b.update(reward=np.zeros(4, np.float32)), "reward", ["batch size 3", "4"]),
    (lambda b: b.update(obs=[[0.0] * 4] * 3), "obs", ["numpy array or torch tensor", "list"]),
])
def test_bad_input_is_rejected_naming_field_expected_actual_fix(mutate, field, words):
    b = rollout(3)
    mutate(b)
    with pytest.raises(SpecError) as info:
        SPEC.validate(b)
    msg = str(info.value)
    assert msg.startswith(field) and "Fix:" in msg
    for w in words:
        assert w in msg
    assert info.value.field == field


def test_rejected_batch_leaves_buffer_untouched():
    buf = ExperienceBuffer(spec=SPEC, capacity=10)
    buf.add(rollout(4))
    before = buf.state_dict()
    bad = rollout(3)
    bad["obs"] = bad["obs"][:, :2]
    with pytest.raises(SpecError):
        buf.add(bad)
    after = buf.state_dict()
    assert before["counters"] == after["counters"]
    np.testing.assert_array_equal(before["data"]["obs"], after["data"]["obs"])


def test_spec_config_round_trip_with_codec():
    spec = ExperienceSpec([FieldSpec("obs", (2, 3), torch.float32, AffineCodec.divide(255)),
                           FieldSpec("a", (), torch.int64)])
    assert _ES.from_config(spec.to_config()) == spec
    assert spec.stored_bytes_per_transition == 6 + 8
    assert spec.bytes_per_transition == 24 + 8


def test_reserved_and_bad_names():
    with pytest.raises(SpecError, match="reserved"):
        FieldSpec("_seq")
    with pytest.raises(SpecError, match="positive"):
        FieldSpec("x", (0,))


def test_affine_codec_is_bit_exact_for_pixels_divided_by_255():
    pixels = torch.randint(0, 256, (64, 84, 84), dtype=torch.uint8)
    x = pixels.to(torch.float32) / 255.0
    codec = AffineCodec.divide(255)
    q = codec.encode("obs", x)
    assert q.dtype == torch.uint8
    assert torch.equal(codec.decode(q, torch.float32), x)
    assert torch.equal(q, pixels)


def test_affine_codec_rejects_values_it_cannot_represent():
    codec = AffineCodec.divide(255)
    x = torch.tensor([0.0, 0.5, 1.0])  # 0.5 is not k/255
    with pytest.raises(CodecError, match="obs.*cannot represent.*Fix"):
        codec.encode("obs", x)


def test_buffer_with_codec_delivers_identical_floats_and_stores_less():
    spec = ExperienceSpec.transition(obs_shape=(4, 8, 8), obs_codec=AffineCodec.divide(255))
    buf = ExperienceBuffer(spec=spec, capacity=100)
    n = 20
    obs = torch.randint(0, 256, (n, 4, 8, 8), dtype=torch.uint8).float() / 255
    nxt = torch.randint(0, 256, (n, 4, 8, 8), dtype=torch.uint8).float() / 255
    buf.add({"obs": obs, "next_obs": nxt, "action": torch.zeros(n, dtype=torch.int64),
             "reward": torch.zeros(n), "terminated": torch.zeros(n, dtype=torch.bool),
             "truncated": torch.zeros(n, dtype=torch.bool)})
    b = buf.sample(16)
    seqs = torch.from_numpy(b.seqs)
    assert b["obs"].dtype == torch.float32
    assert torch.equal(b["obs"], obs[seqs]) and torch.equal(b["next_obs"], nxt[seqs])
    assert spec.stored_bytes_per_transition * 3.5 < spec.bytes_per_transition


CODECS = [AffineCodec.divide(128, offset=-1.0), AffineCodec.divide(255), AffineCodec.divide(3.0, offset=0.5),
          AffineCodec(scale=1 / 255), AffineCodec(scale=0.1, offset=-2.0), AffineCodec(scale=2.0)]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c._formula())
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("at", [(1, 3, 2), (2, 16, 4)], ids=["vector body", "tail"])
def test_native_encode_equals_the_numpy_route_value_for_value(codec, seed, at, monkeypatch):
    """The one-pass C encode (quantise + exactness check; on x86 32 values per AVX2 step, the
    last 255 % 32 by the scalar loop) accepts exactly what the numpy route accepts, stores the
    same bytes, and rejects at the same first index: grid values, near misses, out-of-range
    values, infinities, NaN and signed zeros, in the vector body and in the tail."""
    from conduit_core.schema import codecs as codecs_module
    rng = np.random.default_rng(seed)
    grid = codec._lut(torch.float32)
    x = grid[rng.integers(0, 256, (3, 17, 5))].copy()
    if seed:  # plant one value the codec cannot represent, of a different kind per seed
        bad = [np.nextafter(x[at], np.float32(np.inf)), np.float32(np.nan), np.float32(-np.inf),
               np.float32(np.inf), grid[255] + abs(grid[255] - grid[254]) * 3][seed - 1]
        x[at] = bad
    if seed == 3:
        x[0, 0, 0] = -0.0 if grid[0] == 0 else x[0, 0, 0]

    def encode(native: bool):
        with monkeypatch.context() as m:
            if not native:
                m.setattr(codecs_module, "_c_quantize_u8", None)
                codec.__dict__.pop("_native_args", None)
            try:
                return codec.encode("obs", x).numpy(), None
            except CodecError as exc:
                return None, str(exc)
            finally:
                codec.__dict__.pop("_native_args", None)

    assert codecs_module._c_quantize_u8 is not None
    (q_native, err_native), (q_numpy, err_numpy) = encode(True), encode(False)
    assert (err_native is None) == (err_numpy is None)
    if err_numpy is None:
        assert np.array_equal(q_native, q_numpy)
    else:
        assert err_native == err_numpy  # same index, same value, same message
    assert codec._native_ok()  # every codec above takes the C route here
    from conduit_core._native import _affine
    cpu_flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []
    assert _affine.AVX2 == ("avx2" in cpu_flags)   # the vector loop is the one compared, where the CPU has it


@pytest.mark.parametrize("codec", [AffineCodec.divide(255), AffineCodec.divide(128, offset=-1.0)],
                         ids=lambda c: c._formula())
@pytest.mark.parametrize("index", [5, 40], ids=["vector body", "tail"])
def test_a_negative_zero_the_codec_would_give_back_as_positive_is_refused_by_every_route(codec, index, monkeypatch):
    """Found in review: the round-trip check compared with ==, and -0.0 == +0.0, so -0.0 was
    stored and came back as +0.0. The check is bit for bit on every route (C, numpy, torch)."""
    from conduit_core.schema import codecs as codecs_module
    x = np.zeros(41, np.float32)
    accepted = codec.encode("obs", x)                      # +0.0: on the grid, bit for bit
    assert np.array_equal(codec.decode(accepted, torch.float32).numpy().view(np.uint32), x.view(np.uint32))
    x[index] = -0.0
    messages = []
    for route in ("native", "numpy", "torch"):
        with monkeypatch.context() as m:
            if route != "native":
                m.setattr(codecs_module, "_c_quantize_u8", None)
            codec.__dict__.pop("_native_args", None)
            with pytest.raises(CodecError, match=f"index \\[{index}\\]" if route != "torch" else "exactly") as err:
                codec._encode_torch("obs", torch.from_numpy(x)) if route == "torch" else codec.encode("obs", x)
            messages.append(str(err.value))
        codec.__dict__.pop("_native_args", None)
    assert messages[0] == messages[1]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_finite_scan_finds_every_kind_of_non_finite_value(dtype):
    from conduit_core.schema import spec as spec_module
    assert spec_module._c_all_finite is not None
    a = np.ones((101, 3), dtype)
    assert spec_module._c_all_finite(a)
    edge = np.array([np.finfo(dtype).max, -np.finfo(dtype).max, np.finfo(dtype).tiny, -0.0], dtype)
    assert spec_module._c_all_finite(edge)  # the largest, smallest and signed-zero values are finite
    for bad in (np.nan, np.inf, -np.inf):
        b = a.copy()
        b[77, 2] = bad
        assert not spec_module._c_all_finite(b)
        with pytest.raises(SpecError, match="row 77"):
            spec_module._check_finite("obs", b)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("stacked", [False, True])
def test_nonfinite_values_in_a_verified_codec_field_are_refused_by_the_codec(bad, stacked):
    """An insert's validation skips its NaN/inf read for fields whose verified codec refuses them
    in its own pass (an Atari stack is read once, not twice): such a value is still refused with
    validate's error (the field, the value, its row, allow_nonfinite), and nothing is stored."""
    from conduit_core import ExperienceBuffer, ExperienceSpec
    from conduit_core.schema.framestack import FrameStackCodec
    inner = AffineCodec.divide(128, offset=-1.0)
    codec = FrameStackCodec(k=4, axis=-1, inner=inner) if stacked else inner
    spec = ExperienceSpec.transition(obs_shape=(6, 6, 4), obs_codec=codec)
    assert spec["obs"].codec.refuses_nonfinite
    buf = ExperienceBuffer(spec=spec, capacity=16)
    frames = np.random.default_rng(0).integers(0, 256, (8, 6, 6)).astype(np.float32) / 128 - 1
    obs = np.stack([frames[i:i + 4] for i in range(4)]).transpose(0, 2, 3, 1).copy()   # 4 stacks, k last
    nxt = np.stack([frames[i + 1:i + 5] for i in range(4)]).transpose(0, 2, 3, 1).copy()
    rest = {"action": np.zeros(4, np.int64), "reward": np.zeros(4, np.float32), "terminated": np.zeros(4, bool),
            "truncated": np.zeros(4, bool)}
    buf.add({"obs": obs, "next_obs": nxt, **rest})
    nxt[2, 1, 1, 3] = bad
    with pytest.raises(SpecError, match=r"next_obs: expected finite values, got (nan|inf|-inf) in row 2"):
        buf.add({"obs": obs, "next_obs": nxt, **rest})
    assert buf.size == 4 and buf.inserted == 4


def test_nonfinite_value_is_refused_when_accepted_not_later_in_the_worker():
    """The overlapped schedule validates in the caller and encodes in its worker: a NaN in a
    codec field is refused by ingest() itself (validate reads every float field), not accepted
    and reported by a later call."""
    from conduit_core import ExperienceBuffer, ExperienceDataPlane, ExperienceSpec, Schedule
    spec = ExperienceSpec.transition(obs_shape=(3,), obs_codec=AffineCodec.divide(128, offset=-1.0))
    edp = ExperienceDataPlane(buffer=ExperienceBuffer(spec=spec, capacity=16), schedule=Schedule.overlapped())
    try:
        obs = np.zeros((4, 3), np.float32)
        obs[1, 1] = np.nan
        batch = {"obs": obs, "next_obs": np.zeros((4, 3), np.float32), "action": np.zeros(4, np.int64),
                 "reward": np.zeros(4, np.float32), "terminated": np.zeros(4, bool), "truncated": np.zeros(4, bool)}
        with pytest.raises(SpecError, match="obs: expected finite values, got nan in row 1"):
            edp.ingest(batch)
        edp.flush()
        assert edp.buffer.size == 0
    finally:
        edp.close()


@pytest.mark.parametrize("where", ["first", "last"])
def test_obs_and_next_obs_of_one_array_are_encoded_once_and_a_bad_value_named_by_its_field(where):
    """obs = x[:-1] and next_obs = x[1:] of one array (as adapters hand them over) are encoded as
    x's rows once: the same stored bytes as separate arrays, and a value the codec cannot hold is
    named by the field it is in (x's first row is only obs's, its last only next_obs's)."""
    from conduit_core import ExperienceBuffer, ExperienceSpec
    codec = AffineCodec.divide(128, offset=-1.0)
    spec = ExperienceSpec.transition(obs_shape=(3,), obs_codec=codec)
    x = (np.random.default_rng(0).integers(0, 256, (6, 3)).astype(np.float32) / 128 - 1)
    rest = {"action": np.zeros(5, np.int64), "reward": np.zeros(5, np.float32), "terminated": np.zeros(5, bool),
            "truncated": np.zeros(5, bool)}
    n, shared = spec.validate_and_encode({"obs": x[:-1], "next_obs": x[1:], **rest})
    _, apart = spec.validate_and_encode({"obs": x[:-1].copy(), "next_obs": x[1:].copy(), **rest})
    for f in ("obs", "next_obs"):
        assert np.array_equal(np.asarray(shared[f]), np.asarray(apart[f]))
    x[0 if where == "first" else -1, 2] = 0.3   # not q / 128 - 1 for any q
    field = "obs" if where == "first" else "next_obs"
    with pytest.raises(CodecError, match=rf"^{field}: the affine codec"):
        ExperienceBuffer(spec=spec, capacity=8).add({"obs": x[:-1], "next_obs": x[1:], **rest})


def _union_cases():
    """(name, a, b, paired?) for the shifted-rows test: obs[:-1] / obs[1:] of one array pairs;
    anything else does not."""
    rng = np.random.default_rng(0)
    x = rng.random((6, 3, 4), dtype=np.float32)
    y = rng.random((6, 3, 4), dtype=np.float32)
    mem = np.arange(40, dtype=np.float32)
    return [
        ("obs[:-1], obs[1:]", x[:-1], x[1:], True),
        ("two rows of one array", x[:2], x[1:3], True),
        ("a row of one", x[:1], x[1:2], False),                        # (adjacent arrays of one row are not paired)
        ("shifted by two", x[:-2], x[2:], False),
        ("backwards", x[1:], x[:-1], False),
        ("copies", x[:-1].copy(), x[1:].copy(), False),
        ("other arrays", x[:-1], y[1:], False),
        ("other dtype", x[:-1], x.view(np.int32)[1:], False),
        ("strided", x[::2][:-1], x[::2][1:], False),
        ("one array twice", x[:-1], None, False),
        ("1-D", mem[:-1], mem[1:], True),
        ("torch", torch.from_numpy(x)[:-1], torch.from_numpy(x)[1:], False),
    ]


@pytest.mark.parametrize("case", _union_cases(), ids=lambda c: c[0])
def test_shifted_rows_union_native_and_python_agree(case):
    """``_rows.shifted_union`` (C) and its Python stand-in pair the same arrays and make the same
    read-only view of the n + 1 rows."""
    from conduit_core.schema import shifted_rows
    name, a, b, paired = case
    b = a if b is None else b
    assert shifted_rows._union_if_shifted is not shifted_rows._union_if_shifted_py   # the C route is built here
    views = [shifted_rows._union_if_shifted(a, b), shifted_rows._union_if_shifted_py(a, b)]
    for v in views:
        assert (v is not None) == paired, name
        if paired:
            assert v.shape == (a.shape[0] + 1, *a.shape[1:]) and not v.flags.writeable
            assert np.array_equal(v[:-1], a) and np.array_equal(v[1:], b)


def test_obs_and_next_obs_of_one_array_are_encoded_once_and_as_apart():
    """A framework's obs[:-1] / next_obs[1:] of one array: the spec finds the pair, encodes the
    n + 1 rows once, and stores what encoding each field apart stores; a value it refuses in the
    last row is named as next_obs's."""
    from conduit_core.schema import shifted_rows
    codec = AffineCodec.divide(128, offset=-1.0)
    spec = ExperienceSpec.transition(obs_shape=(3, 4), obs_codec=codec)
    q = np.random.default_rng(1).integers(0, 256, (6, 3, 4), dtype=np.uint8)
    allx = (q.astype(np.float32) / 128 - 1).astype(np.float32)
    n = 5
    cols = {"obs": allx[:-1], "next_obs": allx[1:], "action": np.zeros(n, np.int64), "reward": np.zeros(n, np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
    pairs = shifted_rows.shifted_pairs(spec, cols)
    assert list(pairs) == ["obs"] and pairs["obs"][0] == "next_obs"
    encodes = []
    real_encode = AffineCodec.encode

    def counted(self, field, x):
        encodes.append((field, x.shape[0]))
        return real_encode(self, field, x)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(AffineCodec, "encode", counted)
        together = spec.encode(cols)
        assert encodes == [("obs", n + 1)]                    # once, the n + 1 rows
        encodes.clear()
        reordered = spec.encode({"next_obs": cols["next_obs"], **cols})   # next_obs first: still once
        assert encodes == [("obs", n + 1)]
    for f in ("obs", "next_obs"):
        assert torch.equal(torch.as_tensor(reordered[f]), torch.as_tensor(together[f]))
    apart = spec.encode({**cols, "obs": allx[:-1].copy(), "next_obs": allx[1:].copy()})
    assert shifted_rows.shifted_pairs(spec, {**cols, "obs": allx[:-1].copy()}) == {}
    for f in ("obs", "next_obs"):
        assert torch.equal(torch.as_tensor(together[f]), torch.as_tensor(apart[f]))
    allx[-1, 2, 3] = 0.3   # not k/128 - 1 for any k
    with pytest.raises(CodecError, match="next_obs"):
        spec.encode(cols)


@pytest.mark.parametrize("order", ["x y w", "w x y", "y w x"])
def test_three_fields_each_the_next_shifted_are_all_stored_whatever_their_order(order):
    """w, x, y the rows [:-2], [1:-1], [2:] of one array (x is w shifted, y is x shifted), one
    row-wise codec: at most one pair is encoded together (no chains), and every field is stored
    as encoding it apart stores it."""
    from conduit_core.schema import shifted_rows
    codec = AffineCodec.divide(128, offset=-1.0)
    spec = ExperienceSpec([FieldSpec(name, (3,), torch.float32, codec) for name in ("w", "x", "y")])
    q = np.random.default_rng(5).integers(0, 256, (7, 3), dtype=np.uint8)
    arr = (q.astype(np.float32) / 128 - 1).astype(np.float32)
    views = {"w": arr[:-2], "x": arr[1:-1], "y": arr[2:]}
    cols = {name: views[name] for name in order.split()}
    pairs = shifted_rows.shifted_pairs(spec, cols)
    assert len(pairs) == 1
    got = spec.encode(cols)
    assert sorted(got) == ["w", "x", "y"]
    for name, v in views.items():
        assert torch.equal(torch.as_tensor(got[name]), torch.as_tensor(codec.encode(name, v.copy()))), name
