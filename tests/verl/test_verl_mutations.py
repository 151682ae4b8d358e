"""Mutations of the verl adapter that the conformance suite must catch, each by a named check (the
adapter's mutation table in docs/guides/verl.md). A mutant is the real adapter with one promise broken
where a real bug would sit: the update batch's hand-off (``UpdateBatchDelivery``: what GRPO's update
receives per policy version) or the fully-async trainer's queue (``ConduitMessageQueue``: what verl's
trainer takes, in which order, within which staleness)."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("verl", reason="needs verl[verl-core]")

from conduit_conformance import check_adapter  # noqa: E402
from conduit_verl import conformance as verl_conformance  # noqa: E402
from conduit_verl.async_queue import ConduitMessageQueue  # noqa: E402
from conduit_verl.delivery import UpdateBatchDelivery  # noqa: E402


class VersionNotTagged(UpdateBatchDelivery):
    """Every part stored under version 0 (the trainer's version never reaches the hand-off)."""

    def ingest(self, batch, *, version, source=0):
        super().ingest(batch, version=0, source=source)

    def deliver(self, version, timeout=60.0):
        return super().deliver(0, timeout)


class ScoresOfTheNextRow(UpdateBatchDelivery):
    """A batch's token-level scores shifted by one row on the way in (the ids stay right)."""

    def ingest(self, batch, *, version, source=0):
        batch.batch["token_level_scores"] = batch.batch["token_level_scores"].roll(-1, dims=0)
        super().ingest(batch, version=version, source=source)


class DropsTheLastRow(UpdateBatchDelivery):
    def ingest(self, batch, *, version, source=0):
        super().ingest(batch[:-1] if len(batch) > 1 else batch, version=version, source=source)


class HandsTheLastBatchAgain(UpdateBatchDelivery):
    """A cached hand-off: a version asked for again gets its last batch again."""

    def deliver(self, version, timeout=60.0):
        shards, pad = super().deliver(version, timeout)
        cache = self.__dict__.setdefault("cache", {})
        if shards and len(shards[0]):
            cache[version] = (shards, pad)
            return shards, pad
        return cache.get(version, (shards, pad))


class ServesAsFinished(ConduitMessageQueue):
    """verl's own MessageQueue's order: each sample admitted as it finishes, not in feed order."""

    def put_sample(self, sample):
        if sample is None:
            return super().put_sample(sample)
        index, versions = self._tags(sample)
        with self._lock:
            self.queue.put(self.queue.try_admit(version=versions[0]), sample, versions=versions)
            self._next_index = max(self._next_index, index + 1)
        return True


class NoAdmission(ConduitMessageQueue):
    """Every sample may start at once (the rollouter's staleness gate not consulted)."""

    def admits(self, index):
        return True


# mutation: (mutant, the check that catches it, what that check reports). The two queue mutants are
# stopped by the queue's own version window (conduit_core.queues: a sample past its window is refused,
# SemanticError) before any check's statistic is reached: an adapter cannot serve them wrongly
MUTATIONS = {
    "version_not_tagged": (VersionNotTagged, "onpolicy/version_isolation",
                           "data of policy version 0 was delivered to version 1"),
    "scores_of_the_next_row": (ScoresOfTheNextRow, "onpolicy/rows_intact", "reward of the row with id"),
    "drops_the_last_row": (DropsTheLastRow, "onpolicy/consume_once", "not every on-policy transition was delivered"),
    "hands_the_last_batch_again": (HandsTheLastBatchAgain, "onpolicy/consume_once",
                                   "an on-policy transition was delivered twice"),
    "serves_as_finished": (ServesAsFinished, "async/oldest_first", "SemanticError: admit: sample"),
    "no_admission": (NoAdmission, "async/staleness_bound", "SemanticError: put_sample: sample"),
}


class MutantHarness(verl_conformance.VerlHarness):
    """The real harness with one part swapped for its mutant."""

    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def session(self, **kw):
        s = super().session(**kw)
        if issubclass(self.cls, UpdateBatchDelivery):
            s.delivery.close()
            s.delivery = self.cls(dp_size=1)
        return s

    def async_queue(self, *, per_version, staleness):
        q = super().async_queue(per_version=per_version, staleness=staleness)
        if issubclass(self.cls, ConduitMessageQueue):
            q.queue = self.cls(q.config, first_index=1)
        return q


def _report(harness):
    return check_adapter(harness, select=["onpolicy/", "async/"])


def test_the_unmutated_adapter_passes_the_checks_the_mutants_are_caught_by():
    report = _report(MutantHarness(UpdateBatchDelivery))
    assert report.ok and {r.status for r in report.results} == {"pass"}, report.table()
    assert {c for _, c, _ in MUTATIONS.values()} <= {r.id for r in report.results}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_suite_catches_the_mutation(mutation):
    cls, catcher, reported = MUTATIONS[mutation]
    failed = {r.id: r.detail for r in _report(MutantHarness(cls)).results if r.status == "fail"}
    assert catcher in failed, f"{mutation} was not caught by {catcher}: {failed}"
    assert reported in failed[catcher], (mutation, failed[catcher])
    # and it breaks only its own part (a mutant that broke everything would be caught by any check)
    family = catcher.split("/")[0]
    assert all(f.startswith(family) for f in failed), (mutation, sorted(failed))
