"""Sequences for stateful modules: slices of stored episodes with their lookback.

Why these exist: a stateful learner (an LSTM Q-network, R2D2-style burn-in) trains on
slices, and how a data plane cuts them changes learning as surely as n-step windows do:
a slice that runs into the next episode, a lookback step taken from another episode, a
burn-in rule not applied, or slices counted differently per batch. The checks read every
slice against the true episodes and compare the joint distribution of (length, steps left
after the slice, lookback held) and the slices per batch with the native path's.
"""

from __future__ import annotations

import numpy as np

from .checks_windows import episodes_for
from .harness import DeliveredSequence, Session, SyntheticRollout, reward_of
from .registry import CheckSkipped, check, ensure
from .stats import two_sample_chi2

P_MIN = 1e-3
# (length, lookback, min_length): what a stateful DQN passes (max_seq_len, 1, burn_in_len)
SETTINGS = ((5, 1, 0), (4, 2, 2))
BATCH = 32


class Truth:
    """Where every id's episode starts and ends, and how it ends."""

    def __init__(self, rollouts: list[SyntheticRollout]):
        self.start_of, self.end_of, self.terminated, self.truncated = {}, {}, {}, {}
        for r in rollouts:
            first, last = int(r.ids[0]), int(r.ids[-1])
            for i in r.ids:
                self.start_of[int(i)], self.end_of[int(i)] = first, last
            self.terminated[last], self.truncated[last] = r.terminated, r.truncated

    def category(self, seq: DeliveredSequence) -> tuple[int, int, int]:
        """(length, steps left in the episode after the slice, lookback held)."""
        last = int(seq.ids[-1])
        return (len(seq.ids) - seq.lookback, self.end_of[last] - last, seq.lookback)


def verify_sequence(seq: DeliveredSequence, truth: Truth, *, length: int, lookback: int, min_length: int) -> None:
    ids = np.asarray(seq.ids).astype(np.int64)
    lb = int(seq.lookback)
    where = f"sequence {ids.tolist()} (length={length}, lookback={lookback}, min_length={min_length})"
    ensure(0 <= lb < ids.size, f"{where}: {lb} lookback steps of {ids.size}")
    first = int(ids[lb])
    start, end = truth.start_of.get(first), truth.end_of.get(first)
    ensure(start is not None, f"{where}: id {first} was never ingested")
    ensure(bool(np.all(np.diff(ids) == 1)) and truth.end_of.get(int(ids[-1])) == end
           and truth.start_of.get(int(ids[0])) == start,
           f"{where}: not consecutive steps of one episode (ids {start}..{end})")
    ensure(lb == min(lookback, first - start), f"{where}: {lb} lookback steps, expected "
                                               f"{min(lookback, first - start)} (as many as the episode has before it)")
    body = ids.size - lb
    ensure(body == min(length, end - first + 1), f"{where}: {body} steps, expected {min(length, end - first + 1)} "
                                                 "(the full length, or to the episode's stored end)")
    ensure(end - first + 1 > min_length, f"{where}: starts {end - first + 1} steps before its episode's end, "
                                         f"not more than min_length={min_length} (the burn-in rule)")
    last = int(ids[-1])
    want_next = last + 1 if last < end else end + 0.5
    ensure(float(seq.next_id) == want_next, f"{where}: next observation {seq.next_id}, expected {want_next}")
    ensure(np.allclose(np.asarray(seq.rewards, dtype=np.float64), reward_of(ids).astype(np.float64), atol=1e-5),
           f"{where}: rewards are not those of its steps")
    at_end = last == end
    ensure(bool(seq.terminated) == (at_end and truth.terminated[end])
           and bool(seq.truncated) == (at_end and truth.truncated[end]),
           f"{where}: terminated={seq.terminated} truncated={seq.truncated}; the episode "
           f"{'terminates' if truth.terminated[end] else 'truncates' if truth.truncated[end] else 'runs on'}"
           f" at id {end}")


def _sequences(session: Session, **kw) -> list[DeliveredSequence]:
    try:
        return session.deliver_sequences(BATCH, **kw)
    except NotImplementedError:
        raise CheckSkipped("the session has no deliver_sequences (capability 'sequences' needs it)") from None


def _filled(ctx, rolls, native: bool) -> Session | None:
    s = ctx.harness.native_session(seed=ctx.seed) if native else ctx.session()
    if s is not None:
        for r in rolls:
            s.ingest(r)
        s.flush()
    return s


@check("deliver/sequences_true", needs=("replay", "sequences"))
def sequences_true(ctx) -> None:
    """Every slice is consecutive steps of one episode, with the right lookback, length,
    burn-in rule, next observation, rewards and done flags."""
    rolls = episodes_for(ctx.seed + 5)
    truth = Truth(rolls)
    s = _filled(ctx, rolls, native=False)
    try:
        for length, lookback, min_length in SETTINGS:
            for _ in range(40):
                batch = _sequences(s, length=length, lookback=lookback, min_length=min_length)
                # a batch is slices until their steps plus one each reach the batch size, no more
                cost = [len(q.ids) - q.lookback + 1 for q in batch]
                ensure(bool(batch) and sum(cost) >= BATCH and sum(cost[:-1]) < BATCH,
                       f"a batch of {len(batch)} slices costing {sum(cost)} (steps + 1 each) for batch size "
                       f"{BATCH}: expected slices until the cost reaches it, and no more")
                for seq in batch:
                    verify_sequence(seq, truth, length=length, lookback=lookback, min_length=min_length)
    finally:
        s.close()


@check("equivalence/sequences_match_native", needs=("replay", "sequences", "native"))
def sequences_match_native(ctx) -> None:
    """On the same stored episodes, slices are drawn as the native path draws them: the
    joint distribution of (length, steps left after, lookback held) and the number of
    slices per batch, per setting."""
    rolls = episodes_for(ctx.seed + 6)
    truth = Truth(rolls)
    nat = _filled(ctx, rolls, native=True)
    if nat is None:
        raise CheckSkipped("the harness has no native path")
    s = _filled(ctx, rolls, native=False)
    try:
        for length, lookback, min_length in SETTINGS:
            kw = dict(length=length, lookback=lookback, min_length=min_length)
            a = [_sequences(nat, **kw) for _ in range(250)]
            b = [_sequences(s, **kw) for _ in range(250)]
            p = two_sample_chi2([truth.category(q) for x in a for q in x], [truth.category(q) for x in b for q in x])
            ensure(p > P_MIN, f"{kw}: slices (length, steps left, lookback) are drawn differently from the native "
                              f"path (chi-square p={p:.2e})")
            p = two_sample_chi2([len(x) for x in a], [len(x) for x in b])
            ensure(p > P_MIN, f"{kw}: the number of slices per batch differs from the native path's "
                              f"(chi-square p={p:.2e})")
    finally:
        s.close()
        nat.close()


@check("equivalence/exact_with_shared_rng", needs=("replay", "shared_rng"))
def exact_with_shared_rng(ctx) -> None:
    """Where the adapter draws from the framework's own RNG stream (the documented hook,
    ``Harness.shared_rng_sessions``), it delivers the same rows in the same order as the
    framework's buffer: with room to spare and at a capacity that evicts."""
    rolls = episodes_for(ctx.seed + 7)
    for capacity in (10_000, 60):
        pair = ctx.harness.shared_rng_sessions(seed=ctx.seed, capacity=capacity)
        if pair is None:
            raise CheckSkipped("the harness returns no shared-RNG sessions")
        s, nat = pair
        try:
            for i, r in enumerate(rolls):
                s.ingest(r)
                nat.ingest(r)
                if i % 5 == 4:  # deliveries between inserts, as in training
                    s.flush()
                    a, b = nat.deliver(16).ids, s.deliver(16).ids
                    ensure(np.array_equal(np.asarray(a), np.asarray(b)),
                           f"capacity {capacity}, after {i + 1} rollouts: native delivered {np.asarray(a).tolist()}, "
                           f"the adapter {np.asarray(b).tolist()} from the same RNG stream")
        finally:
            s.close()
            nat.close()
