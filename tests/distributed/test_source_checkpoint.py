"""The commit ledger of writers at the source is part of the buffer's state: a receipt
committed before a checkpoint and retried after a restore is a counted duplicate, nothing added."""

import os

import numpy as np
import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ray = pytest.importorskip("ray")

from conduit_core import ExperienceBuffer, Fifo, ShardSpec, StateError  # noqa: E402

from ..core.helpers import SPEC, rollout  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    from conduit_core.remote.ray_local import init_local
    init_local(num_cpus=2, object_store_memory=96 << 20, log_to_driver=False, configure_logging=False,
               ignore_reinit_error=True)
    yield
    ray.shutdown()


def remote_buffer(n: int = 20) -> ExperienceBuffer:
    return ExperienceBuffer(spec=SPEC, capacity=n, shards=[ShardSpec("remote", n)], selector=Fifo())


def test_a_receipt_committed_before_a_checkpoint_is_a_duplicate_after_restore(local_ray):
    buf, new = remote_buffer(), remote_buffer()
    try:
        w = buf.writer(source=1, shard=0)
        r0, r1 = w.write(rollout(4, 0)), w.write(rollout(3, 100))
        assert [c.key for c, _ in buf.commit([r0]).committed] == [r0.key]
        state = buf.state_dict()
        assert state["ingest"]["floors"].tolist() == [r0.ticket + 1] and state["ingest"]["above"].size == 0
        new.load_state_dict(state)
        before = new.state_dict()
        report = new.commit([r0])                       # retried after the restore: taken once already
        assert report.duplicates == [r0] and not report.committed and report.rows == 0
        assert new.ingest_ledger.duplicates == 1 and len(new) == 4
        after = new.state_dict()
        assert after["counters"] == before["counters"]
        for k, v in before["data"].items():
            np.testing.assert_array_equal(after["data"][k], v)
        # a receipt not committed before the checkpoint is still taken (once) by the restored buffer
        report = new.commit([r1, r1])
        assert [c.key for c, _ in report.committed] == [r1.key] and len(report.duplicates) == 1
        assert len(new) == 7 and new.take(None)["obs"][:, 0].numpy().astype(int).tolist() == [0, 1, 2, 3, 100, 101, 102]
    finally:
        buf.close()
        new.close()


def test_a_damaged_ledger_state_is_refused_and_nothing_is_loaded(local_ray):
    buf, new = remote_buffer(), remote_buffer()
    try:
        w = buf.writer(source=1, shard=0)
        buf.commit([w.write(rollout(4, 0))])
        state = buf.state_dict()
        state["ingest"] = dict(state["ingest"], above=np.array([[5, 0]]))   # writer index out of range
        with pytest.raises(StateError, match="ingest.above"):
            new.load_state_dict(state)
        assert len(new) == 0 and not new.ingest_ledger.taken
        legacy = buf.state_dict()
        del legacy["ingest"]                             # a state written before the ledger was saved
        new.load_state_dict(legacy)
        assert len(new) == 4 and not new.ingest_ledger.taken
    finally:
        buf.close()
        new.close()
