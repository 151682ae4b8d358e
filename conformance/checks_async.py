"""Asynchronous training: what an async trainer's queue must keep of the synchronous semantics.

An asynchronous trainer (verl's one-step-off and fully-async recipes, AReaL, slime) trains while its
rollout producer generates with weights a few versions old. What it may change is *when* a sample is
trained, within a declared staleness bound; what it must not change is *which* samples are trained.
A queue that drops the oldest sample when full loses data; one that discards samples over the bound
(and generates their prompts again) or serves the newest first trains more on what finishes fast,
which in LLM RL is short responses (tinker-cookbook PR 822; verl issue 6780: a fully-async run "on
policy" learned much faster than the synchronous trainer, a difference nobody's tooling caught).

The checks drive the adapter's queue (:class:`~conduit_conformance.harness.AsyncQueue`) with a
deterministic discrete-event run: ``PRODUCERS`` concurrent generators, each sample's generation time
its length (drawn from a heavy-tailed law, seeded), a trainer that takes ``PER_VERSION`` samples,
trains for ``TRAIN_TIME``, publishes the next version and asks for its next batch at once (a queue
that is not told the trainer's version, as verl's is not, may count it from these asks). A weight sync
during a generation makes it a partial rollout: it carries every version it saw. No clock, no threads:
the same seed gives the same run, so every check is exact (no false alarm by chance).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .registry import check, ensure

PER_VERSION, PRODUCERS, STEPS, TRAIN_TIME, MEAN_LENGTH, MAX_LENGTH = 8, 16, 24, 40, 12, 160


@dataclass
class AsyncRun:
    """What happened in one run: ids in admission order, each batch with the trainer's version when it
    was taken, what was put, what is pending at the end, and each sample's length and versions."""

    admitted: list[int] = field(default_factory=list)
    batches: list[tuple[int, list[int]]] = field(default_factory=list)
    put: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    length: dict[int, int] = field(default_factory=dict)
    versions: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def delivered(self) -> list[int]:
        return [i for _, ids in self.batches for i in ids]

    def staleness(self) -> Counter:
        return Counter(v - self.versions[i][0] for v, ids in self.batches for i in ids)


def run_async(queue, *, seed: int, staleness: int, steps: int = STEPS, per_version: int = PER_VERSION,
              producers: int = PRODUCERS) -> AsyncRun:
    """Drive ``queue`` until the trainer has taken ``steps`` batches (or nothing can move: a hang)."""
    rng = np.random.default_rng([seed, staleness, 0xA5])
    run, version, now, order = AsyncRun(), 0, 0, 0
    events: list[tuple[int, int, str, object]] = []
    free, trainer_busy, trained, started = producers, False, 0, {}
    while trained < steps:
        moved = True
        while moved:   # trainer and producers act until neither can; the trainer first, as a trainer asks
            moved = False    # for its next batch as soon as it has synced (which may move a queue's window)
            if not trainer_busy:
                batch = queue.try_take(per_version)
                if batch is not None:
                    ids = [int(item["id"]) for item in batch]
                    run.batches.append((version, ids))
                    trainer_busy = moved = True
                    heapq.heappush(events, (now + TRAIN_TIME, order, "trained", None))
                    order += 1
            while free:
                ticket = queue.try_admit()
                if ticket is None:
                    break
                sid = len(run.admitted)
                run.admitted.append(sid)
                run.length[sid] = min(MAX_LENGTH, int(rng.geometric(1.0 / MEAN_LENGTH)))
                started[sid] = (ticket, version)
                heapq.heappush(events, (now + run.length[sid], order, "generated", sid))
                order += 1
                free -= 1
                moved = True
        if not events:
            ensure(False, f"the run stopped at step {trained} of {steps}: no sample generating, the trainer idle, "
                          f"the queue admits nothing and delivers nothing ({len(run.admitted)} admitted, "
                          f"{len(run.delivered)} delivered). Fix: admit while the version window has room; deliver "
                          "once a batch is put")
        now, _, kind, sid = heapq.heappop(events)
        if kind == "generated":
            ticket, first = started.pop(sid)
            run.versions[sid] = tuple(range(first, version + 1))   # a segment per version it saw
            queue.put(ticket, {"id": sid, "length": run.length[sid]}, versions=run.versions[sid])
            run.put.append(sid)
            free += 1
        else:
            version, trained, trainer_busy = version + 1, trained + 1, False
            queue.publish_version(version)
    run.pending = [int(item["id"]) for item in queue.pending()]
    return run


def _run(ctx, staleness: int) -> AsyncRun:
    queue = ctx.harness.async_queue(per_version=PER_VERSION, staleness=staleness)
    try:
        return run_async(queue, seed=ctx.seed, staleness=staleness)
    finally:
        queue.close()


def _hist(counter: Counter) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(counter.items())) + "}"


@check("async/nothing_dropped", needs=("async",))
def nothing_dropped(ctx) -> str:
    """Every sample put is delivered once or still pending: none dropped, none twice."""
    run = _run(ctx, staleness=1)
    put, out = Counter(run.put), Counter(run.delivered) + Counter(run.pending)
    lost, twice = sorted((put - out).elements()), sorted((out - put).elements())
    ensure(not lost and not twice,
           f"of {len(run.put)} samples put, {len(lost)} were neither delivered nor pending (e.g. {lost[:5]}) and "
           f"{len(twice)} came out more than once or unput (e.g. {twice[:5]}). A queue that drops the oldest when "
           "full, or discards samples over the staleness bound, loses them. Fix: hold the producer back at "
           "admission (a full window waits), never drop what was accepted")
    return f"{len(run.put)} put = {len(run.delivered)} delivered + {len(run.pending)} pending"


@check("async/staleness_bound", needs=("async",))
def staleness_bound(ctx) -> str:
    """No delivered sample is older than the declared staleness (counted from its oldest segment)."""
    seen = []
    for k in (0, 1, 3):
        run = _run(ctx, staleness=k)
        hist = run.staleness()
        over = {lag: n for lag, n in hist.items() if lag > k}
        ensure(not over, f"staleness {k}: {sum(over.values())} delivered samples were older than {k} versions "
                         f"(lag histogram {_hist(hist)}). Fix: admit a sample only while its place in delivery order "
                         f"is within staleness + 1 versions of the trainer's; deliver oldest first")
        seen.append(f"k={k}: {_hist(hist)}")
    return "lag histograms " + "; ".join(seen)


@check("async/staleness0_is_synchronous", needs=("async",))
def staleness0_is_synchronous(ctx) -> str:
    """With staleness 0, batch t is exactly the t-th group of samples started, in order, all by version t."""
    run = _run(ctx, staleness=0)
    for t, (version, ids) in enumerate(run.batches):
        expect = run.admitted[t * PER_VERSION:(t + 1) * PER_VERSION]
        ensure(ids == expect, f"staleness 0, batch {t}: delivered {ids}, the synchronous trainer trains on samples "
                              f"{expect} (the {t}-th group started, in that order). Fix: deliver in admission order and "
                              "admit the next group only after the trainer publishes its version")
        gens = sorted({v for i in ids for v in run.versions[i]})
        ensure(gens == [version], f"staleness 0, batch {t} (trainer at version {version}): its samples were "
                                  f"generated by versions {gens}. Fix: admit a group only at the version that "
                                  "trains on it")
    return f"{len(run.batches)} batches equal to the synchronous schedule's"


@check("async/oldest_first", needs=("async",))
def oldest_first(ctx) -> str:
    """Samples are delivered in the order they were started, waiting for a slow one, not passing it over."""
    run = _run(ctx, staleness=2)
    got, prefix = run.delivered, run.admitted[:len(run.delivered)]
    first = next((i for i, (a, b) in enumerate(zip(got, prefix)) if a != b), None)
    ensure(first is None, f"delivery {first} is sample {got[first] if first is not None else None}, but "
                          f"sample {prefix[first] if first is not None else None} started before it and was not yet "
                          "delivered. "
                          "Serving what finished first (or newest first) trains more on fast rollouts. Fix: deliver "
                          "in admission order")
    partial = sum(1 for i in got if len(run.versions[i]) > 1)
    return f"{len(got)} delivered in start order ({partial} partial rollouts among them)"


@check("async/no_length_bias", needs=("async",))
def no_length_bias(ctx) -> str:
    """The lengths trained on are the lengths generated: the delivered samples are the oldest ones started."""
    run = _run(ctx, staleness=2)
    got = sorted(run.length[i] for i in run.delivered)
    started = sorted(run.length[i] for i in run.admitted[:len(run.delivered)])
    generated = np.array([run.length[i] for i in run.put], dtype=float)
    mean_got = float(np.mean(got)) if got else 0.0
    ensure(got == started,
           f"the {len(got)} samples trained on have mean length {mean_got:.1f}, the same number started first "
           f"{float(np.mean(started)) if started else 0.0:.1f} (generated overall: {generated.mean():.1f}): the "
           "queue chose which samples to train on by when they finished. Fix: deliver the oldest admitted samples, "
           "drop none")
    return f"trained mean length {mean_got:.1f}, generated {generated.mean():.1f}"
