"""Ingestion at the source on a multi-node Ray cluster (ray.cluster_utils.Cluster: a head and
two worker nodes for the module, a third added and removed by the node-loss test).

Writers run in Ray actors pinned to nodes; each stages in the shard on its own node and the
driver commits receipts (counts) and consumes through a FIFO ``take``. Every row carries a
unique id in ``obs[:, 0]`` (source * 100_000 + its index), so "exactly once" is checked on
the data itself, not on counters."""

import os
import pickle

import numpy as np
import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ray = pytest.importorskip("ray")
hypothesis = pytest.importorskip("hypothesis")

from conduit_core import ConfigError, ExperienceBuffer, Fifo, ShardSpec, SpecError  # noqa: E402
from conduit_core.source.source_commit import committed_seqs  # noqa: E402

from ..core.helpers import SPEC, rollout  # noqa: E402

NODES = ("src_node1", "src_node2")


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 96 << 20})
    for name in NODES:
        c.add_node(num_cpus=1, resources={name: 1}, object_store_memory=96 << 20)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


@ray.remote(num_cpus=0)
class Runner:
    """An env runner stand-in: holds a writer, writes rollouts where it runs, returns receipts."""

    def __init__(self, writer):
        self.writer, self.next = writer, 0

    def node_id(self):
        return ray.get_runtime_context().get_node_id()

    def rollouts(self, k: int, n: int):
        """``k`` rollouts of ``n`` rows: (receipt, first row id) each."""
        out = []
        for _ in range(k):
            start = self.writer.source * 100_000 + self.next
            out.append((self.writer.write(rollout(n, start)), start))
            self.next += n
        return out

    def write_bad(self):
        bad = rollout(4)
        bad["obs"] = bad["obs"].astype(np.float64)
        try:
            self.writer.write(bad)
        except SpecError as exc:
            return exc.field, str(exc)
        return None, "no error"


def runner_on(buf, node: str, source: int, shard: int):
    return Runner.options(resources={node: 0.001}).remote(buf.writer(source=source, shard=shard))


def fifo_buffer(per_shard: int, nodes=NODES):
    shards = [ShardSpec("pageable", per_shard)] + [ShardSpec("remote", per_shard, node=n) for n in nodes]
    return ExperienceBuffer(spec=SPEC, capacity=per_shard * (1 + len(nodes)), shards=shards, selector=Fifo())


def ids_of(batch) -> list[int]:
    return batch["obs"][:, 0].numpy().astype(int).tolist()


def expected_ids(report, starts: dict) -> dict[int, int]:
    """seq -> the row id that seq must hold, from the commit report and the writers' starts."""
    return {first + i: starts[r.key] + i for r, first in report.committed for i in range(r.n)}


def test_writers_on_two_nodes_ingest_into_three_shards_exactly_once(cluster):
    buf = fifo_buffer(30)
    try:
        runners = [runner_on(buf, node, source=k + 1, shard=k + 1) for k, node in enumerate(NODES)]
        nodes = ray.get([r.node_id.remote() for r in runners])
        assert len(set(nodes)) == 2 and ray.get_runtime_context().get_node_id() not in nodes
        want, got, seq_of = [], [], {}
        for _ in range(6):   # 6 rounds x 2 runners x 2 rollouts x 7 rows: wraps the 90-slot ring 1.9 times
            pairs = [p for out in ray.get([r.rollouts.remote(2, 7) for r in runners]) for p in out]
            receipts = [rec for rec, _ in pairs]
            assert all(len(pickle.dumps(rec)) < 2_000 for rec in receipts)   # counts and flags, no rows
            report = buf.commit(receipts)
            assert not report.duplicates and not report.never_accepted
            seq_of.update(expected_ids(report, {rec.key: s for rec, s in pairs}))
            want += [s + i for rec, s in pairs for i in range(rec.n)]
            b = buf.take(None)
            got += ids_of(b)
            assert [seq_of[s] for s in b.seqs.tolist()] == ids_of(b)   # each seq holds its own row
        assert sorted(got) == sorted(want) and len(set(got)) == len(got) == 168
        for source in (1, 2):    # per source, in the order written
            mine = [i for i in got if i // 100_000 == source]
            assert mine == sorted(mine)
        stats = ray.get([p.actor.staging_stats.remote() for p in buf.storage.parts[1:]])
        assert all(s["rollouts"] == 0 for s in stats)          # committed rows left the staging areas
    finally:
        buf.close()


def test_a_retired_writer_frees_what_it_staged_and_nobody_committed(cluster):
    """A runner whose result RLlib dropped, then given a new writer, never sends a later receipt
    of its old one, so ``abandon_before`` never frees what the dropped result staged (a review,
    session 24: it stayed in the actor for good). ``retire_writer`` drops it; the old writer then
    refuses to stage (its caller falls back, as for a lost shard)."""
    from conduit_core.errors import StagedRowsLost
    buf = fifo_buffer(10)
    try:
        w = buf.writer(source=3, shard=1)
        kept = w.write(rollout(3, 0))
        w.write(rollout(4, 3))                                       # a result nobody will commit
        assert ray.get(buf.storage.parts[1].actor.staging_stats.remote())["rollouts"] == 2
        buf.commit([kept])
        assert buf.retire_writer(w) == 1 and buf.ingest_ledger.abandoned == 1
        assert ray.get(buf.storage.parts[1].actor.staging_stats.remote())["rollouts"] == 0
        with pytest.raises(StagedRowsLost, match="retired"):
            w.write(rollout(2, 7))
        fresh = buf.writer(source=3, shard=1)
        buf.commit([fresh.write(rollout(2, 7))])
        assert ids_of(buf.take(None)) == [0, 1, 2, 7, 8]
    finally:
        buf.close()


def test_a_retried_stage_or_commit_changes_nothing(cluster):
    buf = fifo_buffer(10)
    try:
        w = buf.writer(source=3, shard=1)
        r0 = w.write(rollout(5, 0))
        again = w.write(rollout(5, 0), ticket=r0.ticket)          # a stage sent twice: staged once
        assert again.key == r0.key
        r1 = w.write(rollout(4, 5))
        first = buf.commit([r0, r1])
        dup = buf.commit([r0, again, r1])
        assert [f for _, f in first.committed] == [0, 5] and len(dup.duplicates) == 3 and not dup.committed
        assert buf.ingest_ledger.duplicates == 3 and len(buf) == 9
        w.write(rollout(5, 0), ticket=r0.ticket)                    # a stage retried after its commit
        assert ray.get(buf.storage.parts[1].actor.staging_stats.remote())["rollouts"] == 0
        assert ids_of(buf.take(None)) == list(range(9))
        with pytest.raises(Exception, match="ticket"):
            w.write(rollout(1), ticket=99)
        other = fifo_buffer(10)
        try:
            with pytest.raises(Exception, match="receipt.buffer"):
                other.commit([w.write(rollout(2))])
        finally:
            other.close()
    finally:
        buf.close()


def test_an_altered_receipt_is_refused_and_the_genuine_one_still_commits_once(cluster):
    """A receipt whose row count was changed after write (+3) is refused naming it, with nothing
    taken (it was refused as 'rows gone' and marked taken, so the genuine receipt then counted as a
    duplicate and its rollout was never stored)."""
    from dataclasses import replace
    buf = fifo_buffer(10)
    try:
        w = buf.writer(source=1, shard=1)
        genuine = w.write(rollout(4, 0))
        with pytest.raises(ConfigError, match="receipt.n"):
            buf.commit([replace(genuine, n=genuine.n + 3)])
        assert len(buf) == 0 and buf.ingest_ledger.duplicates == 0 and buf.ingest_ledger.never_accepted == 0
        report = buf.commit([genuine])
        assert [f for _, f in report.committed] == [0] and not report.duplicates
        assert ids_of(buf.take(None)) == [0, 1, 2, 3]
    finally:
        buf.close()


def test_receipts_that_never_arrive_are_abandoned_below_one_that_did(cluster):
    """Found by a review (session 23): a receipt never committed (a result the caller dropped)
    kept its rows staged in the actor and every later ticket of its writer listed in the ledger."""
    buf = fifo_buffer(10)
    try:
        w = buf.writer(source=3, shard=1)
        r0, r1, r2, r3 = (w.write(rollout(3, 10 * t)) for t in range(4))
        buf.commit([r0])
        assert buf.abandon_before(r3) == 2              # r1 and r2 never reached the buffer
        assert buf.abandon_before(r3) == 0              # once
        buf.commit([r3])
        led = buf.ingest_ledger
        assert led.abandoned == 2 and not led.taken.above and led.taken.floors[w.id] == 4
        assert buf.commit([r1]).duplicates == [r1]      # a late one is taken once: never stored
        assert ids_of(buf.take(None)) == [0, 1, 2, 30, 31, 32]
        import time
        time.sleep(0.5)                                 # releases are sent without waiting
        assert ray.get(buf.storage.parts[1].actor.staging_stats.remote())["rollouts"] == 0
        other = fifo_buffer(10)
        try:
            with pytest.raises(Exception, match="receipt.buffer"):
                other.abandon_before(r3)
        finally:
            other.close()
    finally:
        buf.close()


def test_bad_input_fails_in_the_writer_with_the_field_named(cluster):
    buf = fifo_buffer(10)
    try:
        field, msg = ray.get(runner_on(buf, NODES[0], source=1, shard=1).write_bad.remote())
        assert field == "obs" and "float32" in msg and "Fix" in msg
        assert buf.inserted == 0
    finally:
        buf.close()


def test_a_sample_over_remote_shards_starts_every_gather_before_waiting(cluster):
    """Delivery: each remote shard's gather is started before any is awaited, so the
    shards on different nodes answer at once (the benchmark times it)."""
    buf = fifo_buffer(20)
    try:
        w1, w2 = buf.writer(source=1, shard=1), buf.writer(source=2, shard=2)
        buf.commit([w1.write(rollout(20, 0)), w2.write(rollout(20, 20)), w1.write(rollout(20, 40))])
        events = []
        for part in buf.storage.parts:
            begin = part.begin_gather

            def traced(local, names, target, begin=begin, i=part.index):
                events.append(("start", i))
                finish = begin(local, names, target)
                return lambda: (events.append(("finish", i)), finish())[1]
            part.begin_gather = traced
        b = buf.take(60)
        assert ids_of(b) == list(range(60))
        kinds = [e for e, _ in events]
        assert kinds == ["start"] * 3 + ["finish"] * 3 and {i for _, i in events} == {0, 1, 2}
    finally:
        buf.close()


def test_interleaved_stages_commits_and_retries_give_each_row_once(cluster):
    from hypothesis import given, settings, strategies as st
    buf = fifo_buffer(16)
    writers = [buf.writer(source=s, shard=1 + s % 2) for s in range(3)]
    ops = st.lists(st.tuples(st.sampled_from(["write", "restage", "commit", "recommit"]), st.integers(0, 2),
                             st.integers(1, 6)), max_size=12)

    @settings(max_examples=12, deadline=None, derandomize=True)
    @given(ops)
    def run(plan):
        staged, committed, want, got = [], [], [], []
        for op, w, n in plan:
            writer = writers[w]
            if op == "write":
                start = w * 100_000 + writer.next_ticket * 10
                staged.append((writer.write(rollout(n, start)), rollout(n, start)))
                want += list(range(start, start + n))
            elif op == "restage" and staged:
                rec, batch = staged[n % len(staged)]
                assert writers[rec.source].write(batch, ticket=rec.ticket).key == rec.key
            elif op == "commit" and staged:
                committed += [rec for rec, _ in staged]
                assert buf.commit([rec for rec, _ in staged]).rows == sum(rec.n for rec, _ in staged)
                staged.clear()
                got += ids_of(buf.take(None))
            elif op == "recommit" and committed:
                assert not buf.commit(committed[-n:]).committed
        buf.commit([rec for rec, _ in staged])
        got += ids_of(buf.take(None))
        assert sorted(got) == sorted(want) and len(set(got)) == len(got)
    try:
        run()
    finally:
        buf.close()


def test_one_receipt_committed_by_two_threads_is_stored_once_and_leaves_no_copy_staged(cluster):
    """Found by a review (session 23): a commit of [R1, R] pulls R's rows ahead into their
    destination shard's actor, then waits for room for R1; a second commit of [R] stores R
    meanwhile, elsewhere; the first then finds R a duplicate, and its copy stayed staged there."""
    import threading
    import time
    buf = fifo_buffer(10, nodes=NODES + NODES[:1])   # a local shard and three remote ones
    try:
        buf.add(rollout(40, 0))
        buf.take(20)
        buf.add(rollout(20, 40))                      # full; the next rows go to slots 20.. (shard 2)
        w = buf.writer(source=1, shard=1)             # staged in shard 1's actor
        r1, r = w.write(rollout(10, 2000)), w.write(rollout(5, 1000))
        reports = {}

        def commit_in_thread(name, receipts, waits_on):
            t = threading.Thread(target=lambda: reports.__setitem__(name, buf.commit(receipts, timeout=60)))
            t.start()
            deadline = time.monotonic() + 30
            while waits_on.key not in buf.ingest_ledger.pending and time.monotonic() < deadline:
                time.sleep(0.01)                      # it waits for room, its pulls begun
            return t
        both = commit_in_thread("both", [r1, r], r1)  # R pulled ahead for seqs 70.. (shard 3)
        alone = commit_in_thread("alone", [r], r)     # R pulled for seqs 60.. (shard 2)
        got = ids_of(buf.take(5))                     # room for R (5 rows), not for R1 (10)
        alone.join(60)
        got += ids_of(buf.take(None))
        both.join(60)
        got += ids_of(buf.take(None))
        assert [f for _, f in reports["alone"].committed] == [60]
        assert [f for _, f in reports["both"].committed] == [65] and reports["both"].duplicates == [r]
        assert got == list(range(20, 60)) + list(range(1000, 1005)) + list(range(2000, 2010))
        time.sleep(0.5)                               # releases are sent without waiting
        stats = ray.get([p.actor.staging_stats.remote() for p in buf.storage.parts[1:]])
        assert [s["rollouts"] for s in stats] == [0, 0, 0]
    finally:
        buf.close()


def test_a_node_lost_mid_run_loses_exactly_its_rows_and_a_checkpoint_keeps_the_survivors(cluster):
    """Four nodes; writers on three of them; the third node leaves the cluster while writers
    and a consumer go on. Receipts it staged but the driver had not committed are never
    accepted; rows it held unconsumed are reported lost, exactly; every other row is delivered
    once; a state_dict after the loss restores exactly the survivors."""
    node = cluster.add_node(num_cpus=1, resources={"src_node_gone": 1}, object_store_memory=96 << 20)
    cluster.wait_for_nodes()
    nodes = NODES + ("src_node_gone",)
    buf = fifo_buffer(24, nodes)           # slots: 0..23 local, 24..47 node1, 48..71 node2, 72..95 gone
    try:
        runners = [runner_on(buf, n, source=k + 1, shard=k + 1) for k, n in enumerate(nodes)]
        seq_of, got, accepted, refused, lost_receipts = {}, [], 0, [], []
        for rnd in range(8):     # 3 x 8 rows a round until the loss, 2 x 8 after; 10 taken a round
            live = runners if rnd < 4 else runners[:2]
            pairs = [p for out in ray.get([r.rollouts.remote(1, 8) for r in live]) for p in out]
            if rnd == 4:   # the node leaves with rows staged there and rows queued on its shard
                pairs += ray.get(runners[2].rollouts.remote(1, 8))
                slots = buf.ring.queued_seqs() % buf.capacity
                on_gone = set(buf.ring.queued_seqs()[(slots >= 72) & (slots < 96)].tolist())
                cluster.remove_node(node)
            report = buf.commit([rec for rec, _ in pairs])
            refused += [r.source for r, _ in report.never_accepted]
            lost_receipts = [r for r, _ in report.never_accepted] if report.never_accepted else lost_receipts
            accepted += report.rows
            seq_of.update(expected_ids(report, {rec.key: s for rec, s in pairs}))
            b = buf.take(min(len(buf), 10))                       # the consumer keeps a few rows queued
            got += ids_of(b)
            assert [seq_of[s] for s in b.seqs.tolist()] == ids_of(b)
        assert refused == [3]                # the receipt staged on the lost node, never accepted
        never = buf.ingest_ledger.never_accepted
        again = buf.commit(lost_receipts)    # committed again (a retried call): a duplicate, counted once
        assert again.duplicates == lost_receipts and not again.never_accepted
        assert buf.ingest_ledger.never_accepted == never
        (loss,) = buf.losses
        assert on_gone and loss.shard == 3 and loss.rows == len(on_gone)
        assert loss.seq_range == (min(on_gone), max(on_gone))
        survivors = buf.ring.queued_seqs().tolist()
        assert set(survivors).isdisjoint(on_gone)
        assert len(got) + loss.rows + len(survivors) == accepted          # every accepted row accounted for
        state = buf.state_dict()
        restored = ExperienceBuffer(spec=SPEC, capacity=buf.capacity, selector=Fifo())
        restored.load_state_dict(state)
        rest = restored.take(None)
        assert rest.seqs.tolist() == survivors and ids_of(rest) == [seq_of[s] for s in survivors]
        restored.close()
        got += ids_of(buf.take(None))
        assert len(set(got)) == len(got) == accepted - loss.rows
    finally:
        buf.close()


def test_writers_go_to_live_shards_while_a_dead_one_is_not_yet_replaced(cluster):
    """Found by a review (session 24): a shard's actor dead before any operation reached it (the ring
    had not come to its slots) made ``writer(node=...)`` raise for every source: RLlib's runners
    then got no writers at all. The dead shard is passed over; writes go to a live one."""
    buf = fifo_buffer(50)                             # 150 slots: the ring stays in shard 0 here
    try:
        dead = buf.storage.parts[2].actor
        node2 = ray.get(dead.node_id.remote())
        ray.kill(dead)
        import time
        time.sleep(1.0)
        w = buf.writer(source=5, node=node2)         # its node's shard is gone: another one
        assert w.shard == 1
        buf.commit([w.write(rollout(4, 0))])
        assert ids_of(buf.take(None)) == [0, 1, 2, 3]
    finally:
        buf.close()
