"""A migration whose new layout fails under it (a new remote shard lost during a dual write):
the buffer keeps every accepted row and its episode links in the old layout, and the error
reaches the migration's caller, not the actor that inserted."""

import numpy as np
import pytest

from conduit_core import ExperienceBuffer, ShardSpec, StateError
from conduit_core.buffer.migration import BackgroundMigration, begin_migration

from ..helpers import SPEC, rollout


def _failing_once(write):
    calls = {"n": 0}

    def write_or_fail(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("the new shard's actor died")
        return write(*args, **kw)
    return write_or_fail


def test_a_failed_dual_write_fails_the_migration_and_keeps_the_insert_and_its_links():
    buf = ExperienceBuffer(spec=SPEC, capacity=20)
    buf.add(rollout(15), source=0)                       # one open episode: rows 0..14
    m = begin_migration(buf, shards=[ShardSpec("pageable", 40)], capacity=40)
    m.storage.write = _failing_once(m.storage.write)
    assert buf.add(rollout(5, 15), source=0) == 15      # the insert is accepted whole
    assert not buf.migrating
    buf.add(rollout(3, 20, done_at=2), source=0)
    meta = buf.state_dict()["meta"]
    slots = np.arange(3, 23) % 20
    np.testing.assert_array_equal(meta["seq"][slots], np.arange(3, 23))
    np.testing.assert_array_equal(meta["next_seq"][slots][:-1], np.arange(4, 23))   # one chain, in order
    b = buf.sample(200, n_step=3, gamma=1.0)
    np.testing.assert_array_equal(b["obs"][:, 0].numpy(), b.seqs.astype(np.float32))
    with pytest.raises(StateError, match="dual write.*ConnectionError.*abort"):
        m.step()
    with pytest.raises(StateError, match="dual write"):
        m.finish()
    m.abort()
    assert buf.capacity == 20
    begin_migration(buf, shards=[ShardSpec("pageable", 40)], capacity=40).finish()   # a new one works
    assert buf.capacity == 40 and len(buf) == 20
    buf.close()


def test_a_background_migrations_failed_dual_write_reaches_wait():
    buf = ExperienceBuffer(spec=SPEC, capacity=20)
    buf.add(rollout(20), source=0)
    m = begin_migration(buf, shards=[ShardSpec("pageable", 20)])
    m.storage.write = _failing_once(m.storage.write)
    buf.add(rollout(2, 20), source=0)
    bg = BackgroundMigration(m)
    with pytest.raises(StateError, match="dual write"):
        bg.wait(30)
    assert not buf.migrating and len(buf) == 20
    buf.close()


def test_a_blocking_migration_that_fails_is_aborted_and_the_buffer_keeps_its_layout(monkeypatch):
    """Found by a review (session 24): ``migrate(background=False)`` left a failed migration attached
    (its new layout's shards, remote actors included, stayed up; the caller had no handle to abort)."""
    from conduit_core import ExperienceDataPlane
    from conduit_core.buffer import migration
    edp = ExperienceDataPlane(buffer=ExperienceBuffer(spec=SPEC, capacity=20))
    try:
        edp.ingest(rollout(10))
        closed = []
        real_abort = migration.Migration.abort

        def finish(self):
            raise OSError("the new tier is full")

        def abort(self):
            closed.append(self.storage)
            real_abort(self)
        monkeypatch.setattr(migration.Migration, "finish", finish)
        monkeypatch.setattr(migration.Migration, "abort", abort)
        with pytest.raises(OSError, match="full"):
            edp.migrate(shards=[ShardSpec("pageable", 40)], capacity=40, background=False)
        assert len(closed) == 1 and not edp.buffer.migrating and edp.buffer.capacity == 20
        assert len(edp.buffer) == 10
    finally:
        edp.close()


def test_a_failure_after_the_swap_does_not_abort_the_layout_in_use(monkeypatch):
    """Found by a review (session 24): the abort above also ran for a failure after the swap (the old
    layout's close raising), closing the new layout, which the buffer then used."""
    from conduit_core import ExperienceDataPlane
    from conduit_core.buffer import migration
    edp = ExperienceDataPlane(buffer=ExperienceBuffer(spec=SPEC, capacity=20))
    try:
        edp.ingest(rollout(10))
        real_finish = migration.Migration.finish

        def finish(self):
            real_finish(self)
            raise OSError("closing the old layout failed")
        monkeypatch.setattr(migration.Migration, "finish", finish)
        with pytest.raises(OSError, match="old layout"):
            edp.migrate(shards=[ShardSpec("pageable", 40)], capacity=40, background=False)
        assert edp.buffer.capacity == 40 and len(edp.buffer) == 10
        edp.ingest(rollout(5, 10))
        assert len(edp.buffer) == 15 and edp.buffer.sample(8)["obs"].shape == (8, 4)
    finally:
        edp.close()


def test_a_starved_background_migration_finishes_at_its_deadline_with_every_row():
    """A learner that takes the buffer's lock between every two chunks can starve the copy; past
    its deadline the rest is copied at once under the lock and the swap follows: every row there,
    each once, and the handle says how it ended."""
    import threading
    import time
    buf = ExperienceBuffer(spec=SPEC, capacity=4000)
    buf.add(rollout(4000), source=0)
    m = begin_migration(buf, shards=[ShardSpec("pageable", 8000)], capacity=8000, chunk_bytes=SPEC.stored_bytes_per_transition)
    stop = threading.Event()

    def learner():   # holds the lock most of the time, as a busy learner's calls do
        while not stop.is_set():
            with buf.lock:
                time.sleep(0.002)
    t = threading.Thread(target=learner)
    t.start()
    try:
        started = time.monotonic()
        handle = BackgroundMigration(m, deadline_s=0.3)
        handle.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        stop.set()
        t.join()
    assert handle.finished_at_deadline and buf.capacity == 8000
    assert 0.3 <= took < 20
    assert sorted(buf.ring.live_seqs().tolist()) == list(range(4000))
    assert np.array_equal(buf.read(np.arange(4000))["obs"].numpy(), np.asarray(rollout(4000)["obs"]))


def test_a_migration_deadline_must_be_finite():
    buf = ExperienceBuffer(spec=SPEC, capacity=20)
    from conduit_core import ConfigError, ExperienceDataPlane
    with ExperienceDataPlane(buffer=buf) as edp:
        for bad in (0, -1.0, float("inf"), "30"):
            with pytest.raises(ConfigError, match="deadline_s"):
                edp.migrate(shards=[ShardSpec("pageable", 40)], capacity=40, deadline_s=bad)
        assert not buf.migrating


def test_rows_a_consuming_selector_takes_out_of_order_during_a_migration_stay_taken():
    """LIFO takes rows from behind the queue's front while a migration copies: the new layout
    forgets them as it forgets evicted rows, so none is delivered twice after the swap."""
    from conduit_core import ExperienceSpec, Selector

    class Lifo(Selector):
        name, consumes = "lifo", True

        def select(self, batch_size, size, rng):
            return np.arange(size - 1, size - 1 - batch_size, -1), None
    spec = ExperienceSpec.transition(obs_shape=(4,))
    buf = ExperienceBuffer(spec=spec, capacity=20, selector=Lifo())
    buf.add(rollout(10), source=0)
    m = begin_migration(buf, shards=[ShardSpec("pageable", 40)], capacity=40)
    m.run()                                                 # every row copied
    first = buf.take(3)["obs"][:, 0].tolist()
    m.finish()
    rest = buf.take(None)["obs"][:, 0].tolist()
    assert first == [9.0, 8.0, 7.0] and rest == [6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0]


def test_a_buffer_grown_by_a_migration_loads_its_own_state():
    """Rows copied early and overwritten in the old ring during the copy are below the new window:
    the grown buffer's state holds only live rows, and loads (it was refused: a row outside the window)."""
    buf = ExperienceBuffer(spec=SPEC, capacity=10)
    buf.add(rollout(10), source=0)
    m = begin_migration(buf, shards=[ShardSpec("pageable", 20)], capacity=20)
    m.run()
    buf.add(rollout(5, 10), source=0)                       # overwrites rows 0..4 of the old ring
    m.finish()
    state = buf.state_dict()
    again = ExperienceBuffer(spec=SPEC, capacity=20)
    again.load_state_dict(state)
    assert sorted(again.ring.live_seqs().tolist()) == list(range(5, 15))
    assert np.array_equal(again.read(np.arange(5, 15))["obs"].numpy(), buf.read(np.arange(5, 15))["obs"].numpy())
