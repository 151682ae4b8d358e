"""A batch in a buffer's reused outputs (``reuse_outputs=k``) is never overwritten while the
learner may still use it: not by a draw that fails after filling an entry, not by a pool grown
mid-run, not by a data plane's prepared batches discarded and redrawn any number of times between
deliveries (evictions, migrations, stores), whether or not the learner keeps its Batch object.
Each test failed before ``OutputPool.bind`` (found by a review in session 29)."""

import threading
import time

import numpy as np
import pytest
import torch

from conduit_core import ExperienceBuffer, ExperienceDataPlane, ExperienceSpec, Prioritized, Schedule, Uniform
from conduit_core.memory.output_pool import OutputPool


def rows(n, rng, ep_len=None):
    r = {"obs": rng.standard_normal((n, 3)).astype(np.float32), "next_obs": rng.standard_normal((n, 3)).astype(np.float32),
         "action": rng.integers(0, 2, n), "reward": rng.standard_normal(n).astype(np.float32),
         "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
    if ep_len:
        r["terminated"][ep_len - 1::ep_len] = True
    return r

def make(reuse=2, prioritized=True, capacity=256, n=200, seed=0, selector=None, **kw):
    if selector is None:
        selector = Prioritized(alpha=0.6, beta=0.4) if prioritized else Uniform()
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(3,)), capacity=capacity, reuse_outputs=reuse, seed=seed,
                           selector=selector, **kw)
    rng = np.random.default_rng(seed)
    for s in range(n // 20):
        buf.add(rows(20, rng, ep_len=10), source=s)
    return buf

PROV = ("slots", "seqs", "versions", "sources", "n_steps")
def snap(b):
    d = {k: v.clone() for k, v in b.items()}
    for p in PROV:
        x = getattr(b, p, None)
        if x is not None:
            d["@" + p] = torch.from_numpy(np.array(x, copy=True))
    w = None if b.weights is None else b.weights.clone()
    return d, w

def _get(b, k):
    return torch.from_numpy(np.asarray(getattr(b, k[1:]))) if k.startswith("@") else b[k]

def same(b, s):
    d, w = s
    ok = all(torch.equal(_get(b, k), d[k]) for k in d)
    if w is not None:
        ok = ok and torch.equal(b.weights, w)
    return ok

def diff(b, s):
    d, w = s
    bad = [k for k in d if not torch.equal(_get(b, k), d[k])]
    if w is not None and not torch.equal(b.weights, w):
        bad.append("weights")
    return bad

def ptrs(b):
    out = set()
    for v in list(b.values()) + ([b.weights] if b.weights is not None else []):
        if v.numel():
            span = sum((d - 1) * st for d, st in zip(v.shape, v.stride())) + 1
            out.add((v.data_ptr(), span * v.element_size()))
    return out

def overlap(a, b):
    ra = [(p, p + n) for p, n in ptrs(a)]
    rb = [(p, p + n) for p, n in ptrs(b)]
    return any(x0 < y1 and y0 < x1 for x0, x1 in ra for y0, y1 in rb)

def prepared_ahead(edp, n=None, timeout=10.0):
    n = edp.schedule.depth if n is None else n
    end = time.monotonic() + timeout
    while len(edp._prepared) < n and time.monotonic() < end:
        time.sleep(0.002)
    return len(edp._prepared)


@pytest.mark.parametrize("kw, failures", [({}, 1), (dict(n_step=2, episode_end="redraw"), 2)])
def test_failed_hook_draw_uses_up_an_entry(kw, failures):
    left = {"n": 0}
    def hook(b):
        if left["n"]:
            left["n"] -= 1
            raise RuntimeError("refused")
        return b
    edp = ExperienceDataPlane(buffer=make(reuse=2), schedule=Schedule.sequential(), delivery_hooks=[hook])
    held = edp.deliver(16, **kw); s = snap(held)
    left["n"] = failures
    for _ in range(failures):
        with pytest.raises(RuntimeError):
            edp.deliver(16, **kw)
    edp.deliver(16, **kw)                      # 1st delivery after held
    try:
        assert same(held, s), diff(held, s)
    finally:
        edp.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a device that fails")
@pytest.mark.parametrize("seq", [False, True])
def test_draw_failing_inside_gather_uses_up_an_entry(seq):
    buf = make(reuse=2)
    draw = (lambda **kw: buf.sample_sequences(8, 4, **kw)) if seq else (lambda **kw: buf.sample(16, **kw))
    held = draw(); s = snap(held)
    with pytest.raises(Exception):
        draw(device="cuda")
    draw()                                     # 1st delivery after held
    assert same(held, s), diff(held, s)


def test_pool_growth_with_cursor_at_zero():
    pool = OutputPool(2, {"x": ((1,), np.dtype(np.float32))})
    pool.get((4,))
    held = pool.get((4,))[0]["x"]; held[:] = 1
    pool.reserve(2)
    pool.get((4,))                             # delivery 1 after held
    ahead = pool.get((4,))[0]["x"]            # prepared before delivery 2
    assert ahead.ctypes.data != held.ctypes.data


def test_reschedule_growth_lets_the_worker_overwrite_the_held_batch():
    edp = ExperienceDataPlane(buffer=make(reuse=2), schedule=Schedule.sequential())
    edp.deliver(16)
    held = edp.deliver(16); s = snap(held)
    edp.reschedule(Schedule.overlapped(depth=2))
    edp.deliver(16)
    prepared_ahead(edp); time.sleep(0.2)
    try:
        assert same(held, s), diff(held, s)
    finally:
        edp.close()


def test_evicts_between_deliveries_let_the_worker_overwrite_the_held_batch():
    buf = make(reuse=2, capacity=512, n=400)
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(depth=2))
    held = edp.deliver(16); s = snap(held)
    lo = buf.live_range()[0]
    try:
        for i in range(4):
            prepared_ahead(edp); edp.evict([lo + i]); prepared_ahead(edp); time.sleep(0.05)
        assert same(held, s), diff(held, s)
    finally:
        edp.close()


def test_prepared_replay_refreshes_overwrite_the_held_batch():
    from conduit_core.plane.prepared_replay import PreparedReplay
    from conduit_core.plane.prepared_deliveries import DeliveryRequest
    buf = make(reuse=2, capacity=1024, n=200)
    lock = threading.Lock()
    pr = PreparedReplay(buffer=buf, schedule=Schedule.overlapped(depth=2), lock=lock)
    p, _ = pr.deliver(DeliveryRequest("sample", 16)); held = p.batch; s = snap(held)
    rng = np.random.default_rng(5)
    try:
        for _ in range(4):
            time.sleep(0.1)
            with lock:
                buf.add(rows(4, rng))
        time.sleep(0.1)
        assert same(held, s), diff(held, s)
    finally:
        pr.close(); buf.close()


def test_learner_keeping_only_the_tensors_survives_refills():
    """The learner drops the Batch object and keeps its tensors (as a framework's own batch
    does): they stay intact for its next k - 1 deliveries whatever is redrawn meanwhile."""
    buf = make(reuse=2, capacity=512, n=400)
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(depth=2))
    batch = edp.deliver(16)
    tensors = dict(batch)
    want = {k: v.clone() for k, v in tensors.items()}
    del batch
    lo = buf.live_range()[0]
    try:
        for i in range(4):
            prepared_ahead(edp); edp.evict([lo + i]); prepared_ahead(edp); time.sleep(0.05)
        edp.deliver(16)   # the 1st delivery after it: still valid (k=2)
        prepared_ahead(edp); time.sleep(0.05)
        assert all(torch.equal(tensors[k], want[k]) for k in want)
    finally:
        edp.close()


def test_steady_state_reuses_a_bounded_pool():
    """Batches dropped as they are used: the pool settles at k + 1 entries and reuses them."""
    buf = make(reuse=2)
    seen = set()
    for _ in range(50):
        seen.add(buf.sample(16)["obs"].data_ptr())
    assert len(seen) == 3


def test_batches_held_long_grow_the_pool_and_it_shrinks_back_once_let_go():
    """A learner keeping many batches alive gets memory of its own for each (never a shared
    one); once it lets them go, the pool returns to k + 1 entries."""
    buf = make(reuse=2)
    kept = [buf.sample(16) for _ in range(10)]
    ptrs = {b["obs"].data_ptr() for b in kept}
    assert len(ptrs) == 10
    snaps = [snap(b) for b in kept]
    for _ in range(5):
        buf.sample(16)
    assert all(same(b, s) for b, s in zip(kept, snaps))
    del kept
    seen = {buf.sample(16)["obs"].data_ptr() for _ in range(30)}
    assert len(seen) == 3


@pytest.mark.parametrize("window", [False, True])
def test_a_batch_kept_for_the_whole_run_costs_one_entry_not_an_allocation_per_draw(window):
    """A learner that keeps one batch (a reference batch for logging) makes the ring step over its
    entry: the other draws cycle through k + 1 entries as before. (Before session 30 the ring
    inserted a fresh entry in front of the held one at every draw: a new allocation, and for pixel
    batches new pages to fault in, per draw.)"""
    buf = make(reuse=2)
    draw = (lambda: buf.sample(16, n_step=2, episode_end="redraw")) if window else (lambda: buf.sample(16))
    kept = draw()
    before = snap(kept)
    seen = {draw()["obs"].data_ptr() for _ in range(40)}
    assert kept["obs"].data_ptr() not in seen
    assert len(seen) == 3
    assert same(kept, before)


def test_gathers_no_draw_binds_do_not_grow_the_pool_without_bound():
    """``gather()`` called on its own (no sample to bind its entries to a Batch) keeps a bounded
    number of entries pending, not one more per call: the pool lets the oldest go."""
    import gc
    import weakref
    buf = make(reuse=2)
    slots = np.arange(8, dtype=np.int64)
    with buf.lock:
        refs = [weakref.ref(buf.gather(slots)["obs"]) for _ in range(300)]
    gc.collect()
    assert sum(r() is not None for r in refs) <= 64 + 3   # (the pending limit, and k + 1 entries)
    b = buf.sample(8)   # and draws still hand out valid batches afterwards
    before = snap(b)
    buf.sample(8), buf.sample(8)
    assert same(b, before)
