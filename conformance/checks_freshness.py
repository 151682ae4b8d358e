"""Freshness: in the sequential schedule a delivery draws from everything accepted before it.

``staleness=0`` is the framework's exact semantics (docs/writing-an-adapter.md): a learner that
asks for a batch right after an actor's push can get that push's transitions, as the framework's
own buffer would give them. A delivery path that hands out a batch drawn ahead (one call stale, a
prefetch the schedule did not ask for) never can, and every distribution check still passes it:
its batches are uniform, intact and complete, only late. ``offpolicy/staleness_bound`` checks the
bound where the adapter declares 'overlap'; this check holds every replay adapter to it in the
sequential schedule it must offer.
"""

from __future__ import annotations

import numpy as np

from .checks_semantic import _closing
from .registry import check, ensure

WARM_ROWS, STEPS, BATCH = 64, 40, 16


@check("deliver/sees_newest", needs=("replay",))
def sees_newest(ctx) -> None:
    """A sequential delivery can hold the rollout ingested just before it (no batch drawn ahead)."""
    rolls = ctx.rollouts(n_rollouts=80, max_len=9)
    hits = expected = 0.0
    with _closing(ctx.session(mode="sequential", staleness=0)) as s:
        stored, steps, first = 0, 0, True
        for r in rolls:
            s.ingest(r)
            s.flush()
            stored += len(r.ids)
            if stored < WARM_ROWS:
                continue
            d = s.deliver(BATCH)
            if first:   # not counted: a path that draws ahead has nothing drawn yet at its first call
                first = False
                continue
            hits += int(np.isin(np.asarray(d.ids).astype(np.int64), r.ids).sum())
            expected += BATCH * len(r.ids) / len(s.stored_ids())
            steps += 1
            if steps == STEPS:
                break
    # uniform draws give ~expected hits (>= 18 over seeds 0-4999; none at all has probability below 1e-7,
    # the suite's per-batch bound); a path one delivery behind gives none after its first call, whatever the seed
    ensure(hits > 0, f"in {steps} deliveries, each right after a rollout was ingested, no batch held a transition "
                     f"of that rollout (uniform draws would hold about {expected:.0f}): batches are drawn before the "
                     "last ingest (stale by at least one push in the sequential schedule), or the sampler starves "
                     "new rows. Fix: draw each batch when it is asked for (staleness=0), uniformly over every "
                     "accepted row; or declare 'overlap' and honour its bound")
    return f"{int(hits)} newest-rollout rows delivered (about {expected:.0f} expected)"
