"""``Batch.draw_counts``: a delivered batch's distinct rows, distinct sources and n-step sum
(what RLlib's buffers log per sample), the native call against numpy's route."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from conduit_core import Batch
from conduit_core.schema import batch as batch_mod


def _batch(seqs, sources, steps):
    data = {"obs": torch.zeros(len(seqs), 2)}
    if steps is not None:
        data["n_step"] = torch.from_numpy(np.asarray(steps, dtype=np.int64))
    return Batch(data, slots=np.asarray(seqs, dtype=np.int64) % 7, seqs=np.asarray(seqs, dtype=np.int64),
                 versions=np.zeros(len(seqs), np.int64),
                 sources=None if sources is None else np.asarray(sources, dtype=np.int64))


def _numpy_route(b):
    saved = batch_mod._c_draw_counts
    batch_mod._c_draw_counts = None
    try:
        return b.draw_counts()
    finally:
        batch_mod._c_draw_counts = saved


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300), pool=st.integers(1, 50), with_sources=st.booleans(), with_steps=st.booleans(),
       seed=st.integers(0, 2**16))
def test_draw_counts_are_numpys_on_every_route(n, pool, with_sources, with_steps, seed):
    rng = np.random.default_rng(seed)
    seqs = rng.integers(-pool, pool, n)   # (batches above 64 rows take the sort route)
    sources = rng.integers(0, pool, n) if with_sources else None
    steps = rng.integers(1, 6, n) if with_steps else None
    b = _batch(seqs, sources, steps)
    want = (len(set(seqs.tolist())), len(set(sources.tolist())) if with_sources else -1,
            int(steps.sum()) if with_steps else -1)
    assert _numpy_route(b) == want
    assert tuple(b.draw_counts()) == want


@pytest.mark.skipif(batch_mod._c_draw_counts is None, reason="the native rows module was not built")
def test_the_native_call_declines_what_it_cannot_read():
    f = batch_mod._c_draw_counts
    seqs = np.arange(4, dtype=np.int64)
    assert f(seqs.astype(np.int32), None, None) is None          # another dtype
    assert f(seqs[::2], None, None) is None                      # strided
    assert f(seqs, np.arange(3, dtype=np.int64), None) is None   # lengths differ
    assert f(seqs, None, np.arange(4.0)) is None                 # float n-steps
    assert f(seqs, seqs, seqs) == (4, 4, 6)
