"""The time-major checks (checks_time_major.py) both ways, without SRL (CI has none; the SRL adapter's
harness runs them against SRL's own queue in tests/srl_venv): a queue on Conduit's EntryQueue that
serves and drops as SRL's ``priority_queue`` passes against a plain reference queue written from SRL's
rule (the freshest batch first, the oldest dropped past ``max_size``), and each broken variant fails the
check named for it."""

import numpy as np
import pytest

from conduit_conformance import DeliveredTimeMajor, Harness, Session, check_adapter
from conduit_core.queues.entry_queue import EntryQueue


def _sample(rollout):
    cols = rollout.columns()
    return {"obs": cols["obs"], "action": cols["action"], "reward": cols["reward"],
            "terminated": cols["terminated"], "truncated": cols["truncated"],
            "version": np.full(len(rollout.ids), rollout.policy_version, np.int64)}


def _batch(columns: dict) -> DeliveredTimeMajor:
    rows = {k: np.array(v) for k, v in columns.items() if k != "version"}
    return DeliveredTimeMajor(ids=np.array(columns["obs"][..., 0]).astype(np.int64), rows=rows,
                              versions=np.array(columns["version"]))


class ReferenceQueue(Session):
    """The oracle: SRL's rule in a list. B chunks stacked along axis 1 form a batch; the freshest
    batch is served first; past ``max_batches`` the oldest is dropped."""

    def __init__(self, batch_size, max_batches):
        self.b, self.max, self.pending, self.queue = batch_size, max_batches, [], []

    def ingest(self, rollout):
        self.pending.append(_sample(rollout))
        if len(self.pending) == self.b:
            self.queue.append({k: np.stack([p[k] for p in self.pending], axis=1) for k in self.pending[0]})
            self.pending = []
            if len(self.queue) > self.max:
                self.queue.pop(0)

    def deliver(self, batch_size, *, policy_version=None):
        raise NotImplementedError

    def deliver_time_major(self):
        out = [_batch(c) for c in reversed(self.queue)]
        self.queue = []
        return out

    def stored_ids(self):
        return np.zeros(0, np.int64)


class EntryQueueSession(Session):
    """The adapter under test: Conduit's EntryQueue, with a fault where a real bug would sit."""

    def __init__(self, batch_size, max_batches, *, serve="freshest", overflow="drop_lowest", reuses=1,
                 fault=None):
        self.q = EntryQueue(max_entries=max_batches, batch_size=batch_size, reuses=reuses, serve=serve,
                            overflow=overflow)
        self.fault = fault

    def ingest(self, rollout):
        if self.fault != "drop_newest":
            self.q.put(_sample(rollout))
            return
        # the newest batch dropped when the queue is full (SRL drops the oldest): held until it forms
        self.held = getattr(self, "held", []) + [_sample(rollout)]
        if len(self.held) == self.q.batch_size:
            if self.q.qsize() < self.q.max_entries:
                for sample in self.held:
                    self.q.put(sample)
            self.held = []

    def deliver(self, batch_size, *, policy_version=None):
        raise NotImplementedError

    def deliver_time_major(self):
        out = []
        while (entry := self.q.get()) is not None:
            cols = {k: np.array(v) for k, v in entry.columns.items()}
            if self.fault == "batch_major":
                cols = {k: np.swapaxes(v, 0, 1) for k, v in cols.items()}
            elif self.fault == "steps_reversed":
                cols = {k: v[::-1] for k, v in cols.items()}
            elif self.fault == "version_lost":
                cols["version"] = np.zeros_like(cols["version"])
            elif self.fault == "action_of_the_next_chunk":
                cols["action"] = np.roll(cols["action"], -1, axis=1)
            out.append(_batch(cols))
        return out

    def stored_ids(self):
        return np.zeros(0, np.int64)

    def close(self):
        self.q.close()


class QueueHarness(Harness):
    name = "entry-queue"
    capabilities = frozenset({"time_major", "native"})

    def __init__(self, **variant):
        self.variant = variant

    def session(self, **kw):
        raise NotImplementedError

    def time_major_sessions(self, *, seed, batch_size, max_batches):
        return (EntryQueueSession(batch_size, max_batches, **self.variant),
                ReferenceQueue(batch_size, max_batches))


def _failed(harness) -> dict[str, str]:
    report = check_adapter(harness, select=["time_major"])
    assert {r.id for r in report.results} == {"deliver/time_major_batches", "equivalence/time_major_matches_native"}
    return {r.id: r.detail for r in report.results if r.status == "fail"}


def test_a_queue_with_srls_rule_passes_both_checks():
    assert _failed(QueueHarness()) == {}


@pytest.mark.parametrize("variant, caught_by", [
    ({"fault": "batch_major"}, "deliver/time_major_batches"),
    ({"fault": "steps_reversed"}, "deliver/time_major_batches"),
    ({"fault": "version_lost"}, "deliver/time_major_batches"),
    ({"fault": "action_of_the_next_chunk"}, "deliver/time_major_batches"),
    ({"reuses": 2}, "deliver/time_major_batches"),                     # each batch served twice
    ({"serve": "oldest"}, "equivalence/time_major_matches_native"),     # FIFO for SRL's freshest-first
    ({"overflow": "drop_oldest", "serve": "oldest"}, "equivalence/time_major_matches_native"),
    ({"fault": "drop_newest"}, "equivalence/time_major_matches_native"),   # the serve order right, the overflow not
])
def test_each_broken_queue_fails_the_check_named_for_it(variant, caught_by):
    assert caught_by in _failed(QueueHarness(**variant)), variant


def test_a_harness_that_declares_time_major_without_sessions_fails_rather_than_skips():
    class Declares(QueueHarness):
        def time_major_sessions(self, **kw):
            return None
    failed = _failed(Declares())
    assert "time_major_sessions returned None" in failed["deliver/time_major_batches"]
