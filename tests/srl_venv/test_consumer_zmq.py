"""Conduit's SampleConsumer on SRL's real ZMQ sample stream (``NAME``: SRL's name resolution and its
``NameResolvingSampleProducer`` in forked processes): what was pushed is received exactly once, each
producer's samples in the order pushed, counted; g_ing groups; pickled it carries its configuration only;
close releases the socket and the name; a producer SIGKILLed mid-stream loses nothing received."""

import os
import pickle
import signal
import time
from collections import Counter

import pytest
from consumer_helpers import (GroupRecorder, drain, name_stream, per_source, pump_until, start_producers,
                              worker_info)

from conduit_core.errors import ClosedError, ConfigError
from conduit_srl.buffers import make_buffer as conduit_make_buffer
from conduit_srl.consumer import sample_consumer


@pytest.fixture(autouse=True)
def memory_name_resolve():
    import rlsrl.base.name_resolve as name_resolve
    name_resolve.reconfigure("memory")
    yield
    name_resolve.clear_subtree("/")


def srl_simple_queue():
    import rlsrl.base.buffer as srl_buffer
    return srl_buffer.SimpleQueueBuffer(max_size=10**6)


BUFFERS = {"conduit": lambda: conduit_make_buffer("simple_queue", max_size=10**6), "srl": srl_simple_queue}


def opened_consumer(trial, **kw):
    consumer = sample_consumer(name_stream(), **kw)
    consumer.bind(worker_info=worker_info(trial))
    return consumer


@pytest.mark.parametrize("buffer_kind", sorted(BUFFERS))
@pytest.mark.parametrize("g_ing", [1, 8])
def test_receives_exactly_what_was_pushed_in_each_producers_order(buffer_kind, g_ing):
    trial = f"exact{buffer_kind}{g_ing}"
    consumer = opened_consumer(trial, g_ing=g_ing, max_delay_s=60.0)
    buffer = GroupRecorder(BUFFERS[buffer_kind](), consumer)
    consumer.consume_to(buffer)                          # opens and registers the socket: producers find it
    counts = [200, 150, 250]                             # 600 = 75 groups of 8
    procs, done = start_producers(name_stream(), trial, counts)
    try:
        got = pump_until(consumer, buffer, [], lambda g: len(g) >= sum(counts))
    finally:
        done.set()
    time.sleep(0.3)
    assert consumer.consume_to(buffer, max_iter=1024) == 0 and drain(buffer) == []   # nothing more, nothing twice
    by = per_source(got)
    assert {s: by[s] for s in sorted(by)} == {i: list(range(n)) for i, n in enumerate(counts)}
    st = consumer.stats()
    assert (st["received"], st["put"], st["staged"], st["rejected"], st["undecodable"]) == (600, 600, 0, 0, 0)
    sizes = Counter(Counter(buffer.group_of_put).values())
    assert sizes == {g_ing: 600 // g_ing} and st["groups"] == 600 // g_ing and st["partial_groups"] == 0
    consumer.close()
    for p in procs:
        p.join(10)


def test_pickled_before_use_it_opens_nothing_and_close_returns_the_socket_and_the_name():
    import rlsrl.base.name_resolve as name_resolve
    import rlsrl.base.names as names
    consumer = pickle.loads(pickle.dumps(sample_consumer(name_stream(), g_ing=4)))
    assert type(consumer).__name__ == "ConduitSampleConsumer" and consumer.g_ing == 4
    from rlsrl.system.api.sample_stream import SampleConsumer, make_consumer
    assert isinstance(consumer, SampleConsumer) and make_consumer(consumer) is consumer   # SRL passes it through
    key = names.sample_stream("conduit_consumer_test", "lazy", "conduit_test")
    with pytest.raises(ConfigError, match="enable"):
        consumer.consume_to(conduit_make_buffer("simple_queue"))     # unbound: says how to fix it
    consumer.bind(worker_info=worker_info("lazy"))
    assert name_resolve.get_subtree(key) == [] and not consumer.stats()["opened"]   # bind opens nothing
    buffer = conduit_make_buffer("simple_queue")
    assert consumer.consume_to(buffer) == 0
    assert consumer.stats()["opened"] and len(name_resolve.get_subtree(key)) == 1
    import copy
    twin = copy.deepcopy(consumer)                     # the configuration only (SRL may copy its configs)
    assert not twin.bound and not twin.stats()["opened"] and twin.g_ing == 4 and consumer.stats()["opened"]
    source = consumer._source
    sock = source._sock
    consumer.close()
    assert sock.closed and source._ctx is None and name_resolve.get_subtree(key) == []
    assert not consumer.stats()["opened"] and consumer.stats()["closed"]
    consumer.close()                                                     # idempotent
    with pytest.raises(ClosedError):
        consumer.consume_to(buffer)


def test_a_producer_killed_mid_stream_loses_nothing_received():
    trial = "kill"
    consumer = opened_consumer(trial, g_ing=4, max_delay_s=0.02)
    buffer = conduit_make_buffer("simple_queue", max_size=10**6)
    consumer.consume_to(buffer)
    procs, done = start_producers(name_stream(), trial, [10**6, 300], pace_s=0.001)
    try:
        got = pump_until(consumer, buffer, [], lambda g: sum(s == 0 for s, _ in g) >= 100, timeout=60)
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].join(10)
        got = pump_until(consumer, buffer, got, lambda g: sum(s == 1 for s, _ in g) >= 300, quiet_s=1.0)
    finally:
        done.set()
    consumer.close()
    got += drain(buffer)
    by = per_source(got)
    assert by[1] == list(range(300))
    k = len(by[0])
    assert k >= 100 and by[0] == list(range(k))       # a prefix of what it pushed: no gap, no duplicate
    st = consumer.stats()
    assert st["received"] == st["put"] == len(got) == k + 300 and st["staged"] == st["rejected"] == 0
    assert buffer.stats()["samples_put"] == len(got)  # the buffer's own count agrees
    procs[1].join(10)


def test_a_message_that_does_not_decode_is_counted_and_skipped():
    import zmq
    trial = "garbage"
    consumer = opened_consumer(trial)
    buffer = conduit_make_buffer("simple_queue", max_size=100)
    consumer.consume_to(buffer)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://{consumer.stats()['address']}")
    push.send_multipart([b"not", b"a", b"namedarray"])
    from rlsrl.base import namedarray
    from consumer_helpers import sample
    push.send_multipart(namedarray.dumps(sample(0, 7), method="pickle"))
    got = pump_until(consumer, buffer, [], lambda g: len(g) >= 1)
    assert got == [(0, 7)]
    st = consumer.stats()
    assert st["undecodable"] == 1 and st["received"] == st["put"] == 1 and st["last_decode_error"]
    push.close(linger=0)
    ctx.term()
    consumer.close()


def test_bad_configuration_names_the_field_and_the_fix():
    import rlsrl.api.config as cfg
    with pytest.raises(ConfigError, match=r"^stream: expected .*Fix: "):
        sample_consumer(cfg.SampleStream(type_=cfg.SampleStream.Type.NULL))
    with pytest.raises(ConfigError, match=r"^g_ing: expected .*Fix: "):
        sample_consumer(name_stream(), g_ing=0)
    with pytest.raises(ConfigError, match=r"^shm_order: "):
        sample_consumer(name_stream(), shm_order="random")


def test_an_ip_stream_binds_the_given_address_for_srls_ip_producer():
    import socket

    import rlsrl.api.config as cfg
    import rlsrl.system.impl.remote_sample  # noqa: F401 - registers SRL's IP producer
    from rlsrl.system.api.sample_stream import make_producer

    from consumer_helpers import sample
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stream = cfg.SampleStream(type_=cfg.SampleStream.Type.IP, plugin=cfg.IpStreamPlugin(address=f"127.0.0.1:{port}"))
    consumer = sample_consumer(stream, g_ing=2, max_delay_s=0.0)
    consumer.bind(worker_info=worker_info("ip"))
    consumer.open()
    assert consumer.stats()["address"] == f"127.0.0.1:{port}"
    producer = make_producer(stream)
    for i in range(5):
        producer.post(sample(3, i))
    producer.flush()
    buffer = conduit_make_buffer("simple_queue", max_size=100)
    got = pump_until(consumer, buffer, [], lambda g: len(g) >= 5)
    assert got == [(3, i) for i in range(5)]
    consumer.close()
