"""Mutations of the SRL adapter that the conformance suite must catch, each by a named check
(the SRL rows of the mutation table in docs/benchmarks.md). Each mutant is the real adapter
with one promise broken where a real bug would sit."""

import numpy as np
import pytest

from conduit_conformance import check_adapter
from conduit_srl.buffers import ConduitQueueBuffer, ConduitReplayBuffer
from conduit_srl.conformance import QueueSession, ReplaySession, SRLHarness, conduit_stored_ids


class DropEvery10th(ConduitReplayBuffer):
    seen = 0

    def put(self, x):
        self.seen += 1
        if self.seen % 10:
            super().put(x)


class PrioritiesOnWrongRows(ConduitReplayBuffer):
    def update_priorities(self, idxes, priorities):
        return super().update_priorities(idxes, np.roll(np.asarray(priorities), 1))


class KeepsOldestWhenFull(ConduitReplayBuffer):
    """Refuses new chunks once full instead of overwriting the oldest (SRL's ring)."""

    def put(self, x):
        if self.full():
            return None
        return super().put(x)


class RngNotRestored(ConduitReplayBuffer):
    def __setstate__(self, state):
        super().__setstate__(state)
        self._buffer.rng = np.random.default_rng(12345)


class RewardsOfTheNextRow(ConduitReplayBuffer):
    """Each row of a get carries the next row's reward (the ids, obs[:, 0], stay right)."""

    def get(self):
        entry = super().get()
        entry.sample.reward = np.roll(np.asarray(entry.sample.reward), -1, axis=1)   # [T, B, 1]: along B
        return entry


def _each_array(sample, fn):
    from rlsrl.base.namedarray import recursive_apply
    return recursive_apply(sample, fn)


class BatchMajor(ConduitQueueBuffer):
    """Hands the trainer [B, T] batches (the chunks stacked along axis 0)."""

    def get(self):
        entry = super().get()
        entry.sample = _each_array(entry.sample, lambda a: np.swapaxes(a, 0, 1))
        return entry


class StepsReversed(ConduitQueueBuffer):
    """Each chunk's steps in reverse order down axis 0 (a time axis flipped on the way)."""

    def get(self):
        entry = super().get()
        entry.sample = _each_array(entry.sample, lambda a: np.ascontiguousarray(a[::-1]))
        return entry


class RewardsOfTheNextChunk(ConduitQueueBuffer):
    """Each column carries the next column's rewards (the ids stay right)."""

    def get(self):
        entry = super().get()
        entry.sample.reward = np.roll(np.asarray(entry.sample.reward), -1, axis=1)
        return entry


class VersionLost(ConduitQueueBuffer):
    """policy_version_steps reset to 0 on the way (what PPO's staleness statistics read)."""

    def get(self):
        entry = super().get()
        entry.sample.policy_version_steps = np.zeros_like(np.asarray(entry.sample.policy_version_steps))
        return entry


class ServedTwice(ConduitQueueBuffer):
    """Each batch served twice (reuses=2 where SRL's PPO passes reuses=1)."""

    def __init__(self, kind="priority_queue", **kw):
        super().__init__(kind, **{**kw, "reuses": 2})


class FifoForPriorityQueue(ConduitQueueBuffer):
    """SRL's priority_queue mapped to a FIFO queue (the oldest batch first)."""

    def __init__(self, kind="priority_queue", **kw):
        kw.pop("reuses", None)
        super().__init__("simple_queue", **kw)


QUEUE_MUTATIONS = {
    "batch_major": (BatchMajor, "deliver/time_major_batches"),
    "steps_reversed": (StepsReversed, "deliver/time_major_batches"),
    "rewards_of_the_next_chunk": (RewardsOfTheNextChunk, "deliver/time_major_batches"),
    "version_lost": (VersionLost, "deliver/time_major_batches"),
    "served_twice": (ServedTwice, "deliver/time_major_batches"),
    "fifo_for_priority_queue": (FifoForPriorityQueue, "equivalence/time_major_matches_native"),
}

MUTATIONS = {
    "drop_every_10th_put": (DropEvery10th, "ingest/exactly_once"),
    "priorities_on_wrong_rows": (PrioritiesOnWrongRows, "deliver/prioritized_distribution"),
    "keeps_oldest_when_full": (KeepsOldestWhenFull, "equivalence/eviction_matches_native"),
    "rng_not_restored": (RngNotRestored, "state/round_trip"),
    "rewards_of_the_next_row": (RewardsOfTheNextRow, "deliver/rows_intact"),
}


class MutantHarness(SRLHarness):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def session(self, *, seed, capacity=10_000, prioritized=False, alpha=None, onpolicy=False,
                mode="sequential", staleness=0):
        kind = "prioritized_replay_buffer" if prioritized else "simple_replay_buffer"
        return ReplaySession(self.cls(kind, **self._args(kind, capacity, seed, alpha)), stored_ids=conduit_stored_ids)


class QueueMutantHarness(SRLHarness):
    """The real harness with the mutant queue in the adapter's sessions (SRL's own stays the oracle)."""

    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def session(self, *, seed, capacity=10_000, prioritized=False, alpha=None, onpolicy=False,
                mode="sequential", staleness=0):
        if onpolicy:
            return QueueSession(self.cls("priority_queue", max_size=capacity, reuses=1, batch_size=1), per_step=True)
        return super().session(seed=seed, capacity=capacity, prioritized=prioritized, alpha=alpha)

    def time_major_sessions(self, *, seed, batch_size, max_batches):
        _, native = super().time_major_sessions(seed=seed, batch_size=batch_size, max_batches=max_batches)
        mutant = self.cls("priority_queue", max_size=max_batches, reuses=1, batch_size=batch_size)
        return QueueSession(mutant, per_step=False), native


def test_unmutated_adapter_passes_every_applicable_check():
    report = check_adapter(SRLHarness())   # its KNOWN_DEPARTURES are expected failures
    assert report.ok and {r.status for r in report.results} <= {"pass", "skip", "xfail"}, report.table()


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_suite_catches_the_mutation(mutation):
    cls, catcher = MUTATIONS[mutation]
    report = check_adapter(MutantHarness(cls))
    failed = {r.id for r in report.results if r.status == "fail"}
    assert catcher in failed, f"{mutation} was not caught by {catcher}:\n{report.table()}"


@pytest.mark.parametrize("mutation", sorted(QUEUE_MUTATIONS))
def test_the_suite_catches_the_queue_mutation(mutation):
    cls, catcher = QUEUE_MUTATIONS[mutation]
    report = check_adapter(QueueMutantHarness(cls), select=["time_major", "onpolicy/"])
    failed = {r.id for r in report.results if r.status == "fail"}
    assert catcher in failed, f"{mutation} was not caught by {catcher}:\n{report.table()}"


def test_the_unmutated_queue_passes_through_the_mutants_harness():
    """The mutants' harness itself is sound: with the adapter's own queue it passes."""
    report = check_adapter(QueueMutantHarness(ConduitQueueBuffer), select=["time_major", "onpolicy/"])
    assert report.ok and {r.status for r in report.results} <= {"pass", "skip"}, report.table()
