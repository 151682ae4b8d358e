"""Time-major batches: B chunks of T steps, each as its actor sent it, batched along axis 1.

Why these exist: an on-policy learner that trains on trajectories (SRL's PPO, IMPALA-style
learners) gets ``[T, B]`` batches and computes its advantages down axis 0, so how a data
plane lays a batch out changes learning even when every row is intact: a batch laid out
batch-major, a chunk whose steps are reordered or split across columns, two chunks mixed in
one column, a version tag lost, the wrong batch dropped when the queue is full, or batches
served in another order than the framework's queue serves them. The checks drive the
harness's ``time_major_sessions`` with chunks whose every step is known, read every position
of every batch, and replay the same puts and gets on the framework's own queue.
"""

from __future__ import annotations

import numpy as np

from .checks_rows import FIRST_ID, Truth
from .checks_semantic import _closing
from .harness import Delivered, DeliveredTimeMajor, Session, SyntheticRollout
from .registry import CheckSkipped, check, ensure

T, B, MAX_BATCHES = 5, 4, 3
# (chunks put, then every batch taken): the first round fills the queue past MAX_BATCHES batches, so
# the framework's overflow rule decides which are dropped; the second leaves a partial batch pending
SCHEDULE = (18, 9)


def chunks_for(seed: int) -> list[SyntheticRollout]:
    """The actors' chunks: T consecutive steps each, ids apart per chunk by a stride that is odd and
    not a multiple of 13, so that neighbouring columns differ in every field (``ids % 2`` actions,
    ``reward_of``'s period of 13), three policy versions, and done flags at a chunk's last step on
    some (terminated, truncated, neither)."""
    rng = np.random.default_rng(seed)
    n = sum(SCHEDULE)
    out = []
    for k in range(n):
        kind = int(rng.integers(3))
        out.append(SyntheticRollout(ids=FIRST_ID + 1003 * k + np.arange(T), source=k % 3, policy_version=k // 12,
                                    terminated=kind == 1, truncated=kind == 2))
    return out


def _sessions(ctx) -> tuple[Session, Session | None]:
    made = ctx.harness.time_major_sessions(seed=ctx.seed, batch_size=B, max_batches=MAX_BATCHES)
    if made is None:
        raise CheckSkipped("Harness.time_major_sessions returned None (capability 'time_major' needs it)")
    return made


def _deliver(session: Session) -> list[DeliveredTimeMajor]:
    try:
        return list(session.deliver_time_major())
    except NotImplementedError:
        raise CheckSkipped("the session has no deliver_time_major (capability 'time_major' needs it)") from None


def _run(session: Session, chunks: list[SyntheticRollout]) -> list[list[DeliveredTimeMajor]]:
    """The schedule: each round's chunks put, then every batch the trainer could take; a last take
    with nothing put in between must find nothing."""
    rounds, at = [], 0
    for n in SCHEDULE:
        for c in chunks[at:at + n]:
            session.ingest(c)
        at += n
        session.flush()
        rounds.append(_deliver(session))
    rounds.append(_deliver(session))
    return rounds


def _columns(batch: DeliveredTimeMajor, where: str) -> list[int]:
    """Each column's chunk (by its first id), after checking the batch's layout."""
    ids = np.asarray(batch.ids)
    ensure(ids.ndim == 2 and ids.shape == (T, B), f"{where}: ids have shape {ids.shape}; expected [T, B] = "
                                                  f"{[T, B]} ({B} chunks of {T} steps, time-major)")
    ids = ids.astype(np.int64)
    return [int(c) for c in ids[0]]


@check("deliver/time_major_batches", needs=("time_major",))
def time_major_batches(ctx) -> str:
    """Every batch is [T, B]: each column one whole chunk, its steps in order down axis 0, every
    position holding its own step's values and version; no chunk twice, none made up; a take
    with nothing new put finds nothing."""
    chunks = chunks_for(ctx.seed + 11)
    by_first = {int(c.ids[0]): c for c in chunks}
    truth = Truth.of(chunks)
    s, nat = _sessions(ctx)
    if nat is not None:
        nat.close()
    with _closing(s):
        rounds = _run(s, chunks)
    seen: list[int] = []
    fields: set[str] = set()
    for r, batches in enumerate(rounds):
        for k, batch in enumerate(batches):
            where = f"take {r + 1}, batch {k + 1}"
            firsts = _columns(batch, where)
            ids = np.asarray(batch.ids).astype(np.int64)
            for b, first in enumerate(firsts):
                chunk = by_first.get(first)
                ensure(chunk is not None, f"{where}, column {b}: starts at id {first}, the first step of no chunk "
                                          f"(column {ids[:, b].tolist()}): chunks are cut or mixed")
                ensure(ids[:, b].tolist() == chunk.ids.tolist(),
                       f"{where}, column {b}: steps {ids[:, b].tolist()}, expected the chunk's "
                       f"{chunk.ids.tolist()} in order down axis 0 (one column, one chunk)")
                if batch.versions is not None:
                    v = np.asarray(batch.versions).reshape(T, B)[:, b]
                    ensure(bool(np.all(v == chunk.policy_version)),
                           f"{where}, column {b}: policy versions {v.tolist()}, the chunk's is {chunk.policy_version}")
            flat = Delivered(ids=ids.T.reshape(-1), rows={f: np.swapaxes(np.asarray(a), 0, 1).reshape(T * B, *np.shape(a)[2:])
                                                          for f, a in batch.rows.items()})
            fields |= set(truth.verify(flat, where))
            seen += firsts
    twice = sorted({f for f in seen if seen.count(f) > 1})
    ensure(not twice, f"chunks starting at ids {twice[:6]} were delivered more than once")
    ensure(rounds[-1] == [], f"a take with nothing put since the last returned {len(rounds[-1])} batches "
                             "(already delivered, or made up)")
    ensure(seen, "no batch was delivered: nothing to compare")
    return f"{sum(len(x) for x in rounds)} batches of [T, B] = [{T}, {B}], fields {', '.join(sorted(fields))}"


@check("equivalence/time_major_matches_native", needs=("time_major", "native"))
def time_major_matches_native(ctx) -> str:
    """On the same puts and takes, the adapter hands over exactly the batches the framework's own
    queue does, in its order: the same chunks in the same columns, the same ones dropped when
    the queue is full, the same partial batch left pending."""
    chunks = chunks_for(ctx.seed + 12)
    s, nat = _sessions(ctx)
    if nat is None:
        s.close()
        raise CheckSkipped("Harness.time_major_sessions returned no native session")
    with _closing(s), _closing(nat):
        mine, theirs = _run(s, chunks), _run(nat, chunks)
    for r, (a, b) in enumerate(zip(mine, theirs)):
        got = [_columns(x, f"take {r + 1} (adapter)") for x in a]
        want = [_columns(x, f"take {r + 1} (native)") for x in b]
        ensure(got == want, f"take {r + 1}: the adapter handed over batches of chunks {got} (by first id), the "
                            f"framework's queue {want}: another order, overflow or batching rule")
    return f"{sum(len(x) for x in theirs)} batches, in the framework's order"
