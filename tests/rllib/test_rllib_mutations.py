"""Mutations of the RLlib adapter that the conformance suite must catch, each by a named
check: the mutation table of docs/benchmarks.md. A mutant is the real adapter with one
promise broken at the place a real bug would sit (its ingestion transform, its delivery
call, its weights, its priority update)."""

import os

import numpy as np
import pytest

from conduit_conformance import check_adapter
from conduit_rllib.conformance import RLlibHarness, ReplaySession
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer, episode_columns
from conduit_rllib.sequences import SequenceRules


def _drop_terminated(ep):
    c = episode_columns(ep)
    c["terminated"] = np.zeros_like(c["terminated"])
    return c


def _truncation_as_terminal(ep):
    c = episode_columns(ep)
    c["terminated"] = c["terminated"] | c["truncated"]
    c["truncated"] = np.zeros_like(c["truncated"])
    return c


def _next_obs_late(ep):
    c = episode_columns(ep)
    c["next_obs"] = np.concatenate([c["next_obs"][1:], c["next_obs"][-1:]])
    return c


def _action_of_the_next_step(ep):
    c = episode_columns(ep)
    c["action"] = np.concatenate([c["action"][1:], c["action"][-1:]])
    return c


def _actions_as_float16(ep):
    """Continuous actions narrowed to half precision (to save memory)."""
    c = episode_columns(ep)
    if np.issubdtype(c["action"].dtype, np.floating):
        c["action"] = c["action"].astype(np.float16)
    return c


def _actions_taken_as_discrete(ep):
    """An adapter written for DQN: every action stored as an integer index."""
    c = episode_columns(ep)
    c["action"] = c["action"].astype(np.int64)
    return c


class _DropEvery10th:
    def __init__(self):
        self.seen = 0

    def __call__(self, ep):
        c = episode_columns(ep)
        n = c["reward"].shape[0]
        keep = (np.arange(self.seen, self.seen + n) % 10) != 9
        self.seen += n
        return {k: v[keep] for k, v in c.items()}


class ShortenedWindows(ConduitEpisodeReplayBuffer):
    def sample(self, num_items=None, *, n_step=None, gamma=0.99, beta=None, **kw):
        if kw.get("batch_length_T"):  # sequences are not what this mutation breaks
            return super().sample(num_items, n_step=n_step, gamma=gamma, beta=beta, **kw)
        B = num_items or kw.get("batch_size_B") or self.batch_size_B
        b = self.edp.deliver(int(B), n_step=n_step or 1, gamma=gamma, beta=self.beta if beta is None else beta,
                             episode_end="shorten")
        self.last_sampled = b
        from conduit_rllib.replay_buffer import DeliveredBatch
        return [DeliveredBatch(b)]


class UnnormalisedWeights(ConduitEpisodeReplayBuffer):
    def sample(self, *a, beta=0.0, **kw):
        out = super().sample(*a, beta=beta, **kw)
        if not hasattr(out[0], "batch"):  # sequences (episodes): no weights to break
            return out
        b = out[0].batch
        if b.weights is not None:
            idx = self.edp.buffer.selector.index
            b.weights = b.weights * float((len(self) * idx.min / idx.total) ** -beta)  # (N P_i)^-beta, no max
        return out


class BetaIgnored(ConduitEpisodeReplayBuffer):
    """Weights with the beta the buffer was built with, whatever beta the call passes."""

    def sample(self, *a, beta=0.0, **kw):
        return super().sample(*a, beta=self.beta, **kw)


class DefaultBetaNotRLlibs(ConduitEpisodeReplayBuffer):
    """A call that passes no beta gets 0.4 (RLlib's prioritized buffer: 0.0)."""

    def sample(self, *a, beta=0.4, **kw):
        return super().sample(*a, beta=beta, **kw)


class AlphaFixed(ConduitEpisodeReplayBuffer):
    """alpha 0.6 however the buffer is built (RLlib's default is 1.0)."""

    def __init__(self, *a, alpha=0.6, **kw):
        super().__init__(*a, alpha=0.6, **kw)


class StratifiedDraws(ConduitEpisodeReplayBuffer):
    """One draw per equal slice of the priority mass (SRL's way) where RLlib draws independently:
    the same frequencies per item, other batches. (1-step draws go the route without redraws, which
    takes a stratified selector: a 1-step window never runs past its episode.)"""

    def _selector(self):
        selector = super()._selector()
        selector.stratified = self.prioritized
        return selector

    def sample(self, num_items=None, *, n_step=None, gamma=0.99, beta=0.0, **kw):
        if kw.get("batch_length_T") or n_step not in (None, 1):
            return super().sample(num_items, n_step=n_step, gamma=gamma, beta=beta, **kw)
        b = self.edp.deliver(int(num_items or kw.get("batch_size_B") or self.batch_size_B), n_step=1, gamma=gamma,
                             beta=beta, episode_end="shorten")
        self.last_sampled = b
        from conduit_rllib.replay_buffer import DeliveredBatch
        return [DeliveredBatch(b)]


class PrioritiesOnWrongRows(ConduitEpisodeReplayBuffer):
    def update_priorities(self, priorities, module_id=None):
        super().update_priorities(np.roll(np.asarray(priorities), 1), module_id)


class RingEviction(ConduitEpisodeReplayBuffer):
    """Leaves eviction to the ring (oldest steps) instead of RLlib's whole oldest episodes."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._ring = self.capacity
        self.ledger.plan = lambda new, capacity: ([], set())
        self.ledger.plan_per_chunk = lambda new, capacity: [("add", i, src) for i, (src, _) in enumerate(new)]
        self.ledger.ring_conflicts = lambda cutoff: []


def _rules(**broken):
    """A buffer whose sequence rules have ``broken`` decisions in place of RLlib's."""
    rules = type("BrokenRules", (SequenceRules,), {k: staticmethod(v) for k, v in broken.items()})()
    return type("Mutant", (ConduitEpisodeReplayBuffer,), {"sequence_rules": rules})


SequencesRunOn = _rules(slice_length=lambda t, stored, T: T)       # past a stored end: the next rows
BurnInIgnored = _rules(keeps_start=lambda t, stored, min_T: True)
LookbackAcrossEpisodes = _rules(lookback_steps=lambda t, lookback, stored=0: lookback)  # before step 0: another's rows
SlicesCountedBySteps = _rules(slice_cost=lambda length: length)


def _with_columns(fn):
    return type("Mutant", (ConduitEpisodeReplayBuffer,), {"columns_of": staticmethod(fn)})


MUTATIONS = {
    # mutation: (how the adapter is built, the check that must catch it)
    "shortened_windows": (lambda: ShortenedWindows, "equivalence/nstep_matches_native"),
    "drop_terminated": (lambda: _with_columns(_drop_terminated), "deliver/nstep_rows_true"),
    "truncation_as_terminal": (lambda: _with_columns(_truncation_as_terminal), "deliver/nstep_rows_true"),
    "next_obs_one_step_late": (lambda: _with_columns(_next_obs_late), "deliver/nstep_rows_true"),
    "drop_every_10th_transition": (lambda: _with_columns(_DropEvery10th()), "ingest/exactly_once"),
    # n-step rows carry no action: only the rows the learner gets show it
    "action_of_the_next_step": (lambda: _with_columns(_action_of_the_next_step), "deliver/rows_intact"),
    "continuous_actions_as_float16": (lambda: _with_columns(_actions_as_float16), "deliver/continuous_actions_intact"),
    "continuous_actions_taken_as_discrete": (lambda: _with_columns(_actions_taken_as_discrete),
                                             "deliver/continuous_actions_intact"),
    "unnormalised_weights": (lambda: UnnormalisedWeights, "deliver/importance_weights"),
    "priorities_on_wrong_rows": (lambda: PrioritiesOnWrongRows, "deliver/prioritized_distribution"),
    "beta_of_the_call_ignored": (lambda: BetaIgnored, "equivalence/priority_exponents_match_native"),
    "default_beta_not_rllibs": (lambda: DefaultBetaNotRLlibs, "equivalence/priority_exponents_match_native"),
    "alpha_fixed": (lambda: AlphaFixed, "equivalence/priority_exponents_match_native"),
    "stratified_draws": (lambda: StratifiedDraws, "equivalence/prioritized_matches_native"),
    "eviction_per_step_not_per_episode": (lambda: RingEviction, "equivalence/eviction_matches_native"),
    "sequences_run_past_the_episode": (lambda: SequencesRunOn, "deliver/sequences_true"),
    "burn_in_rule_ignored": (lambda: BurnInIgnored, "deliver/sequences_true"),
    "lookback_across_episodes": (lambda: LookbackAcrossEpisodes, "deliver/sequences_true"),
    "slices_counted_by_steps": (lambda: SlicesCountedBySteps, "equivalence/sequences_match_native"),
}


CAUGHT_BY = {"stratified_draws": ("distinct items",), "beta_of_the_call_ignored": ("weights",),
             "default_beta_not_rllibs": ("weights",), "alpha_fixed": ("alpha",),
             "action_of_the_next_step": ("action of the row with id", "expected"),
             "continuous_actions_as_float16": ("action of the row with id", "float16"),
             "continuous_actions_taken_as_discrete": ("action of the row with id", "int64")}


class MutantHarness(RLlibHarness):
    def __init__(self, make_cls):
        super().__init__()
        self.make_cls = make_cls

    def session(self, *, seed, capacity=10_000, prioritized=False, alpha=None, onpolicy=False,
                mode="sequential", staleness=0):
        cls = self.make_cls()
        return ReplaySession(cls(capacity=capacity, prioritized=prioritized, **({} if alpha is None else {"alpha": alpha}),
                                 beta=0.4,
                                 conduit={"mode": mode, "staleness": staleness, "seed": seed,
                                          "reuse_outputs": 0}))


REPLAY_CHECKS = ["ingest/*", "deliver/*", "equivalence/nstep_matches_native", "equivalence/sequential_matches_native",
                 "equivalence/priority_exponents_match_native", "equivalence/prioritized_matches_native",
                 "equivalence/eviction_matches_native", "equivalence/sequences_match_native",
                 "equivalence/exact_with_shared_rng"]


# Each mutant runs the check that must catch it; CONDUIT_MUTATIONS_ALL_CHECKS=1 runs every replay check
# on each (~4.5 min: docs/benchmarks.md's mutation table lists the other checks that catch each one).
ALL_CHECKS = os.environ.get("CONDUIT_MUTATIONS_ALL_CHECKS", "") not in ("", "0")


def test_unmutated_adapter_passes_the_replay_checks():
    """The control: the same harness without a mutation passes every check a mutant must fail."""
    checks = REPLAY_CHECKS if ALL_CHECKS else sorted({catcher for _, catcher in MUTATIONS.values()})
    report = check_adapter(MutantHarness(lambda: ConduitEpisodeReplayBuffer), select=checks)
    assert report.ok and {r.status for r in report.results} == {"pass"}, report.table()


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_suite_catches_the_mutation(mutation):
    make_cls, catcher = MUTATIONS[mutation]
    report = check_adapter(MutantHarness(make_cls), select=REPLAY_CHECKS if ALL_CHECKS else [catcher])
    failed = {r.id for r in report.results if r.status == "fail"}
    assert catcher in failed, f"{mutation} was not caught by {catcher}:\n{report.table()}"
    # caught by what the check measures, not by a crash on the way
    assert all(w in report.by_id()[catcher].detail for w in CAUGHT_BY.get(mutation, ())), report.table()
    print(f"\n{mutation}: caught by {sorted(failed)}; {catcher}: {report.by_id()[catcher].detail}")
