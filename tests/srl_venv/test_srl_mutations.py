"""Mutations of the SRL adapter that the conformance suite must catch, each by a named check
(the SRL rows of the mutation table in docs/benchmarks.md). Each mutant is the real adapter
with one promise broken where a real bug would sit."""

import numpy as np
import pytest

from conduit_conformance import check_adapter
from conduit_srl.buffers import ConduitReplayBuffer
from conduit_srl.conformance import ReplaySession, SRLHarness, conduit_stored_ids


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


def test_unmutated_adapter_passes_every_applicable_check():
    report = check_adapter(SRLHarness())   # its KNOWN_DEPARTURES are expected failures
    assert report.ok and {r.status for r in report.results} <= {"pass", "skip", "xfail"}, report.table()


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_suite_catches_the_mutation(mutation):
    cls, catcher = MUTATIONS[mutation]
    report = check_adapter(MutantHarness(cls))
    failed = {r.id for r in report.results if r.status == "fail"}
    assert catcher in failed, f"{mutation} was not caught by {catcher}:\n{report.table()}"
