"""Host -> device delivery: page-locked staging, device-side access to pinned memory, device shards.

The access-mode checks run everywhere; the rest needs CUDA and runs on a GPU machine
(``benchmarks/gpu_check.sh`` runs this file there).
"""

import numpy as np
import pytest
import torch

from conduit_core import ConfigError, ExperienceBuffer, ExperienceSpec, FieldSpec, ShardSpec
from conduit_core.schema.codecs import AffineCodec
from conduit_core.memory.staging import PinnedStaging, device_alias

from ..helpers import SPEC, rollout

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (host -> device delivery)")


def test_mapped_access_needs_pinned_tier():
    with pytest.raises(ConfigError, match="ShardSpec.access.*'copy'.*tier='pinned'"):
        ShardSpec("pageable", 10, access="mapped")
    with pytest.raises(ConfigError, match="ShardSpec.access.*one of.*'zero-copy'"):
        ShardSpec("pageable", 10, access="zero-copy")
    assert ShardSpec("pageable", 10).to_config()["access"] == "copy"


LAYOUTS = {
    "pageable": [ShardSpec("pageable", 64)],
    "pinned-copy": [ShardSpec("pinned", 64)],
    "pinned-mapped": [ShardSpec("pinned", 64, access="mapped")],
    "device": [ShardSpec("device", 64, device="cuda")],
    "mixed": [ShardSpec("pageable", 20), ShardSpec("pinned", 14, access="mapped"), ShardSpec("pinned", 10),
              ShardSpec("device", 20, device="cuda")],
}


@cuda
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gpu_delivery_equals_host_delivery_on_every_layout(layout):
    buf = ExperienceBuffer(spec=SPEC, capacity=64, shards=LAYOUTS[layout])
    for i in range(9):  # 90 rows: wraps the ring and crosses every shard boundary
        buf.add(rollout(10, 10 * i))
    slots = buf._select(256, None)[0]
    on_gpu = buf.storage.gather(slots, device=torch.device("cuda"))
    on_host = buf.storage.gather(slots)
    for name in on_host:
        assert on_gpu[name].device.type == "cuda", name
        torch.testing.assert_close(on_gpu[name].cpu(), on_host[name], rtol=0, atol=0)
    buf.close()


@cuda
def test_staging_slot_is_not_refilled_while_its_copy_may_be_running():
    """Many deliveries issued back to back, no synchronisation between them: each result must
    still hold its own rows (a refilled slot under a running copy would corrupt earlier ones)."""
    spec = ExperienceSpec([FieldSpec("x", (4096,), torch.float32)])
    buf = ExperienceBuffer(spec=spec, capacity=512, tier="pinned")
    rows = np.arange(512, dtype=np.float32)[:, None] * np.ones((1, 4096), np.float32)
    buf.add({"x": rows})
    rng = np.random.default_rng(0)
    picks = [rng.integers(0, 512, 256) for _ in range(20)]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # a busy device: copies queue up behind it
    outs = [buf.storage.gather(p, device=torch.device("cuda"))["x"] for p in picks]
    torch.cuda.synchronize()
    for p, out in zip(picks, outs):
        np.testing.assert_array_equal(out[:, 0].cpu().numpy(), p.astype(np.float32))
        np.testing.assert_array_equal(out[:, -1].cpu().numpy(), p.astype(np.float32))
    buf.close()


@cuda
def test_device_alias_reads_pinned_memory_in_place():
    host = torch.arange(12, dtype=torch.float32, pin_memory=True).view(3, 4)
    alias = device_alias(host, "cuda")
    assert alias.device.type == "cuda" and alias.data_ptr() == host.data_ptr()
    host[1, 2] = -5.0  # a host write is seen by the device: no copy was taken
    assert alias[1, 2].item() == -5.0
    with pytest.raises(ConfigError, match="pinned"):
        device_alias(torch.zeros(3), "cuda")


@cuda
def test_codec_decodes_on_the_device_after_moving_encoded_bytes():
    spec = ExperienceSpec([FieldSpec("q", (8,), torch.float32, codec=AffineCodec(scale=0.5, offset=0.0))])
    buf = ExperienceBuffer(spec=spec, capacity=32, shards=[ShardSpec("pinned", 32, access="mapped")])
    vals = np.tile(np.arange(32, dtype=np.float32)[:, None] * 0.5, (1, 8))
    buf.add({"q": vals})
    out = buf.storage.gather(np.arange(32), device=torch.device("cuda"))["q"]
    assert out.device.type == "cuda" and out.dtype == torch.float32
    np.testing.assert_allclose(out.cpu().numpy(), vals)
    buf.close()


@cuda
def test_staging_grows_and_is_released_on_close():
    st = PinnedStaging(depth=2)
    src = np.arange(40, dtype=np.float32).reshape(10, 4)

    def fill(rows):
        def f(out):
            out.copy_(torch.from_numpy(src[:rows]))
        return f

    a = st.copy("x", fill(3), 3, (4,), torch.float32, torch.device("cuda"))
    b = st.copy("x", fill(10), 10, (4,), torch.float32, torch.device("cuda"))
    torch.testing.assert_close(a.cpu(), torch.from_numpy(src[:3]))
    torch.testing.assert_close(b.cpu(), torch.from_numpy(src))
    assert st.nbytes() >= 13 * 4 * 4
    st.close()
    assert st.nbytes() == 0


class _RecordingEvent:
    """Stands in for a CUDA event on a machine without CUDA: logs when the ring records and waits."""

    log: list = []

    def __init__(self):
        self.id = len([e for e in self.log if e[0] == "new"])
        self.log.append(("new", self.id))

    def record(self, *stream):
        self.log.append(("record", self.id))

    def synchronize(self):
        self.log.append(("wait", self.id))


def test_staging_ring_waits_for_a_slot_before_refilling_it_and_never_aliases_it():
    _RecordingEvent.log = []
    st = PinnedStaging(depth=2, pin=False, event=_RecordingEvent)
    src = np.arange(80, dtype=np.float32).reshape(20, 4)
    outs = []
    for k in range(4):  # slots 0, 1, 0, 1: the third and fourth copies reuse the slots
        rows = 3 if k < 3 else 10  # the last one outgrows its slot: a new, larger buffer
        outs.append(st.copy("x", lambda out, k=k, rows=rows: out.copy_(torch.from_numpy(src[k:k + rows])), rows,
                            (4,), torch.float32, torch.device("cpu")))
    for k, out in enumerate(outs):  # each result kept its own rows after its slot was refilled
        rows = 3 if k < 3 else 10
        torch.testing.assert_close(out, torch.from_numpy(src[k:k + rows]))
    log = _RecordingEvent.log
    assert log[:4] == [("new", 0), ("record", 0), ("new", 1), ("record", 1)]
    assert log[4] == ("wait", 0) and log[5] == ("record", 0)  # slot 0 waited for before its refill
    assert ("wait", 1) in log[6:]  # and slot 1 before it was replaced by a larger buffer
    assert st.nbytes() == (3 + 10) * 4 * 4
    st.close()
    assert st.nbytes() == 0


def test_packed_staging_copies_every_column_once_aligned_and_never_aliases_the_slot():
    """Small batches: all columns in one slot and one copy; each comes back as its own rows and dtype."""
    _RecordingEvent.log = []
    st = PinnedStaging(depth=2, pin=False, event=_RecordingEvent)
    rng = np.random.default_rng(0)
    cols = {"obs": rng.random((50, 3, 5), dtype=np.float32), "action": rng.integers(0, 9, 50),
            "done": rng.random(50) < 0.5, "reward": rng.random(50).astype(np.float16)}
    results = []
    for k in range(3):  # slots 0, 1, 0: the third refill waits for slot 0's copy
        slots = rng.integers(0, 50, 7 + k)
        parts = [(lambda out, c=c, sl=slots: np.take(c, sl, axis=0, out=out.numpy()), slots.shape[0], c.shape[1:],
                  torch.from_numpy(c).dtype) for c in cols.values()]
        outs = st.copy_packed("rows", parts, torch.device("cpu"))
        results.append((slots, outs))
        for out in outs:
            assert out.data_ptr() % 64 == outs[0].data_ptr() % 64  # every column starts aligned
    for slots, outs in results:  # each batch kept its rows after its slot was refilled
        for c, out in zip(cols.values(), outs):
            assert out.dtype == torch.from_numpy(c).dtype and torch.equal(out, torch.from_numpy(c[slots]))
    assert [e for e in _RecordingEvent.log if e[0] == "wait"] == [("wait", 0)]
    st.close()


@cuda
@pytest.mark.parametrize("axis", [-1, 0])
def test_frame_stacks_cross_as_uint8_and_decode_on_the_device_bit_exact(axis):
    """Atari stacks reach a GPU learner as uint8 frames and are decoded there: the same floats as the host decode."""
    from ..schema.test_framestack import assert_exact, fill, make

    rng = np.random.default_rng(0)
    buf = make(2000, axis=axis)
    truth = fill(buf, rng, [300, 250], axis=axis)
    on_gpu = buf.sample(256, device="cuda")
    assert on_gpu["obs"].device.type == "cuda" and on_gpu["obs"].dtype == torch.float32
    assert_exact(on_gpu.to("cpu"), truth)
    buf.close()
