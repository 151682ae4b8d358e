"""Found by a review of ingestion at the source and shard loss (session 23), each failing on
the code before: a FIFO buffer's insert that failed after a lost shard reported rows already
delivered as lost (delivered + lost + queued exceeded inserted); a writer truncated a float
source or policy version (2.7 -> 2) instead of refusing it."""

import numpy as np
import pytest

from conduit_core import ConfigError, ExperienceBuffer, ExperienceSpec, FieldSpec, Fifo
from conduit_core.source.source_writer import SourceWriter


def spec():
    return ExperienceSpec([FieldSpec("obs", (2,), np.float32), FieldSpec("done", (), np.bool_)])


def test_a_failed_fifo_insert_counts_only_queued_rows_as_lost():
    buf = ExperienceBuffer(spec=spec(), capacity=8, selector=Fifo())
    rows = {"obs": np.zeros((8, 2), np.float32), "done": np.zeros(8, bool)}
    buf.add(rows)
    assert buf.take(8).size == 8              # all eight delivered (consumed)
    buf.recovery.drop_overwritten(8, 8, RuntimeError("the insert over their slots failed"))
    assert buf.losses == []                   # nothing queued was there to lose
    buf.add({k: v[:4] for k, v in rows.items()})
    buf.recovery.drop_overwritten(12, 4, RuntimeError("failed"))   # slots 4..7 hold consumed seqs 4..7
    assert buf.losses == []
    buf.close()


@pytest.mark.parametrize("field, kw", [("source", dict(source=2.7)), ("source", dict(source=True))])
def test_a_writer_refuses_a_source_that_is_not_an_int(field, kw):
    with pytest.raises(ConfigError, match=field):
        SourceWriter(spec_config=spec().to_config(), capacity=8, done_fields=("done",), actor=None, shard=0,
                     buffer="b", **kw)


@pytest.mark.parametrize("field, kw", [("policy_version", dict(policy_version=3.9)), ("ticket", dict(ticket=0.5))])
def test_a_write_refuses_a_version_or_ticket_that_is_not_an_int(field, kw):
    w = SourceWriter(spec_config=spec().to_config(), capacity=8, done_fields=("done",), actor=None, shard=0,
                     source=0, buffer="b")
    with pytest.raises(ConfigError, match=field):
        w.write({"obs": np.zeros((1, 2), np.float32), "done": np.zeros(1, bool)}, **kw)


def test_a_pull_that_fails_unexpectedly_answers_so_its_release_still_runs():
    """A release of pieces pulled ahead runs once those pulls answer (they are its arguments):
    a pull that raised made Ray fail the release unrun, and the rows pulled stayed in that actor
    for good (a review, session 24). Now any failure is the pull's answer, and the commit that
    waited on it fails with an error saying the rows are still staged (not that they are lost)."""
    pytest.importorskip("ray")
    from types import SimpleNamespace

    from conduit_core.remote.remote_shard import RemoteShard, ShardActor

    class Unreachable:   # a staging actor whose call fails in a way Ray does not wrap
        def options(self, **_):
            return self

        def remote(self, *_):
            raise MemoryError("the object store is full")

    actor = ShardActor(spec().to_config(), 8)
    status = actor.pull_staged("w" * 16, 3, 0, 2, SimpleNamespace(staged_slice=Unreachable()))
    assert status.startswith("failed") and "MemoryError" in status
    shard = SimpleNamespace(index=1)
    with pytest.raises(RuntimeError, match="still staged.*commit the receipt again"):
        RemoteShard.check_pulled(shard, status, SimpleNamespace(key=("w" * 16, 3), shard=1))
