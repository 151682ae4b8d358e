"""Semantic checks: exactly once, order, rejection of bad input, sampling distributions,
on-policy isolation, staleness, state, and equivalence with the native path."""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

from .harness import Harness, Session, SyntheticRollout
from .registry import CheckSkipped, NotApplicable, check, ensure
from .stats import two_sample_chi2

P_MIN = 1e-4  # chi-square tests: seeded, so deterministic; this only guards against a wrong distribution
P_BATCH = 1e-7  # the per-batch statistics: their faults give p < 1e-60, so one seed in 10^7, not 10^4, fails by chance


@dataclass
class Ctx:
    harness: Harness
    seed: int

    def session(self, **kw) -> Session:
        return self.harness.session(seed=self.seed, **session_args(self.harness, kw))

    def rollouts(self, *, n_rollouts: int = 12, sources: int = 3, version: int = 0, start: int = 0,
                 max_len: int = 9) -> list[SyntheticRollout]:
        rng = np.random.default_rng(self.seed)
        out, nxt = [], start
        for i in range(n_rollouts):
            n = int(rng.integers(1, max_len + 1))
            out.append(SyntheticRollout(np.arange(nxt, nxt + n), source=i % sources, policy_version=version,
                                        terminated=bool(rng.random() < 0.3)))
            nxt += n
        return out

    def default_session(self, **kw) -> Session:
        caps = self.harness.capabilities
        if "replay" in caps:
            return self.session(**kw)
        if "onpolicy" in caps:
            return self.session(onpolicy=True, **kw)
        raise CheckSkipped("the adapter declares neither 'replay' nor 'onpolicy'")


def session_args(harness: Harness, kw: dict) -> dict:
    """``kw`` as ``harness.session`` takes it. A harness written before ``schedule=`` was renamed
    ``mode=`` (0.1.x) still gets its argument under the old name, with a DeprecationWarning, until 0.3."""
    if "mode" not in kw:
        return kw
    params = inspect.signature(harness.session).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "mode" in params or takes_any or "schedule" not in params:
        return kw
    warnings.warn(f"{type(harness).__name__}.session(schedule=...) is deprecated: the suite passes mode=... "
                  "('sequential' or 'overlapped'); rename the parameter (the old name is accepted until "
                  "conduit-edp 0.3, see CHANGELOG.md)", DeprecationWarning, stacklevel=3)
    kw = dict(kw)
    kw["schedule"] = kw.pop("mode")
    return kw


def _ids(rollouts) -> np.ndarray:
    return np.concatenate([r.ids for r in rollouts])


def _closing(session):
    class _C:
        def __enter__(self):
            return session

        def __exit__(self, *exc):
            session.close()
    return _C()


@check("ingest/exactly_once")
def exactly_once(ctx: Ctx) -> None:
    """Every ingested transition is stored exactly once: nothing lost, nothing doubled. Rollouts of
    1 to 64 steps: a fault at some position of a push (every 10th row dropped) shows."""
    rolls = ctx.rollouts(max_len=64)
    with _closing(ctx.default_session()) as s:
        for r in rolls:
            s.ingest(r)
        s.flush()
        got = np.sort(np.asarray(s.stored_ids()).astype(np.int64))
    want = np.sort(_ids(rolls))
    missing = np.setdiff1d(want, got)
    uniq, counts = np.unique(got, return_counts=True)
    ensure(missing.size == 0, f"{missing.size} ingested transitions were not stored (ids {missing[:8].tolist()})")
    ensure((counts == 1).all(), f"transitions stored more than once: ids {uniq[counts > 1][:8].tolist()}")
    ensure(got.size == want.size, f"stored {got.size} transitions, ingested {want.size}")


@check("ingest/source_order")
def source_order(ctx: Ctx) -> None:
    """Each source's transitions are stored in the order that source produced them."""
    rolls = ctx.rollouts()
    src_of = {int(i): r.source for r in rolls for i in r.ids}
    with _closing(ctx.default_session()) as s:
        for r in rolls:
            s.ingest(r)
        s.flush()
        stored = [int(i) for i in s.stored_ids()]
    present = set(stored)  # order only: losses and duplicates are ingest/exactly_once's business
    for src in sorted(set(src_of.values())):
        want = [int(i) for r in rolls if r.source == src for i in r.ids if int(i) in present]
        got = list(dict.fromkeys(i for i in stored if src_of.get(i) == src))
        ensure(got == want, f"source {src}: stored order {got[:10]}... differs from produced order {want[:10]}...")


@check("ingest/rejects_bad_input")
def rejects_bad_input(ctx: Ctx) -> None:
    """A malformed rollout raises an error naming the field, the expectation and the fix, and
    leaves what was stored intact."""
    good = ctx.rollouts(n_rollouts=3)
    with _closing(ctx.default_session()) as s:
        for r in good:
            s.ingest(r)
        s.flush()
        before = np.asarray(s.stored_ids()).copy()
        bad = SyntheticRollout(np.arange(10_000, 10_004)).columns()
        bad["obs"] = bad["obs"][:, :2]  # wrong shape
        try:
            s.ingest_raw(bad)
            s.flush()
        except NotImplementedError:
            raise NotApplicable("the adapter's session cannot push raw columns (ingest_raw)") from None
        except Exception as exc:  # noqa: BLE001 - the framework's own error type is fine if it is clear
            from conduit_core import SpecError
            msg = str(exc)
            clear = "expected" in msg.lower() and "fix" in msg.lower()
            # Conduit's SpecError names the field (an adapter may have renamed obs) by contract, not
            # another of the rollout's columns, with an expectation the value does not meet;
            # another error type must name 'obs' itself
            if isinstance(exc, SpecError):
                others = {"next_obs", "action", "reward", "terminated", "truncated"}
                field, expected, actual = (getattr(exc, a, None) for a in ("field", "expected", "actual"))
                ensure(str(field) not in others and repr(expected) != repr(actual),
                       f"the error for obs of the wrong shape names field {field!r}, expected "
                       f"{expected!r}, actual {actual!r}: it must name the field that is wrong (obs, or "
                       "the adapter's name for it) and an expectation its value does not meet")
            ensure(clear and (isinstance(exc, SpecError) or "obs" in msg),
                   f"the error for obs of the wrong shape must be a conduit_core.SpecError, or name the field "
                   f"('obs'), and say what was expected and how to fix it; got {type(exc).__name__}: {msg!r}")
        else:
            raise AssertionError("a rollout with obs of the wrong shape was accepted without an error")
        after = np.asarray(s.stored_ids())
        ensure(np.array_equal(before, after), "data stored before the bad rollout changed after it was rejected")
        s.ingest(SyntheticRollout(np.arange(20_000, 20_003)))
        s.flush()
        ensure(len(s.stored_ids()) == len(before) + 3, "ingestion did not keep working after a rejected rollout")


def _give_priorities(s: Session, n: int, prio, *, batch: int = 32, tries: int = 200) -> None:
    """Deliver until every one of the ``n`` stored items got ``prio(id)`` through the path's own update."""
    seen: set = set()
    for _ in range(tries):
        d = s.deliver(batch)
        s.update_priorities(d, prio(d.ids))
        seen |= set(np.asarray(d.ids).astype(int).tolist())
        if len(seen) == n:
            return
    ensure(False, f"only {len(seen)} of {n} items were ever delivered")


@check("deliver/uniform_distribution", needs=("replay",))
def uniform_distribution(ctx: Ctx) -> None:
    """Uniform replay delivers every stored transition equally often (chi-square)."""
    with _closing(ctx.session()) as s:
        s.ingest(SyntheticRollout(np.arange(40)))
        s.flush()
        counts = np.zeros(40)
        for _ in range(150):
            d = s.deliver(64)
            counts += np.bincount(np.asarray(d.ids).astype(np.int64), minlength=40)[:40]
    p = stats.chisquare(counts).pvalue
    ensure(p > P_MIN, f"delivered frequencies are not uniform (chi-square p={p:.2e}); counts {counts.astype(int)}")


@check("deliver/prioritized_distribution", needs=("prioritized",))
def prioritized_distribution(ctx: Ctx) -> None:
    """Prioritized replay delivers in proportion to priority^alpha (chi-square)."""
    alpha = 0.6
    prio = lambda ids: 1.0 + (np.asarray(ids).astype(np.int64) % 5)
    with _closing(ctx.session(prioritized=True, alpha=alpha)) as s:
        s.ingest(SyntheticRollout(np.arange(30)))
        s.flush()
        _give_priorities(s, 30, prio)
        counts = np.zeros(30)
        for _ in range(200):
            d = s.deliver(64)
            counts += np.bincount(np.asarray(d.ids).astype(np.int64), minlength=30)[:30]
            s.update_priorities(d, prio(d.ids))
    p = prio(np.arange(30)) ** alpha
    expected = p / p.sum() * counts.sum()
    pv = stats.chisquare(counts, expected).pvalue
    ensure(pv > P_MIN, f"delivered frequencies do not follow priority^alpha (chi-square p={pv:.2e})")


@check("onpolicy/version_isolation", needs=("onpolicy",))
def version_isolation(ctx: Ctx) -> None:
    """On-policy data reaches only the policy version that produced it."""
    old = ctx.rollouts(n_rollouts=4, version=0)
    new = ctx.rollouts(n_rollouts=4, version=1, start=1000)
    with _closing(ctx.session(onpolicy=True)) as s:
        for r in old + new:
            s.ingest(r)
        s.flush()
        d = s.deliver(None, policy_version=1)
    delivered = np.asarray(d.ids).astype(int).tolist()
    got = set(delivered)
    leaked = got & set(_ids(old).tolist())
    ensure(not leaked, f"data of policy version 0 was delivered to version 1 (ids {sorted(leaked)[:8]})")
    want = sorted(_ids(new).tolist())   # and all of version 1's data, once (an empty delivery leaks nothing)
    missing = sorted(set(want) - got)
    ensure(sorted(delivered) == want, f"version 1 got {len(delivered)} rows, its data is {len(want)} rows"
                                      + (f" (missing ids {missing[:8]})" if missing else " (some twice)"))
    if d.versions is not None:
        ensure(set(np.asarray(d.versions).tolist()) <= {1}, "delivered rows carry another policy version")


@check("onpolicy/consume_once", needs=("onpolicy",))
def consume_once(ctx: Ctx) -> None:
    """On-policy data is consumed exactly once, in order."""
    rolls = ctx.rollouts(n_rollouts=6)
    with _closing(ctx.session(onpolicy=True)) as s:
        for r in rolls[:3]:
            s.ingest(r)
        s.flush()
        first = np.asarray(s.deliver(None, policy_version=0).ids).astype(int).tolist()
        for r in rolls[3:]:
            s.ingest(r)
        s.flush()
        second = np.asarray(s.deliver(None, policy_version=0).ids).astype(int).tolist()
        third = np.asarray(s.deliver(None, policy_version=0).ids).astype(int).tolist()
    allids = first + second + third
    ensure(len(allids) == len(set(allids)), "an on-policy transition was delivered twice")
    ensure(sorted(allids) == sorted(_ids(rolls).tolist()), "not every on-policy transition was delivered")
    ensure(third == [], f"a third delivery returned {len(third)} already-consumed rows")


@check("offpolicy/staleness_bound", needs=("replay", "overlap"))
def staleness_bound(ctx: Ctx) -> None:
    """With overlap on, an off-policy batch misses at most `staleness` accepted inserts."""
    for staleness in (0, 7):
        with _closing(ctx.session(mode="overlapped", staleness=staleness)) as s:
            accepted = 0
            for r in ctx.rollouts(n_rollouts=30, max_len=4):
                s.ingest(r)
                accepted += len(r.ids)
                d = s.deliver(8)
                if d.inserted_at_selection is None:
                    raise CheckSkipped("the adapter's deliveries do not report inserted_at_selection")
                missed = accepted - d.inserted_at_selection
                ensure(0 <= missed <= staleness,
                       f"a batch missed {missed} accepted inserts with staleness={staleness}")
                ensure(int(np.max(d.ids)) < accepted, "a batch delivered an id that was never accepted")


@check("state/round_trip", needs=("state",))
def state_round_trip(ctx: Ctx) -> None:
    """A state round trip is exact: same stored data, and the same deliveries afterwards."""
    replay = "replay" in ctx.harness.capabilities
    kw = {} if replay else {"onpolicy": True}
    a = ctx.session(**kw)
    b = ctx.session(**kw)
    try:
        for r in ctx.rollouts():
            a.ingest(r)
        a.flush()
        if replay:
            a.deliver(16)
        b.load_state(a.state())
        ensure(np.array_equal(np.asarray(a.stored_ids()), np.asarray(b.stored_ids())),
               "stored transitions differ after the round trip")
        for _ in range(5):
            x = a.deliver(16) if replay else a.deliver(None, policy_version=0)
            y = b.deliver(16) if replay else b.deliver(None, policy_version=0)
            ensure(np.array_equal(np.asarray(x.ids), np.asarray(y.ids)),
                   "deliveries after the round trip differ (data, cursors or RNG were not restored)")
    finally:
        a.close()
        b.close()


def _batch_shape(ids) -> tuple[int, int]:
    """(distinct items, in-order neighbours: positions whose item is the previous one's id + 1) of
    one batch: how its items were drawn together, which per-item frequencies do not show."""
    ids = np.asarray(ids).astype(np.int64)
    return len(set(ids.tolist())), int(np.count_nonzero(np.diff(ids) == 1))


@check("equivalence/sequential_matches_native", needs=("native", "replay"))
def sequential_matches_native(ctx: Ctx) -> None:
    """Sequential mode stores what the native path stores and samples from the same distribution:
    the items (frequencies over batches) and the batches themselves (distinct items per batch:
    with vs without replacement, stratified draws; in-order neighbours per batch: runs of
    consecutive steps, a sorted gather), which pooled frequencies cannot tell apart."""
    rolls = ctx.rollouts(n_rollouts=10)
    nat = ctx.harness.native_session(seed=ctx.seed)
    if nat is None:
        raise CheckSkipped("the harness has no native path")
    with _closing(ctx.session()) as s, _closing(nat):
        for r in rolls:
            s.ingest(r)
            nat.ingest(r)
        s.flush()
        ensure(np.array_equal(np.sort(np.asarray(s.stored_ids())), np.sort(np.asarray(nat.stored_ids()))),
               "the adapter stores a different set of transitions than the native path")
        n = len(_ids(rolls))
        ca, cb = np.zeros(n), np.zeros(n)
        for _ in range(120):
            ca += np.bincount(np.asarray(s.deliver(64).ids).astype(np.int64), minlength=n)[:n]
            cb += np.bincount(np.asarray(nat.deliver(64).ids).astype(np.int64), minlength=n)[:n]
        # batches smaller than the stored items, so that with and without replacement differ
        shapes = {name: [_batch_shape(sess.deliver(16).ids) for _ in range(300)] for name, sess in
                  (("adapter", s), ("native", nat))}
    table = np.vstack([ca, cb])
    table = table[:, table.sum(axis=0) > 0]
    p = stats.chi2_contingency(table).pvalue
    ensure(p > P_MIN, f"delivered frequencies differ from the native path's (chi-square p={p:.2e})")
    for k, what in ((0, "distinct items"), (1, "in-order neighbours (an item right after its predecessor step)")):
        a, b = [x[k] for x in shapes["adapter"]], [x[k] for x in shapes["native"]]
        p = two_sample_chi2(a, b)
        ensure(p > P_BATCH, f"batches of 16 hold another number of {what} than on the native path (chi-square "
                          f"p={p:.2e}; mean {np.mean(a):.2f} vs {np.mean(b):.2f}): the items of a batch are drawn "
                          "together otherwise (with/without replacement, stratified, runs, or reordered)")


@check("equivalence/overlap_same_multiset", needs=("overlap",))
def overlap_same_multiset(ctx: Ctx) -> None:
    """With overlap on, the same multiset of transitions is ingested, per-source order kept."""
    rolls = ctx.rollouts(n_rollouts=20)
    kw = {} if "replay" in ctx.harness.capabilities else {"onpolicy": True}
    with _closing(ctx.session(**kw)) as seq, _closing(ctx.session(mode="overlapped", **kw)) as ovl:
        for r in rolls:
            seq.ingest(r)
            ovl.ingest(r)
        seq.flush()
        ovl.flush()
        a, b = np.asarray(seq.stored_ids()), np.asarray(ovl.stored_ids())
    ensure(np.array_equal(np.sort(a), np.sort(b)), "overlapped ingestion stored a different multiset")
    src_of = {int(i): r.source for r in rolls for i in r.ids}
    for src in set(src_of.values()):
        ensure([i for i in a.tolist() if src_of[int(i)] == src] == [i for i in b.tolist() if src_of[int(i)] == src],
               f"overlapped ingestion changed source {src}'s order")


@check("equivalence/eviction_matches_native", needs=("native", "replay"))
def eviction_matches_native(ctx: Ctx) -> None:
    """At a capacity the data overflows, the adapter keeps exactly what the native path keeps
    (after every ingest): the framework's eviction rule, not the ring's, decides what leaves."""
    rolls = ctx.rollouts(n_rollouts=40, max_len=9)
    for capacity in (12, 40):
        nat = ctx.harness.native_session(seed=ctx.seed, capacity=capacity)
        if nat is None:
            raise CheckSkipped("the harness has no native path")
        with _closing(ctx.session(capacity=capacity)) as s, _closing(nat):
            for i, r in enumerate(rolls):
                s.ingest(r)
                nat.ingest(r)
                s.flush()
                a = np.sort(np.asarray(s.stored_ids()).astype(np.int64))
                b = np.sort(np.asarray(nat.stored_ids()).astype(np.int64))
                ensure(np.array_equal(a, b),
                       f"capacity {capacity}, after rollout {i}: " + held_difference(a, b))


def held_difference(adapter: np.ndarray, native: np.ndarray) -> str:
    """What differs between two sorted multisets of held ids, duplicates included (a set difference
    would hide a row held twice), and what the difference looks like, without guessing its cause."""
    ids, ca = np.unique(adapter, return_counts=True)
    ids_n, cn = np.unique(native, return_counts=True)
    counts_a, counts_n = dict(zip(ids.tolist(), ca.tolist())), dict(zip(ids_n.tolist(), cn.tolist()))
    extra = [(i, counts_a[i] - counts_n.get(i, 0)) for i in sorted(counts_a) if counts_a[i] > counts_n.get(i, 0)]
    missing = [(i, counts_n[i] - counts_a.get(i, 0)) for i in sorted(counts_n) if counts_n[i] > counts_a.get(i, 0)]
    fmt = lambda pairs: ", ".join(f"{i}" + (f" (x{k})" if k > 1 else "") for i, k in pairs[:8]) + (
        f", ... ({len(pairs)} ids)" if len(pairs) > 8 else "")
    dup = sorted(i for i, k in counts_a.items() if k > 1)
    parts = [f"the adapter holds {adapter.size} transitions, the native path {native.size}",
             f"held by the adapter and not (as often) by the native path: {fmt(extra) or 'none'}",
             f"held by the native path and not (as often) by the adapter: {fmt(missing) or 'none'}"]
    if dup:
        parts.append(f"ids the adapter holds more than once: {dup[:8]}")
    if missing and not extra:
        parts.append("the adapter holds fewer rows: it evicted more, or earlier, than the framework")
    elif extra and not missing:
        parts.append("the adapter holds more rows: it evicted less, or later, than the framework, or stored some twice")
    return "; ".join(parts)


@check("equivalence/prioritized_matches_native", needs=("native", "prioritized"))
def prioritized_matches_native(ctx: Ctx) -> None:
    """On the same items with the same priorities (each given through its own path's update),
    prioritized batches are drawn as the native path draws them: the items (frequencies), the
    batches (how many distinct items each holds: stratified and independent draws, with or without
    replacement, give the same frequencies but not the same batches) and each item's weight."""
    alpha, n, batch = 0.6, 60, 32
    prio = lambda ids: 0.2 + (np.asarray(ids).astype(np.int64) % 7) * 0.5
    nat = ctx.harness.native_session(seed=ctx.seed, prioritized=True, alpha=alpha)
    if nat is None:
        raise NotApplicable("the framework has no native prioritized path")
    drawn = {}
    # weights at a beta other than 0 (all 1 there): through deliver_rows where the harness has it
    rows = "nstep" in ctx.harness.capabilities
    draw = (lambda sess: sess.deliver_rows(batch, n_step=1, gamma=0.99, beta=0.4)) if rows else \
        (lambda sess: sess.deliver(batch))
    with _closing(ctx.session(prioritized=True, alpha=alpha)) as s, _closing(nat):
        for name, sess in (("Conduit", s), ("native", nat)):
            sess.ingest(SyntheticRollout(np.arange(n)))
            sess.flush()
            _give_priorities(sess, n, prio, batch=batch, tries=300)
            ids, distinct, weight = [], [], {}
            for _ in range(300):
                d = draw(sess)
                got = np.asarray(d.ids).astype(int).tolist()
                ids += got
                distinct.append(len(set(got)))
                if d.weights is not None:
                    weight.update(zip(got, np.asarray(d.weights, dtype=np.float64).tolist()))
                sess.update_priorities(d, prio(got))
            drawn[name] = (ids, distinct, weight)
    p = two_sample_chi2(drawn["Conduit"][0], drawn["native"][0])
    ensure(p > P_MIN, f"items are drawn with other frequencies than on the native path (chi-square p={p:.2e})")
    p = two_sample_chi2(drawn["Conduit"][1], drawn["native"][1])
    ensure(p > P_MIN, f"batches hold another number of distinct items than on the native path (chi-square "
                      f"p={p:.2e}; mean {np.mean(drawn['Conduit'][1]):.2f} vs {np.mean(drawn['native'][1]):.2f}): "
                      "e.g. independent draws where the framework stratifies, or the reverse")
    want, got = drawn["native"][2], drawn["Conduit"][2]
    both = sorted(set(want) & set(got))
    ensure(not want or len(both) >= n // 2, f"weights of only {len(both)} items came from both paths")
    off = [i for i in both if abs(got[i] - want[i]) > 1e-4 * max(1.0, abs(want[i]))]
    ensure(not off, f"{len(off)} of {len(both)} items get other importance weights than on the native path, e.g. "
                    f"item {off[0] if off else 0}: {got[off[0]] if off else 0:.5g} vs {want[off[0]] if off else 0:.5g}")
