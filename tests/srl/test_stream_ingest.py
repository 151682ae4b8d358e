"""The consumer's own logic, without SRL: ingestion at granularity g_ing (conduit_srl.ingest).

Samples received from a source land in the buffer in groups of g_ing, in the order received, each
exactly once; ``received == put + staged + rejected + returned`` after every call; a partial group is
put once it has waited ``max_delay_s`` and on close; a refused sample is counted and raised, the ones
after it stay staged. The same logic runs inside SRL's trainer in tests/srl_venv/test_consumer_*.py."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core.errors import ClosedError, ConfigError
from conduit_srl.ingest import StreamIngest


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class ListSource:
    """Hands out the integers 0, 1, ... as samples; ``available`` says how many have arrived."""

    def __init__(self):
        self.next, self.available, self.undecodable = 0, 0, 0
        self.asked: list[int] = []

    def receive(self, max_n):
        self.asked.append(max_n)
        n = min(max_n, self.available - self.next)
        out = list(range(self.next, self.next + n))
        self.next += n
        return out

    def close(self):
        pass


class PutBuffer:
    """SRL's buffer interface: put only. ``refuse`` holds samples whose put raises."""

    def __init__(self, refuse=()):
        self.items, self.calls, self.refuse = [], 0, set(refuse)

    def put(self, x):
        self.calls += 1
        if x in self.refuse:
            raise ValueError(f"refused {x}")
        self.items.append(x)


class BatchBuffer(PutBuffer):
    """With put_batch: all of a group or none of it."""

    def __init__(self, refuse=()):
        super().__init__(refuse)
        self.batches = []

    def put_batch(self, xs):
        self.calls += 1
        if self.refuse & set(xs):
            raise ValueError("refused")
        self.items.extend(xs)
        self.batches.append(list(xs))


def invariant(ing):
    c = ing.counts
    assert c.received == c.put + c.staged + c.rejected + c.returned
    assert c.staged == ing.staged


def test_g_ing_1_puts_every_sample_when_received():
    src, buf = ListSource(), PutBuffer()
    ing = StreamIngest(g_ing=1)
    src.available = 5
    assert ing.pump(src, buf, 1024) == 5
    assert buf.items == [0, 1, 2, 3, 4] and buf.calls == 5 and ing.counts.groups == 5
    invariant(ing)


def test_groups_of_g_ing_one_operator_call_each_and_the_source_asked_for_what_completes_a_group():
    clock = Clock()
    src, buf = ListSource(), BatchBuffer()
    ing = StreamIngest(g_ing=4, max_delay_s=0.05, clock=clock)
    src.available = 10
    assert ing.pump(src, buf, 1024) == 8
    assert buf.batches == [[0, 1, 2, 3], [4, 5, 6, 7]] and ing.staged == 2
    assert max(src.asked) <= 4
    invariant(ing)
    clock.t = 0.049                    # the partial group has not waited max_delay_s yet
    assert ing.pump(src, buf, 1024) == 0 and ing.staged == 2
    src.available = 12                 # it completes
    assert ing.pump(src, buf, 1024) == 4
    assert buf.batches[-1] == [8, 9, 10, 11] and ing.counts.partial_groups == 0
    invariant(ing)


def test_a_partial_group_is_put_once_its_oldest_sample_waited_max_delay():
    clock = Clock()
    src, buf = ListSource(), BatchBuffer()
    ing = StreamIngest(g_ing=4, max_delay_s=0.05, clock=clock)
    src.available = 3
    ing.pump(src, buf, 1024)
    clock.t = 0.03
    src.available = 4
    assert ing.pump(src, buf, 1024) == 4      # full: no delay involved
    src.available = 6
    clock.t = 0.04
    ing.pump(src, buf, 1024)
    clock.t = 0.08                             # 0.04 s since 4 and 5 arrived: not yet
    assert ing.pump(src, buf, 1024) == 0
    clock.t = 0.1
    assert ing.pump(src, buf, 1024) == 2 and buf.items == list(range(6))
    assert ing.counts.partial_groups == 1
    invariant(ing)


def test_max_iter_bounds_a_call_and_close_flushes_what_is_staged():
    src, buf = ListSource(), BatchBuffer()
    ing = StreamIngest(g_ing=8, max_delay_s=60)
    src.available = 100
    assert ing.pump(src, buf, 20) == 16 and src.next == 20 and ing.staged == 4
    assert ing.close(buf) == 4 and buf.items == list(range(20))
    invariant(ing)
    with pytest.raises(ClosedError):
        ing.pump(src, buf, 1)


def test_without_put_batch_a_group_is_one_put_per_sample_in_order():
    src, buf = ListSource(), PutBuffer()
    ing = StreamIngest(g_ing=3, max_delay_s=60)
    src.available = 7
    assert ing.pump(src, buf, 1024) == 6 and buf.items == list(range(6)) and ing.counts.groups == 2


@pytest.mark.parametrize("cls", [PutBuffer, BatchBuffer])
def test_a_refused_sample_is_counted_and_raised_the_rest_of_its_group_stays_staged(cls):
    src, buf = ListSource(), cls(refuse={5})
    ing = StreamIngest(g_ing=4, max_delay_s=60)
    src.available = 12
    with pytest.raises(ValueError, match="refused"):
        ing.pump(src, buf, 1024)
    assert buf.items == [0, 1, 2, 3, 4] and ing.counts.rejected == 1 and ing.staged == 2   # 6, 7 wait
    invariant(ing)
    assert ing.pump(src, buf, 1024) == 4      # 6, 7 first, with 8, 9; 10, 11 wait for their group
    assert ing.close(buf) == 2
    assert buf.items == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    invariant(ing)


def test_consume_takes_staged_samples_first_and_counts_them_returned():
    src, buf = ListSource(), BatchBuffer()
    ing = StreamIngest(g_ing=4, max_delay_s=60)
    src.available = 2
    ing.pump(src, buf, 1024)
    assert ing.take_staged(1) == [0]
    ing.count_returned(1)                      # one more, straight from the source
    assert ing.counts.returned == 2 and ing.counts.received == 3
    invariant(ing)


@pytest.mark.parametrize("kw, field", [(dict(g_ing=0), "g_ing"), (dict(g_ing=2.0), "g_ing"),
                                       (dict(g_ing=True), "g_ing"), (dict(max_delay_s=-1), "max_delay_s")])
def test_bad_options_name_the_argument_and_the_fix(kw, field):
    with pytest.raises(ConfigError, match=rf"^{field}: expected .*Fix: "):
        StreamIngest(**kw)


@settings(max_examples=150, deadline=None)
@given(g=st.integers(1, 9), arrivals=st.lists(st.tuples(st.integers(0, 25), st.integers(1, 40),
                                                        st.floats(0, 0.1)), min_size=1, max_size=25),
       refuse=st.sets(st.integers(0, 300), max_size=6), batched=st.booleans())
def test_exactly_once_in_order_whatever_the_arrivals_limits_and_refusals(g, arrivals, refuse, batched):
    clock = Clock()
    src, buf = ListSource(), (BatchBuffer if batched else PutBuffer)(refuse=refuse)
    ing = StreamIngest(g_ing=g, max_delay_s=0.05, clock=clock)
    raised = 0
    for more, max_iter, dt in arrivals:
        src.available += more
        clock.t += dt
        try:
            ing.pump(src, buf, max_iter)
        except ValueError:
            raised += 1
        invariant(ing)
        assert all(len(b) <= g for b in getattr(buf, "batches", []))
    for _ in range(len(refuse) + 1):       # each refused sample raises once, then it is gone
        try:
            ing.close(buf)
            break
        except ValueError:
            raised += 1
    received = list(range(src.next))
    assert buf.items == [x for x in received if x not in refuse]       # each once, in the order received
    assert ing.counts.rejected == raised == len(refuse & set(received))
    assert ing.counts.put + ing.counts.rejected == src.next and ing.staged == 0


@pytest.mark.parametrize("cls", [PutBuffer, BatchBuffer])
def test_a_buffer_that_fails_for_another_reason_keeps_the_sample_staged(cls):
    """Found in review (session 16): a closed or failing buffer's error made the first sample of the
    group count as refused and leave the stage (and put_batch's own error was dropped for the
    one-at-a-time retry). Only a refused sample (ValueError, TypeError) leaves; the rest stays."""
    class Failing(cls):
        def put(self, x):
            raise ClosedError("the buffer is closed")

        def put_batch(self, xs):
            raise ClosedError("the buffer is closed")
    src, buf = ListSource(), Failing()
    ing = StreamIngest(g_ing=4, max_delay_s=60)
    src.available = 4
    with pytest.raises(ClosedError):
        ing.pump(src, buf, 1024)
    assert ing.counts.rejected == 0 and ing.staged == 4 and ing.counts.put == 0
    invariant(ing)


def test_the_trainer_workers_exit_puts_what_the_consumer_staged_before_srl_saves_the_buffer(monkeypatch):
    """Found by a review (session 24): SRL's exit saves the buffer (save_buffer_on_exit), then closes
    the stream; the consumer put its staged samples (a partial group under max_delay_s) only at that
    close, after the snapshot. ``flush_consumer`` runs first in Conduit's trainer worker's exit."""
    import types
    from conduit_srl.consumer import ConsumerBase   # (the consumer's behaviour; SRL's class is only its base)
    from conduit_srl.trainer_worker import flush_consumer
    stream = types.SimpleNamespace(type_=types.SimpleNamespace(name="IP"), stream_name="s", address="x")
    consumer = ConsumerBase(stream, g_ing=4, max_delay_s=30.0)
    source = ListSource()
    source.opened = True
    monkeypatch.setattr(consumer, "_make_source", lambda: source)
    consumer.worker_info = object()          # bound (as Conduit's trainer worker binds it)
    buf = BatchBuffer()
    source.available = 6
    assert consumer.consume_to(buf) == 4    # one group of 4 stored; 2 wait for their group
    worker = types.SimpleNamespace(_TrainerWorker__stream=consumer)
    flush_consumer(worker)
    assert buf.items == list(range(6)) and consumer.stats()["staged"] == 0
    flush_consumer(types.SimpleNamespace(_TrainerWorker__stream=object()))   # SRL's own consumers: untouched
    consumer.close()


def test_a_shared_memory_read_that_fails_after_reading_some_samples_hands_them_over():
    """Found by a review (session 24): a slot group that failed to copy out dropped the groups read
    before it in the same call (their slots already released: lost, uncounted). They are handed
    over; the failure is raised by the next call; the failed slots count as undecodable."""
    from conduit_srl.sources import ShmSource

    class Ctrl:
        def __init__(self):
            self.slots, self.released = [0, 1, 2, 3], []

        def acquire_read(self, batch_size, preference):
            if len(self.slots) < batch_size:
                return None
            got, self.slots = self.slots[:batch_size], self.slots[batch_size:]
            return got

        def release_read(self, ids):
            self.released += list(ids)

    class Dock:
        def get(self, ids):
            if 2 in list(ids):
                raise ValueError("a torn slot")
            return {"batch": list(ids)}
    ctrl = Ctrl()
    src = ShmSource(experiment_name="e", trial_name="t", stream_name="s", qsize=4, ctrl=ctrl, batch_size=2)
    src._dock = Dock()   # (opened: SRL's dock stands in)
    assert src.receive(4) == [{"batch": [0, 1]}]
    assert src.undecodable == 2 and sorted(ctrl.released) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="torn"):
        src.receive(4)
    assert src.receive(4) == []
