"""g_ing on the replay kinds: a group is one ``put_batch`` (one validate-and-encode, one add), which
stores exactly what the same samples put one by one store (the next draws are equal), all of the
group or none of it; the consumer uses it for groups of g_ing."""

import numpy as np
import pytest
from consumer_helpers import sample

from conduit_core.errors import SpecError
from conduit_srl.buffers import make_buffer
from conduit_srl.ingest import StreamIngest

KINDS = {"simple_replay_buffer": dict(max_size=48, batch_size=4, warmup_transitions=0, seed=3),
         "prioritized_replay_buffer": dict(max_size=48, batch_size=4, warmup_transitions=0, seed=3, sample_length=5)}


def draws(buf, n=12):
    out = []
    for _ in range(n):
        e = buf.get()
        out.append((np.asarray(e.sample.seq)[0, :, 0].tolist(), e.reuses))
        if e.sampling_indices is not None:
            buf.update_priorities(e.sampling_indices, np.arange(1, 5, dtype=np.float64))
    return out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_put_batch_stores_what_one_by_one_puts_store(kind):
    one, grouped = make_buffer(kind, **KINDS[kind]), make_buffer(kind, **KINDS[kind])
    xs = [sample(0, i) for i in range(60)]               # wraps the ring of 48
    for x in xs:
        one.put(x)
    for k in range(0, 60, 8):
        grouped.put_batch(xs[k:k + 8])
    assert one.stats() == grouped.stats()
    assert draws(one) == draws(grouped)


def test_put_batch_is_all_or_nothing_and_names_the_field():
    buf = make_buffer("simple_replay_buffer", **KINDS["simple_replay_buffer"])
    buf.put(sample(0, 0))
    bad = sample(0, 2)
    bad.seq = np.zeros((6, 1), np.int64)
    with pytest.raises(SpecError, match=r"^seq.shape: expected \(5, 1\), got \(6, 1\)\. Fix: "):
        buf.put_batch([sample(0, 1), bad, sample(0, 3)])
    assert buf.stats()["chunks_put"] == 1


def test_the_consumer_groups_replay_puts_into_put_batch_calls():
    class Source:
        undecodable = 0

        def __init__(self):
            self.xs = [sample(1, i) for i in range(24)]

        def receive(self, n):
            got, self.xs = self.xs[:n], self.xs[n:]
            return got

    buf = make_buffer("simple_replay_buffer", **KINDS["simple_replay_buffer"])
    calls = []
    inner = buf.put_batch
    buf.put_batch = lambda xs: (calls.append(len(xs)), inner(xs))
    ing = StreamIngest(g_ing=8, max_delay_s=60)
    assert ing.pump(Source(), buf, 1024) == 24
    assert calls == [8, 8, 8] and buf.stats()["chunks_put"] == 24
