"""The scheduler's choice of how SRL's replay kinds deliver: the cost model ranks sequential
delivery against a thread preparing ahead, at each delivery granularity g_del, and the best
becomes the ``Schedule`` passed to ``conduit_srl.enable(delivery=...)``.

The decision is pure (a measured ``conduit_core.planning.costmodel.Profile`` in, a ``Schedule`` out), as
``conduit_core.planning.tuner`` makes it for the data plane. Only host placement and ingestion as SRL runs
it (``put`` on the trainer's main thread) are in the space: the buffer stays where SRL's trainer
worker is. The profile's ``staleness`` bounds what preparing ahead can save (the cost model counts
batches that puts would make stale as wasted), and the result keeps it as the guard.
"""

from __future__ import annotations

from conduit_core.planning.costmodel import Profile, enumerate_configs, rank
from conduit_core.errors import ConfigError
from conduit_core.planning.schedule import Schedule
from conduit_core.planning.tuner import schedule_for

GRANULARITIES = (1, 2, 4, 8)


def check_delivery(delivery, priority_lag: int) -> None:
    """Validate the replay kinds' delivery options (``enable``'s ``delivery`` and ``priority_lag``)."""
    if delivery is not None and not isinstance(delivery, Schedule):
        raise ConfigError("delivery", "a conduit_core.Schedule or None", type(delivery).__name__,
                          "pass Schedule.overlapped(delivery_granularity=..., depth=...) or None (sequential)")
    if delivery is not None and delivery.is_overlapped and delivery.worker != "thread":
        raise ConfigError("delivery.worker", "'thread'", repr(delivery.worker),
                          "prepare replay deliveries in a thread: the buffer lives in the trainer worker")
    if isinstance(priority_lag, bool) or not isinstance(priority_lag, int) or priority_lag < 0:
        raise ConfigError("priority_lag", "an int >= 0", repr(priority_lag),
                          "use 0: SRL's algorithm (every priority update applies before the next draw)")


def plan_delivery(profile: Profile, *, cores: int, granularities: tuple[int, ...] = GRANULARITIES,
                  prioritized: bool = False, priority_lag: int = 0) -> Schedule:
    """The best of sequential / thread x ``granularities`` for ``profile`` on ``cores`` cores, as a
    ``Schedule`` (depth: one operator call's batches, at least 2).

    Prioritized replay with ``priority_lag=0`` is always sequential: SRL's trainer updates the
    priorities right before its next ``get``, so every batch prepared ahead is drawn before an
    update it must see and is discarded (measured: all of them, with the redraw in the way of the
    ``get``); there is nothing to hide."""
    if not isinstance(profile, Profile):
        raise ConfigError("profile", "a conduit_core.planning.costmodel.Profile", type(profile).__name__,
                          "measure one (conduit_core.planning.tuner.profile_from_phases) or build it by hand")
    check_delivery(None, priority_lag)
    if prioritized and priority_lag == 0:
        return Schedule.sequential(staleness=profile.staleness)
    configs = enumerate_configs(placements=("host",), executions=("sequential", "thread"), ingest_granularities=(1,),
                                delivery_granularities=tuple(granularities))
    best = rank(configs, profile, cores=cores)[0].config
    base = Schedule.sequential(staleness=profile.staleness, depth=max(2, best.delivery_granularity))
    return schedule_for(best, base)
