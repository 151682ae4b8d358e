"""A lost remote shard takes exactly its rows: losses named after the ring wrapped, FIFO passing over lost rows, receipts and commits across a loss, a replaced shard's index.
Each test failed before its fix."""

import numpy as np

import pytest

from conduit_core import (ExperienceBuffer, ExperienceSpec, ExperienceTimeout, Prioritized,
                          RateLimiter, Uniform)


from ..helpers import SPEC, rollout


def _lose_on_first_call(storage, method, shard=0):
    """The first ``method`` call finds ``shard`` lost; its replacement is mocked ("node-x")."""
    from conduit_core import ShardLost
    orig, calls = getattr(storage, method), [0]

    def once(*a, **k):
        calls[0] += 1
        if calls[0] == 1:
            raise ShardLost(shard, None, RuntimeError("actor died"))
        return orig(*a, **k)
    setattr(storage, method, once)
    storage.replace_shard = lambda s: "node-x"
    storage.may_lose_shards = True   # the shard plays a remote one

def _fifo_two_shards(**kw):
    from conduit_core import Fifo, ShardSpec
    return ExperienceBuffer(spec=SPEC, capacity=100, selector=Fifo(), seed=1,
                            shards=[ShardSpec("pageable", 50), ShardSpec("pageable", 50)], **kw)


def test_a_loss_names_exactly_the_lost_seqs_after_the_ring_wrapped_through_the_shard():
    """Found by a review (session 23): a loss gave (min, max) of its seqs as "seqs 4..13" while
    6..9, in the other shard, were still stored."""
    from conduit_core import ShardSpec
    buf = ExperienceBuffer(spec=SPEC, capacity=10, shards=[ShardSpec("pageable", 6), ShardSpec("pageable", 4)])
    buf.add(rollout(10, 0))
    buf.add(rollout(4, 10))                       # shard 0 holds 10..13 and 4..5; shard 1 holds 6..9
    _lose_on_first_call(buf.storage, "gather")
    buf.sample(4)
    (loss,) = buf.losses
    assert loss.rows == 6 and loss.seq_range == (4, 13) and loss.seq_runs == ((4, 5), (10, 13))
    assert "seqs 4..5, 10..13" in loss.describe()


@pytest.mark.parametrize("selector", [Uniform, Prioritized])
def test_sampling_after_every_row_was_lost_is_a_clear_error_not_empty_rows(selector):
    """A shard loss that takes every stored row: the retried draw must not read the empty
    replacement (prioritized: rows of seq -1 with NaN weights; uniform: a raw ValueError)."""
    from conduit_core.errors import RateLimitError
    buf = ExperienceBuffer(spec=SPEC, capacity=100, selector=selector(), seed=1,
                           rate_limiter=RateLimiter(on_limit="raise"))
    buf.add(rollout(20, 0))
    _lose_on_first_call(buf.storage, "gather")
    with pytest.raises(RateLimitError, match="holds 0 items"):
        buf.sample(4)
    assert len(buf) == 0 and buf.losses[0].rows == 20


def test_a_fifo_buffer_passes_over_the_rows_a_lost_shard_held():
    """Issue 16: a FIFO buffer survives a lost shard as replay does (it used to raise the loss
    and stay stuck): the queued rows that were there leave, reported; the insert that found the
    loss is kept; the queue goes on in order."""
    from conduit_core import Fifo
    buf = ExperienceBuffer(spec=SPEC, capacity=100, selector=Fifo(), seed=1)
    buf.add(rollout(5, 0))
    _lose_on_first_call(buf.storage, "write")
    buf.add(rollout(5, 10))
    (loss,) = buf.losses
    assert loss.rows == 5 and loss.seq_range == (0, 4)
    assert len(buf) == 5
    assert buf.take(None)["obs"][:, 0].numpy().astype(int).tolist() == list(range(10, 15))


def test_a_fifo_whose_front_rows_were_lost_frees_their_slots_at_once():
    """Review: lost rows at the head of a full queue kept their slots, so inserts and a take
    waiting for a full batch waited for each other until both timed out."""
    buf = _fifo_two_shards(rate_limiter=RateLimiter(timeout=2.0))
    buf.add(rollout(100, 0))
    _lose_on_first_call(buf.storage, "gather", shard=0)
    with pytest.raises(ExperienceTimeout):
        buf.take(64, wait=False)                     # the loss is found: 50 survivors
    assert buf.losses[0].rows == 50 and len(buf) == 50
    buf.add(rollout(14, 100))                        # the 50 lost slots are free again
    got = buf.take(64)
    assert got["obs"][:, 0].numpy().astype(int).tolist() == list(range(50, 114))


def test_a_fifo_full_of_rows_and_gaps_says_so_instead_of_waiting():
    """Lost rows behind queued ones hold their slots until those are taken: a take that needs
    more rows than can ever be queued is told at once, and taking what is there frees them."""
    buf = _fifo_two_shards()
    buf.add(rollout(100, 0))
    _lose_on_first_call(buf.storage, "gather", shard=1)
    with pytest.raises(ExperienceTimeout, match="slots until the rows before them are taken"):
        buf.take(64)
    assert buf.take(None)["obs"][:, 0].numpy().astype(int).tolist() == list(range(50))
    buf.add(rollout(64, 100))
    assert buf.take(64)["obs"][:, 0].numpy().astype(int).tolist() == list(range(100, 164))


def test_rows_lost_from_a_fifo_do_not_stall_a_samples_per_insert_limit():
    """Review: lost FIFO rows stayed in the limiter's inserts but could never be sampled, so a
    ratio limit refused every later insert."""
    buf = _fifo_two_shards(rate_limiter=RateLimiter(samples_per_insert=1.0, tolerance=40, on_limit="raise"))
    buf.add(rollout(30, 0))
    buf.take(30)
    buf.add(rollout(40, 30))                         # seqs 30..69: 50..69 on shard 1
    _lose_on_first_call(buf.storage, "gather", shard=1)
    buf.take(None)                                   # 20 survivors taken, 20 lost
    assert buf.losses[0].rows == 20 and buf.counts.lost == 20
    buf.add(rollout(40, 70))                         # inserts - (sampled + lost) = 110 - 70 = 40: allowed
    again = ExperienceBuffer(spec=SPEC, capacity=100, selector=type(buf.selector)())
    again.load_state_dict(buf.state_dict())
    assert again.counts.lost == 20


def test_a_replaced_shard_keeps_its_index():
    """Review: a replacement reported itself as shard 0, so its own loss wiped shard 0."""
    from unittest import mock

    from conduit_core.remote.remote_shard import RemoteShard
    from conduit_core.storage.shards import ShardSpec
    with mock.patch("conduit_core.remote.remote_shard.spawn", return_value=mock.MagicMock()), \
            mock.patch("conduit_core.remote.remote_shard.wait_ready"), mock.patch("ray.get", return_value="node-id"), \
            mock.patch("ray.kill"):
        shard = RemoteShard(SPEC, ShardSpec("remote", 10, node="n1"))
        shard.index = 3
        new, where = shard.replacement(timeout=1.0)
    assert new.index == 3 and new.placed_on == "n1" and where == "node-id"


def test_a_loss_reported_through_a_handle_older_than_the_shards_replacement_is_not_recovered_again():
    """Review of ingestion at the source: a pull begun before a shard was replaced finds the old
    actor dead and reports ShardLost again. Recovering from it a second time would evict the rows
    just stored on the replacement and kill the healthy replacement."""
    from conduit_core import ShardLost, ShardSpec
    spec = ExperienceSpec.transition(obs_shape=(2,))
    buf = ExperienceBuffer(spec=spec, capacity=40, shards=[ShardSpec("pageable", 20), ShardSpec("pageable", 20)])
    rng = np.random.default_rng(0)

    def rows(n):
        return {"obs": rng.random((n, 2), np.float32), "action": np.zeros(n, np.int64),
                "reward": np.ones(n, np.float32), "next_obs": rng.random((n, 2), np.float32),
                "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
    buf.add(rows(30))
    storage = buf.storage
    storage.may_lose_shards = True
    replaced = []
    storage.replace_shard = lambda s: replaced.append(s) or "node-x"
    real_write, calls = storage.write, [0]

    def stale_once(*a, **k):
        calls[0] += 1
        if calls[0] == 1:   # a handle on an object that is no longer shard 1
            raise ShardLost(1, None, RuntimeError("old actor died"), part=object())
        return real_write(*a, **k)
    storage.write = stale_once
    buf.add(rows(5))
    assert replaced == [] and buf.losses == [] and len(buf) == 35   # nothing evicted, nothing replaced
    storage.write = real_write
    current = storage.parts[1]

    def live_once(*a, **k):
        storage.write = real_write
        raise ShardLost(1, None, RuntimeError("actor died"), part=current)
    storage.write = live_once
    buf.add(rows(5))
    assert replaced == [1] and len(buf.losses) == 1                 # the current shard's loss is handled
    buf.close()


def test_an_insert_that_fails_after_a_lost_shard_leaves_no_live_row_with_wrong_data():
    """Found in review (session 16): the write's first attempt wrote its run on the surviving
    shard, the lost one was replaced, and the retry failed (its staged rows were on the dead
    actor): the ring was never advanced, so the old seqs stayed live over the new rows (or the
    replacement's zeros), with no loss recorded. Now those rows leave, recorded."""
    from conduit_core import ShardSpec
    from conduit_core.errors import ShardLost, StagedRowsLost
    buf = ExperienceBuffer(spec=SPEC, capacity=8, shards=[ShardSpec("pageable", 4), ShardSpec("pageable", 4)])
    buf.add(rollout(6))
    buf.add(rollout(4, start=6))   # wrapped: the next insert goes to slots 2..5, over seqs 2..5
    st = buf.storage
    a, s = st.parts
    st.may_lose_shards = True
    real_a, real_s, calls = a.write, s.write, []

    def s_write(start, cols, first, n):
        raise ShardLost(1, None, RuntimeError("actor died"), part=s)

    def a_write(start, cols, first, n):
        calls.append(start)
        if len(calls) == 1:
            return real_a(start, cols, first, n)   # written, then the other shard fails
        raise StagedRowsLost("the staged rows were on the dead actor")

    def replace_shard(i, timeout=60.0):
        for name in SPEC.names:
            s.column(name).zero_()
        s.write = real_s
        return "node-x"
    a.write, s.write, st.replace_shard = a_write, s_write, replace_shard
    n, enc = buf.encode(rollout(4, start=100))
    with pytest.raises(StagedRowsLost):
        buf.add_encoded(enc, n)
    seq = buf.meta["seq"]
    live = buf.ring.live(np.arange(8), seq)
    obs = buf.storage.read_rows(0, 8)["obs"][:, 0].numpy()
    assert all(obs[k] == seq[k] for k in range(8) if live[k])     # every live row holds its own data
    assert sorted(int(x) for x in seq[live]) == [8, 9]
    assert [(loss.rows, loss.seq_range) for loss in buf.losses] == [(2, (6, 7)), (4, (2, 5))]
    assert len(buf) == 2


def test_a_commit_that_fails_part_way_reports_what_it_did_and_releases_what_it_took(monkeypatch):
    """Found in review (session 16): a commit that raised at its k-th receipt lost its report and
    never released the staged rows of the receipts committed before it."""
    from conduit_core.source import source_commit
    from conduit_core.source.source_writer import Receipt

    class Actor:
        def __init__(self):
            self.released = []

            class Release:
                def options(inner, **kw):
                    return inner

                def remote(inner, keys):
                    self.released.append(keys)
            self.release = Release()

    buf = ExperienceBuffer(spec=SPEC, capacity=8)
    actor = Actor()
    receipts = [Receipt(writer="w", ticket=t, n=2, source=0, policy_version=0, done={}, actor=actor, shard=0,
                        buffer=buf.ingest_ledger.buffer) for t in range(3)]
    real = source_commit.commit_one
    monkeypatch.setattr(source_commit, "begin_prepare", lambda b, rows, seq: None)     # (no staging actor here)
    monkeypatch.setattr(source_commit, "insert_staged", lambda b, r, rows, ahead, timeout: b.ring.inserted)

    def commit_one(b, r, ahead, timeout, report, release):
        if r.ticket == 1:
            raise TimeoutError("the second receipt timed out")
        return real(b, r, ahead, timeout, report, release)
    monkeypatch.setattr(source_commit, "commit_one", commit_one)
    with pytest.raises(TimeoutError) as raised:
        buf.commit(receipts)
    report = raised.value.commit_report
    assert [r.ticket for r, _ in report.committed] == [0]
    assert actor.released == [[("w", 0)]]          # the committed one's staged rows are let go
    buf.close()


def test_a_shard_lost_during_a_load_is_replaced_and_the_whole_state_is_loaded():
    """Found in review (session 16): the load wrote storage directly; a lost shard part way left
    some shards with the new rows and the metadata old, and the dead shard not replaced."""
    from conduit_core import ShardSpec
    from conduit_core.errors import ShardLost
    saved = ExperienceBuffer(spec=SPEC, capacity=8)
    saved.add(rollout(7, start=500))
    state = saved.state_dict()
    buf = ExperienceBuffer(spec=SPEC, capacity=8, shards=[ShardSpec("pageable", 4), ShardSpec("pageable", 4)])
    buf.add(rollout(6))
    st = buf.storage
    s = st.parts[1]
    st.may_lose_shards = True
    real_s = s.write

    def s_write(start, cols, first, n):
        raise ShardLost(1, None, RuntimeError("actor died"), part=s)

    def replace_shard(i, timeout=60.0):
        for name in SPEC.names:
            s.column(name).zero_()
        s.write = real_s
        return "node-x"
    s.write, st.replace_shard = s_write, replace_shard
    buf.load_state_dict(state)
    assert len(buf) == 7 and buf.read(np.arange(7))["obs"][:, 0].tolist() == [500.0 + k for k in range(7)]
    assert [loss.shard for loss in buf.losses] == [1]   # the rows of before the load that shard held
    buf.close()
    saved.close()


def test_two_buffers_restored_from_one_state_do_not_take_each_others_receipts():
    """Found by a review (session 23): a state restored into two buffers gave both the saved id,
    so either committed the receipts of the other's writers. A receipt of a writer handed out
    before the save is still taken by each (once each: they continue the same past)."""
    from conduit_core import ConfigError
    from conduit_core.source.source_writer import Receipt
    a = ExperienceBuffer(spec=SPEC, capacity=8)
    state = a.state_dict()
    b1, b2 = ExperienceBuffer(spec=SPEC, capacity=8), ExperienceBuffer(spec=SPEC, capacity=8)
    b1.load_state_dict(state)
    b2.load_state_dict(state)
    ids = {a.ingest_ledger.buffer, b1.ingest_ledger.buffer, b2.ingest_ledger.buffer}
    assert len(ids) == 3
    receipt = lambda t, of: Receipt(writer="w", ticket=t, n=0, source=0, policy_version=0, done={}, actor=None,
                                    shard=0, buffer=of.ingest_ledger.buffer)
    with pytest.raises(ConfigError, match="receipt.buffer"):
        b2.commit([receipt(1, b1)])
    assert len(b1.commit([receipt(1, b1)]).committed) == 1
    before = receipt(0, a)
    assert len(b1.commit([before]).committed) == 1 and len(b2.commit([before]).committed) == 1
    again = ExperienceBuffer(spec=SPEC, capacity=8)
    again.load_state_dict(b1.state_dict())     # a restore of a restore continues both pasts
    assert again.commit([before]).duplicates == [before] and len(again.commit([receipt(2, a)]).committed) == 1
    for buf in (a, b1, b2, again):
        buf.close()


def test_abandon_never_takes_a_receipt_a_commit_in_another_thread_holds(monkeypatch):
    """Found by a review (session 24): while a commit of [r0, r1] waited on r0, an abandon below r2
    took r1 (only the receipt in hand was marked pending); the commit then reported r1 a duplicate
    and its rows were never stored."""
    import threading
    from conduit_core.source import source_commit
    from conduit_core.source.source_writer import Receipt

    class Actor:
        class release:   # noqa: N801 - the actor method's shape: .options(...).remote(keys)
            @staticmethod
            def options(**kw):
                return Actor.release

            @staticmethod
            def remote(keys):
                pass
    buf = ExperienceBuffer(spec=SPEC, capacity=8)
    r0, r1, r2 = (Receipt(writer="w", ticket=t, n=2, source=0, policy_version=0, done={}, actor=Actor, shard=0,
                          buffer=buf.ingest_ledger.buffer) for t in range(3))
    waiting, go = threading.Event(), threading.Event()

    def insert_staged(b, r, rows, ahead, timeout):
        if r.ticket == 0:
            waiting.set()
            b.lock.wait_for(go.is_set, 10)   # waits as an insert waits for room: the lock released
        first = b.ring.inserted
        b.ring.advance(r.n)
        return first
    monkeypatch.setattr(source_commit, "begin_prepare", lambda b, rows, seq: None)     # (no staging actor here)
    monkeypatch.setattr(source_commit, "insert_staged", insert_staged)
    reports = []
    t = threading.Thread(target=lambda: reports.append(buf.commit([r0, r1])))
    t.start()
    assert waiting.wait(10)
    assert buf.abandon_before(r2) == 0      # r0 is being committed, r1 is held by that commit
    with buf.lock:
        go.set()
        buf.lock.notify_all()
    t.join(10)
    assert [r for r, _ in reports[0].committed] == [r0, r1] and not reports[0].duplicates
    assert buf.ingest_ledger.abandoned == 0 and not buf.ingest_ledger.claimed
    buf.close()
