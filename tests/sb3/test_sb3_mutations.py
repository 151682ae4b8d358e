"""Mutations of the SB3 adapter that the conformance suite must catch, each by a named check
(the adapter's mutation table in docs/guides/sb3.md). A mutant is the real
ConduitReplayBuffer with one promise broken where a real bug would sit: its ingestion
transform, its ring's size, its draw, its saved state."""

import numpy as np
import pytest

from conduit_conformance import check_adapter
from conduit_sb3 import ConduitReplayBuffer
from conduit_sb3.conformance import SB3Harness


class TimeLimitAsTerminal(ConduitReplayBuffer):
    def _timeouts(self, done, infos):
        terminated, truncated = super()._timeouts(done, infos)
        return terminated | truncated, np.zeros_like(truncated)


class _Columns(ConduitReplayBuffer):
    """Breaks one column on its way into the ring."""

    def _store(self, columns):
        super()._store(self.broken(dict(columns)))


class NextObsIsObs(_Columns):
    def broken(self, c):
        c["next_obs"] = c["obs"]
        return c


class RewardOfThePreviousStep(_Columns):
    """A staging array reused one add too late: each row carries the previous step's reward."""

    def broken(self, c):
        previous = getattr(self, "previous", np.zeros_like(c["reward"]))
        self.previous = c["reward"].copy()
        c["reward"] = previous
        return c


class RewardInHalfPrecision(_Columns):
    """Rewards stored in float16 to save memory: every row's reward rounded."""

    def broken(self, c):
        c["reward"] = c["reward"].astype(np.float16).astype(np.float32)
        return c


class ActionsInHalfPrecision(_Columns):
    """Continuous actions stored in float16 to save memory (SAC's, TD3's): every action rounded."""

    def broken(self, c):
        if np.issubdtype(c["action"].dtype, np.floating):
            c["action"] = c["action"].astype(np.float16).astype(c["action"].dtype)
        return c


class DropsEveryTenthAdd(ConduitReplayBuffer):
    def _store(self, columns):
        self.adds = getattr(self, "adds", 0) + 1
        if self.adds % 10 == 0:
            self._advance()   # SB3's bookkeeping moves on, the row is never stored
            return
        super()._store(columns)


class DrawsOneBatchAhead(ConduitReplayBuffer):
    """A prefetch that hands out the batch drawn at the previous call: every batch misses the
    steps added since (stale by one add in a loop that promises none)."""

    def _delivered(self, batch_size):
        ahead = getattr(self, "ahead", None) or super()._delivered(batch_size).clone()
        self.ahead = super()._delivered(batch_size).clone()
        self.last_sampled = ahead
        return ahead


class SampleWithoutFlush(ConduitReplayBuffer):
    """A read path that forgets the staged steps: sample() delivers what reached the ring only."""

    def _delivered(self, batch_size):
        self.last_sampled = self.edp.deliver(int(batch_size))
        return self.last_sampled


class RingOneStepShort(ConduitReplayBuffer):
    def _open(self, spec, *, sb3_stream, schedule):
        self.buffer_size -= 1           # evicts one step before SB3 does
        super()._open(spec, sb3_stream=sb3_stream, schedule=schedule)
        self.buffer_size += 1


class SlotTakenForPosition(ConduitReplayBuffer):
    """SB3's array index handed to Conduit as if it counted from the oldest row: right until the
    ring wraps, then every draw lands ``pos`` steps off."""

    def _draw_as_sb3(self, count, batch_size):
        upper = self.buffer_size if self.full else self.pos
        step = np.random.randint(0, upper, size=batch_size)
        env = np.random.randint(0, high=self.n_envs, size=(batch_size,))
        return step * self.n_envs + env


class StateWithoutRows(ConduitReplayBuffer):
    def __getstate__(self):
        state = super().__getstate__()
        fresh = type(self)(self.buffer_size, self.observation_space, self.action_space, device="cpu")
        state["edp_state"] = fresh.edp.state_dict()   # an empty ring saved in place of this one
        fresh.close()
        return state


MUTATIONS = {
    # mutation: (the buffer class under test, the check that must catch it)
    "time_limit_stored_as_terminal": (TimeLimitAsTerminal, "deliver/rows_intact"),
    "next_obs_is_obs": (NextObsIsObs, "deliver/rows_intact"),
    "reward_of_the_previous_step": (RewardOfThePreviousStep, "deliver/rows_intact"),
    "reward_in_half_precision": (RewardInHalfPrecision, "deliver/rows_intact"),
    "continuous_actions_in_half_precision": (ActionsInHalfPrecision, "deliver/continuous_actions_intact"),
    "drops_every_tenth_add": (DropsEveryTenthAdd, "ingest/exactly_once"),
    "draws_one_batch_ahead": (DrawsOneBatchAhead, "deliver/sees_newest"),
    "sample_without_flush": (SampleWithoutFlush, "deliver/sees_newest"),
    "ring_one_step_short": (RingOneStepShort, "equivalence/eviction_matches_native"),
    "slot_taken_for_position": (SlotTakenForPosition, "equivalence/exact_with_shared_rng"),
    "state_without_rows": (StateWithoutRows, "state/round_trip"),
}

CAUGHT_BY = {   # words of the check's own finding
    "time_limit_stored_as_terminal": ("terminated of the row",), "next_obs_is_obs": ("next_obs of the row",),
    "reward_of_the_previous_step": ("reward of the row",), "drops_every_tenth_add": ("were not stored",),
    "reward_in_half_precision": ("reward of the row",),
    "continuous_actions_in_half_precision": ("action of the row",),
    "draws_one_batch_ahead": ("no batch held a transition",),
    "sample_without_flush": ("no batch held a transition",), "ring_one_step_short": ("evicted more",),
    "slot_taken_for_position": ("from the same RNG stream",), "state_without_rows": ("differ after the round trip",),
}


class MutantHarness(SB3Harness):
    def __init__(self, buffer_class):
        super().__init__()
        self.buffer_class = buffer_class


def test_unmutated_adapter_passes_the_catching_checks():
    """The control: the same harness without a mutation passes every check a mutant must fail."""
    report = check_adapter(MutantHarness(ConduitReplayBuffer), select=sorted({c for _, c in MUTATIONS.values()}))
    assert report.ok and {r.status for r in report.results} == {"pass"}, report.table()


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_suite_catches_the_mutation(mutation):
    cls, catcher = MUTATIONS[mutation]
    report = check_adapter(MutantHarness(cls), select=[catcher])
    failed = {r.id for r in report.results if r.status == "fail"}
    assert catcher in failed, f"{mutation} was not caught by {catcher}:\n{report.table()}"
    # caught by what the check measures, not by a crash on the way
    assert any(w in report.by_id()[catcher].detail for w in CAUGHT_BY[mutation]), report.table()
    print(f"\n{mutation}: {catcher}: {report.by_id()[catcher].detail}")
