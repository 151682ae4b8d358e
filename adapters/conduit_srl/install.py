"""How Conduit plugs into SRL: SRL has no buffer plug-in point (``rlsrl.base.buffer.make_buffer``
knows four names), so ``enable`` replaces that factory in the launching process; SRL's trainer
worker calls it through the module (``buffer_api.make_buffer``) after the workers fork, so every
trainer worker builds Conduit's buffers. ``enable`` also registers Conduit's trainer worker in SRL's
worker table (:mod:`~conduit_srl.trainer_worker`: SRL's, plus binding a Conduit ``SampleConsumer``
when the trainer's ``sample_stream`` is one). Nothing in SRL's tree changes; ``disable`` restores both."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import logging

from conduit_core.errors import ConfigError

if TYPE_CHECKING:
    from conduit_core.planning.schedule import Schedule

_original = None
_options: dict[str, Any] = {}


def enable(*, lease_depth: int = 2, seed_offset: int = 0, delivery: Schedule | None = None, priority_lag: int = 0,
           empty_wait_s: float = 0.05) -> None:
    """Make SRL's ``make_buffer`` build Conduit's buffers (all four kinds), and register Conduit's
    trainer worker (for a Conduit ``SampleConsumer``; :func:`enable_consumer` does only that).

    ``lease_depth``: gets after which a served queue entry's memory may be reused (2 covers SRL's
    one-step prefetching trainers; see ``conduit_core.queues.entry_queue``).

    ``delivery``: how the replay kinds deliver, a ``conduit_core.Schedule`` (the scheduler's choice:
    :func:`conduit_srl.delivery_plan.plan_delivery` ranks it with the cost model, or
    ``conduit_core.planning.tuner.schedule_for`` maps a cost-model ``Config``). None (the default, conservative):
    sequential, each ``get`` draws on the training thread. ``Schedule.overlapped(delivery_granularity=g,
    depth=d, staleness=s)``: a thread prepares SRL's batch objects ahead, ``g`` per call, at most ``d``;
    one is handed out only if at most ``s`` chunks were put since its draw (0: exactly SRL's
    distribution) and no priority update was made since. ``priority_lag`` (prioritized replay, opt-in,
    changes SRL's algorithm): priority updates a prepared batch may have missed. The queue kinds build
    their batch objects when a batch forms, on ``put``, whatever these say.

    ``empty_wait_s`` (queue kinds): when the training thread finds no batch, ``empty()`` waits up to
    this long for one to form before it answers True, so a batch reaches the trainer as it forms
    instead of after SRL's 5 ms idle sleep (the same serve rules; only when the trainer takes a batch
    moves, as it does from run to run in SRL; 0: SRL's timing)."""
    global _original, _options
    try:
        from rlsrl.base import buffer as srl_buffer
    except ImportError as e:
        raise ConfigError("conduit_srl.enable", "SRL importable (module rlsrl)", f"ImportError: {e}",
                          "build SRL's venv with scripts/srl/setup-srl-venv.sh SRC VENV and run there") from e
    import multiprocessing
    method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method()
    if method != "fork":
        raise ConfigError("multiprocessing start method", "'fork' (SRL's workers inherit the swapped make_buffer)",
                          repr(method), "call multiprocessing.set_start_method('fork') before enable(); with "
                          "spawn or forkserver the workers would silently build SRL's own buffers")
    from . import trainer_worker
    from .buffers import make_buffer
    from .buffers import check_delivery
    check_delivery(delivery, priority_lag)  # fails here, not in the forked trainer workers
    from .queue_buffer import check_empty_wait
    check_empty_wait(empty_wait_s)
    from .buffers import check_options
    check_options(lease_depth, seed_offset)
    _options = dict(lease_depth=lease_depth, seed_offset=seed_offset, delivery=delivery, priority_lag=priority_lag,
                    empty_wait_s=empty_wait_s)
    trainer_worker.install()
    if _original is None:
        _original = srl_buffer.make_buffer

    def conduit_make_buffer(name, **buffer_args):
        return make_buffer(name, **buffer_args, **_options)

    conduit_make_buffer.__conduit__ = True
    srl_buffer.make_buffer = conduit_make_buffer
    logging.getLogger("conduit_srl").info(
        "conduit_srl: enabled: SRL's make_buffer builds Conduit's buffers in every trainer worker forked from "
        "here (lease_depth %d, empty_wait_s %g, delivery %s, priority_lag %d)", lease_depth, empty_wait_s,
        "sequential" if delivery is None else delivery, priority_lag)


def disable() -> None:
    """Give SRL back its own ``make_buffer``."""
    global _original
    from . import trainer_worker
    trainer_worker.uninstall()
    if _original is not None:
        from rlsrl.base import buffer as srl_buffer
        srl_buffer.make_buffer = _original
        _original = None


def enabled() -> bool:
    try:
        from rlsrl.base import buffer as srl_buffer
    except ImportError:
        return False
    return getattr(srl_buffer.make_buffer, "__conduit__", False)


def enable_consumer() -> None:
    """Register Conduit's trainer worker only (SRL's own buffers stay): what a Conduit
    ``SampleConsumer`` needs, in the launching process before SRL forks its workers."""
    try:
        from . import trainer_worker
        trainer_worker.install()
    except ImportError as e:
        raise ConfigError("conduit_srl.enable_consumer", "SRL importable (module rlsrl)", f"ImportError: {e}",
                          "build SRL's venv with scripts/srl/setup-srl-venv.sh SRC VENV and run there") from e
