"""n-step windows: every delivered row is a true window of its episode, and the windows an
adapter draws have the distribution the framework's own path draws on the same data.

Why these exist: a data plane can deliver only stored transitions, in the right
proportions per start item, and still change learning, by drawing windows near episode
ends differently (shortening them where the framework redraws, or the reverse), by
labelling a time-limit end as terminal, or by taking ``next_obs`` one step late. The
checks below look at the whole row and at the joint distribution of (steps left after
the window, window length), not only at which ids come out.

The synthetic episodes end terminated, truncated, or not at all (still running), and
their rewards vary per step (``reward_of``), so a wrong window sums to a wrong return.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .harness import DeliveredRows, Session, SyntheticRollout, reward_of
from .registry import CheckSkipped, NotApplicable, check, ensure
from .stats import two_sample_chi2

P_MIN = 1e-3          # seeded draws; a right distribution fails this one time in a thousand
GAMMA = 0.9
BETA = 0.4
ALPHA = 0.6
N_STEPS = (1, 3, (2, 5), (1, 4))   # what DQN and SAC pass: fixed, and RLlib's drawn ranges


def priority_of(ids) -> np.ndarray:
    """The priority the checks give transition ``id`` (unequal, so prioritized draws differ)."""
    ids = np.asarray(ids).astype(np.int64)
    return 0.1 + (ids % 5) * 0.6 + (ids % 3) * 0.25


@dataclass
class Episodes:
    """The truth about the synthetic episodes: where each id sits and how its episode ends."""

    end_of: dict[int, int]
    terminated: dict[int, bool]
    truncated: dict[int, bool]

    @classmethod
    def of(cls, rollouts: list[SyntheticRollout]) -> "Episodes":
        end_of, term, trunc = {}, {}, {}
        for r in rollouts:
            last = int(r.ids[-1])
            for i in r.ids:
                end_of[int(i)] = last
            term[last], trunc[last] = r.terminated, r.truncated
        return cls(end_of, term, trunc)

    def window_length(self, rows: DeliveredRows) -> np.ndarray:
        """The length of each row's window read from its ids: next_obs is the id after the
        window's last step (``last + 0.5`` at its episode's end)."""
        return np.ceil(np.asarray(rows.next_ids, dtype=np.float64) - np.asarray(rows.ids)).astype(np.int64)

    def categories(self, rows: DeliveredRows) -> list[tuple[int, int]]:
        """(steps left in the episode after the window, window length) per row."""
        k = self.window_length(rows)
        left = np.array([self.end_of[int(i)] for i in rows.ids]) - np.asarray(rows.ids) - k + 1
        return list(zip(left.tolist(), k.tolist()))


def episodes_for(seed: int, *, n: int = 40, start: int = 0, action_dims: int = 0) -> list[SyntheticRollout]:
    """Episodes of 1-14 steps ending terminated (40%), truncated (30%) or still running;
    ``action_dims`` > 0: with continuous actions of that many components."""
    rng = np.random.default_rng(seed)
    out, nxt = [], start
    for i in range(n):
        k = int(rng.integers(1, 15))
        end = rng.random()
        out.append(SyntheticRollout(np.arange(nxt, nxt + k), source=i % 4, terminated=end < 0.4,
                                    truncated=0.4 <= end < 0.7, action_dims=action_dims))
        nxt += k
    return out


def verify_rows(rows: DeliveredRows, truth: Episodes, n_step, gamma: float) -> None:
    """Every row is the true window it claims to be."""
    lo, hi = (n_step, n_step + 1) if isinstance(n_step, int) else n_step
    k = truth.window_length(rows)
    for i in range(len(rows.ids)):
        first, ki = int(rows.ids[i]), int(k[i])
        end = truth.end_of.get(first)
        where = f"row with id {first} (n_step={n_step})"
        ensure(end is not None, f"{where}: this id was never ingested")
        last = first + ki - 1
        ensure(ki >= 1 and last <= end, f"{where}: next_obs {rows.next_ids[i]} is not the observation after a step "
                                        f"of its episode (ids {first}..{end})")
        want_next = last + 1 if last < end else end + 0.5
        ensure(float(rows.next_ids[i]) == want_next,
               f"{where}: next_obs is {rows.next_ids[i]}, expected {want_next} (the step after {last})")
        ensure(int(rows.n_step[i]) == ki, f"{where}: reports n_step={int(rows.n_step[i])} for a {ki}-step window "
                                          "(the learner bootstraps with gamma**n_step)")
        ensure(ki < hi, f"{where}: a {ki}-step window for n_step={n_step}")
        ensure(ki >= lo or last == end, f"{where}: a {ki}-step window was cut short inside its episode")
        want = float(np.sum(gamma ** np.arange(ki) * reward_of(np.arange(first, first + ki)).astype(np.float64)))
        ensure(abs(float(rows.reward[i]) - want) <= 1e-4 * max(1.0, abs(want)),
               f"{where}: reward {float(rows.reward[i]):.6g}, the discounted {ki}-step return is {want:.6g}")
        at_end = last == end
        ensure(bool(rows.terminated[i]) == (at_end and truth.terminated[end]),
               f"{where}: terminated={bool(rows.terminated[i])}, the episode "
               f"{'ends terminated' if truth.terminated[end] else 'is not terminated'} "
               f"{'at' if at_end else 'after'} this window")
        ensure(bool(rows.truncated[i]) == (at_end and truth.truncated[end]),
               f"{where}: truncated={bool(rows.truncated[i])}, the episode "
               f"{'ends truncated' if truth.truncated[end] else 'is not truncated'} "
               f"{'at' if at_end else 'after'} this window")


def _rows(session: Session, batch: int, *, n_step, gamma=GAMMA, beta=None) -> DeliveredRows:
    try:
        return session.deliver_rows(batch, n_step=n_step, gamma=gamma, beta=beta)
    except NotImplementedError:
        raise CheckSkipped("the session has no deliver_rows (capability 'nstep' needs it)") from None


def _concat(parts: list[DeliveredRows]) -> DeliveredRows:
    f = lambda name: np.concatenate([np.asarray(getattr(p, name)) for p in parts])
    return DeliveredRows(ids=f("ids"), next_ids=f("next_ids"), reward=f("reward"), n_step=f("n_step"),
                         terminated=f("terminated"), truncated=f("truncated"), weights=f("weights"))


def _draw(session: Session, draws: int, **kw) -> DeliveredRows:
    return _concat([_rows(session, 250, **kw) for _ in range(draws // 250)])


def _give_priorities(session: Session, n_items: int) -> None:
    """Set priority_of(id) on every stored item through the adapter's own update path
    (frameworks update the rows of the last delivered batch)."""
    seen: set[int] = set()
    for _ in range(400):
        d = _rows(session, 64, n_step=1)
        session.update_priorities(d, priority_of(d.ids))
        seen |= set(np.asarray(d.ids).astype(int).tolist())
        if len(seen) >= n_items:
            return
    ensure(False, f"only {len(seen)} of {n_items} stored items were ever delivered")


def _selectors(ctx) -> list[bool]:
    return [False] + ([True] if "prioritized" in ctx.harness.capabilities else [])


@check("deliver/nstep_rows_true", needs=("replay", "nstep"))
def nstep_rows_true(ctx) -> None:
    """Every n-step row is a true window of its episode: next obs, return, length, flags."""
    rolls = episodes_for(ctx.seed)
    truth = Episodes.of(rolls)
    for prioritized in _selectors(ctx):
        s = ctx.session(prioritized=prioritized, alpha=ALPHA)
        try:
            for r in rolls:
                s.ingest(r)
            s.flush()
            for n_step in N_STEPS:
                verify_rows(_draw(s, 1000, n_step=n_step), truth, n_step, GAMMA)
        finally:
            s.close()


@check("equivalence/nstep_matches_native", needs=("replay", "nstep", "native"))
def nstep_matches_native(ctx) -> None:
    """On the same stored episodes, n-step windows are drawn as the native path draws them:
    the joint distribution of (steps left after the window, window length) and of the start
    items, per sampling argument, uniform and prioritized with unequal priorities."""
    rolls = episodes_for(ctx.seed + 1)
    truth = Episodes.of(rolls)
    n_items = sum(len(r.ids) for r in rolls)
    for prioritized in _selectors(ctx):
        nat = ctx.harness.native_session(seed=ctx.seed, prioritized=prioritized, alpha=ALPHA)
        if nat is None:
            raise (NotApplicable if prioritized else CheckSkipped)(
                f"the framework has no native {'prioritized' if prioritized else 'uniform'} path")
        s = ctx.session(prioritized=prioritized, alpha=ALPHA)
        try:
            for r in rolls:
                s.ingest(r)
                nat.ingest(r)
            s.flush()
            if prioritized:
                _give_priorities(s, n_items)
                _give_priorities(nat, n_items)
            for n_step in ((2, 5), 3):
                a = _draw(nat, 6000, n_step=n_step)
                b = _draw(s, 6000, n_step=n_step)
                kind = "prioritized" if prioritized else "uniform"
                p = two_sample_chi2(truth.categories(a), truth.categories(b))
                ensure(p > P_MIN, f"{kind}, n_step={n_step}: windows (steps left, length) are drawn differently "
                                  f"from the native path (chi-square p={p:.2e}); e.g. windows cut by an episode's "
                                  "end shortened where the framework redraws them, or the reverse")
                pi = two_sample_chi2(np.asarray(a.ids).astype(int).tolist(), np.asarray(b.ids).astype(int).tolist())
                ensure(pi > P_MIN, f"{kind}, n_step={n_step}: start items are drawn differently from the native "
                                   f"path (chi-square p={pi:.2e})")
        finally:
            s.close()
            nat.close()


@check("deliver/importance_weights", needs=("prioritized", "nstep"))
def importance_weights(ctx) -> None:
    """Importance weights are (P(i) / min_j P(j))^-beta: normalised by the smallest priority."""
    rolls = episodes_for(ctx.seed + 2, n=20)
    n_items = sum(len(r.ids) for r in rolls)
    s = ctx.session(prioritized=True, alpha=ALPHA)
    try:
        for r in rolls:
            s.ingest(r)
        s.flush()
        _give_priorities(s, n_items)
        rows = _draw(s, 1000, n_step=1, beta=BETA)
    finally:
        s.close()
    pmin = priority_of(np.concatenate([r.ids for r in rolls])).min() ** ALPHA
    want = (priority_of(rows.ids) ** ALPHA / pmin) ** -BETA
    got = np.asarray(rows.weights, dtype=np.float64)
    bad = np.flatnonzero(np.abs(got - want) > 1e-4 * np.maximum(1.0, want))
    ensure(bad.size == 0, f"{bad.size} weights are not (P(i)/P_min)^-beta: id {int(rows.ids[bad[0]]) if bad.size else 0} "
                          f"has {got[bad[0]] if bad.size else 0:.5g}, expected {want[bad[0]] if bad.size else 0:.5g}")


@check("equivalence/priority_exponents_match_native", needs=("replay", "prioritized", "nstep", "native"))
def priority_exponents_match_native(ctx) -> None:
    """alpha and beta as the native path uses them, at values other than the suite's defaults and
    at the framework's own defaults: with buffers built at each alpha (the framework's default and
    others), the start items are drawn with the native path's distribution, and at each beta
    (including none passed: each side's default) every delivered row's weight is the one the
    native path gives the same item (an adapter that fixes alpha or ignores beta, or whose
    defaults differ from the framework's, fails here)."""
    rolls = episodes_for(ctx.seed + 3, n=24)
    n_items = sum(len(r.ids) for r in rolls)
    for alpha in (None, 0.3, 1.0):     # None: each side built with its own default alpha
        kw = {} if alpha is None else {"alpha": alpha}
        nat = ctx.harness.native_session(seed=ctx.seed, prioritized=True, **kw)
        if nat is None:
            raise NotApplicable("the framework has no native prioritized path")
        s = ctx.session(prioritized=True, **kw)
        try:
            for r in rolls:
                s.ingest(r)
                nat.ingest(r)
            s.flush()
            _give_priorities(s, n_items)
            _give_priorities(nat, n_items)
            a, b = _draw(nat, 4000, n_step=1), _draw(s, 4000, n_step=1)
            p = two_sample_chi2(np.asarray(a.ids).astype(int).tolist(), np.asarray(b.ids).astype(int).tolist())
            ensure(p > P_MIN, f"alpha={alpha if alpha is not None else 'default'}: start items are drawn differently "
                              f"from the native path (chi-square p={p:.2e}): alpha not applied as the framework does")
            for beta in (None, 0.0, 0.4, 1.0):
                a, b = _draw(nat, 500, n_step=1, beta=beta), _draw(s, 500, n_step=1, beta=beta)
                want = dict(zip(np.asarray(a.ids).astype(int).tolist(), np.asarray(a.weights, dtype=np.float64)))
                got = dict(zip(np.asarray(b.ids).astype(int).tolist(), np.asarray(b.weights, dtype=np.float64)))
                both = sorted(set(want) & set(got))
                ensure(len(both) >= 10, f"only {len(both)} items drawn by both paths at beta={beta}")
                off = [i for i in both if abs(got[i] - want[i]) > 1e-4 * max(1.0, abs(want[i]))]
                ensure(not off, f"alpha={alpha if alpha is not None else 'default'}, beta="
                                f"{beta if beta is not None else 'not passed'}: {len(off)} of {len(both)} items get "
                                f"other weights than on the native path, e.g. item {off[0] if off else 0}: "
                                f"{got[off[0]] if off else 0:.5g} vs {want[off[0]] if off else 0:.5g}")
        finally:
            s.close()
            nat.close()
