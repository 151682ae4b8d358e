"""End to end through SRL's own launcher (``srl-local run``, integrations/srl_cartpole): the trainer's
end of the stream is Conduit's SampleConsumer, bound and opened by Conduit's trainer worker in the
forked trainer process, over ZMQ and over shared memory; the actor worker is SIGKILLed mid-run.
Everything the consumer received is in the buffer (the consumer's and the buffer's own counts, and
the timing proxy's count of puts, agree), and the trainer trained on it. ~35 s per stream."""

import pytest


@pytest.mark.parametrize("stream", ["zmq", "shm"])
def test_conduit_consumer_under_srls_launcher_keeps_everything_received_when_the_actor_dies(stream, tmp_path):
    from integrations.srl_cartpole.run import Args, launch
    s = launch(Args(buffer="conduit", consumer="conduit", g_ing=4, stream=stream, seconds=32, kill_actor_after=22,
                    out=str(tmp_path / stream), quiet=True, warmup=2.0))
    assert s["actors_killed"] and not s["leftover_processes"], s
    c, acc = s["consumer"], s["buffer_accounting"]
    assert c["opened"] and c["stream"] == ("SHARED_MEMORY" if stream == "shm" else "NAME")
    assert c["received"] > 0 and c["received"] == c["put"] + c["staged"] + c["rejected"] + c["returned"], c
    assert c["rejected"] == c["undecodable"] == 0 and c["staged"] == 0, c     # the partial group was put (50 ms)
    assert acc["samples_put"] == s["totals"]["puts"] == c["put"], (acc, s["totals"], c)
    assert s["totals"]["gets"] > 0 and s["totals"]["trained"] > 0
