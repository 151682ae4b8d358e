"""SRL's four buffer kinds on Conduit's core, behind SRL's ``Buffer`` interface: SRL's
``make_buffer`` (names and arguments) building Conduit's buffers.

``put`` runs on the trainer worker's main thread (``consume_to``), ``get``/``empty``/``qsize``/
``update_priorities`` on its training thread; SRL's own buffers have no lock, these are
thread-safe. Neither ``put`` nor ``get`` blocks. Entries are SRL's ``ReplayEntry`` with the
same field values SRL's buffers give (``reuses_left``, ``reuses``, ``receive_time``,
``sampling_indices``), samples time-major ``[T, B, ...]`` rebuilt as SRL rebuilds them.

One module per buffer class, each with the deliberate differences from SRL's own buffers (each
for correctness, each shown by a test in ``tests/srl_venv``):
:mod:`~conduit_srl.queue_buffer` (``simple_queue``, ``priority_queue``: :class:`ConduitQueueBuffer`)
and :mod:`~conduit_srl.replay_buffer` (``simple_replay_buffer``, ``prioritized_replay_buffer``:
:class:`ConduitReplayBuffer`). This module keeps what picks between them and what is imported
from here: :func:`make_buffer`, the kind names, and ``ConduitPrioritizedReplayBuffer`` (a class
SRL's trainer recognises, built on first use so that nothing of SRL is imported before).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import logging

import numpy as np

from conduit_core.errors import ConfigError

from .delivery_plan import check_delivery
from .queue_buffer import QUEUE_KINDS, ConduitQueueBuffer
from .replay_buffer import REPLAY_KINDS, ConduitReplayBuffer

if TYPE_CHECKING:
    from conduit_core.planning.schedule import Schedule

log = logging.getLogger("conduit_srl")

# imported from here (conduit_srl, tests, benchmarks); ConduitPrioritizedReplayBuffer is left out on
# purpose: naming it in a star import would build it, importing SRL
__all__ = ["QUEUE_KINDS", "REPLAY_KINDS", "ConduitQueueBuffer", "ConduitReplayBuffer", "check_delivery", "make_buffer"]


# The arguments each of SRL's buffer classes takes (rlsrl/base/buffer.py at b3b01ea: SimpleQueueBuffer,
# PriorityQueueBuffer, SimpleReplayBuffer, PrioritizedReplayBuffer): SRL's make_buffer raises a TypeError
# for any other, and so does this one (an argument of another kind, e.g. alpha on simple_replay_buffer,
# would otherwise be taken and ignored: uniform draws for a user who believes they have priorities)
SRL_ARGUMENTS = {
    "simple_queue": ("batch_size", "max_size"),
    "priority_queue": ("max_size", "reuses", "batch_size"),
    "simple_replay_buffer": ("max_size", "batch_size", "warmup_transitions", "seed", "sample_length", "batch_length"),
    "prioritized_replay_buffer": ("max_size", "sample_length", "batch_size", "warmup_transitions", "seed",
                                  "burn_in_steps", "alpha", "beta", "beta_scheduler", "max_priority",
                                  "priority_interpolation_eta"),
}


def check_srl_arguments(name: str, buffer_args) -> None:
    """A TypeError naming an argument SRL's buffer of kind ``name`` does not take."""
    allowed = SRL_ARGUMENTS.get(name, ())
    for arg in buffer_args:
        if arg not in allowed:
            raise TypeError(f"{name}: unexpected keyword argument {arg!r} (SRL's buffer of this kind takes "
                            f"{', '.join(allowed)}). Fix: remove it, or pick the buffer kind that takes it")


def check_options(lease_depth, seed_offset) -> None:
    """``conduit_srl.enable``'s own options (checked at ``enable``, not in the forked workers)."""
    if isinstance(lease_depth, bool) or not isinstance(lease_depth, (int, np.integer)) or lease_depth < 0:
        raise ConfigError("lease_depth", "an integer >= 0", repr(lease_depth),
                          "pass 2 for a trainer with a one-step prefetcher, 1 without one")
    if isinstance(seed_offset, bool) or not isinstance(seed_offset, (int, np.integer)):
        raise ConfigError("seed_offset", "an integer", repr(seed_offset), "pass an int added to each buffer's seed")


def make_buffer(name: str, *, lease_depth: int = 2, seed_offset: int = 0, delivery: Schedule | None = None,
                priority_lag: int = 0, empty_wait_s: float = 0.0,
                **buffer_args: Any) -> ConduitQueueBuffer | ConduitReplayBuffer:
    """SRL's ``make_buffer`` names and arguments, Conduit's buffers. A prioritized replay buffer is
    also an instance of SRL's ``PrioritizedReplayBuffer`` (SRL's trainer thread sends priorities only
    to those), built as a subclass whose every method is Conduit's. ``delivery`` (a ``Schedule``) and
    ``priority_lag``: how the replay kinds deliver (see ``conduit_srl.enable``); the queue kinds
    prepare their batches on ``put`` and take neither. ``empty_wait_s``: how long a queue kind's
    ``empty`` waits for a batch to form before it answers True (``ConduitQueueBuffer.empty``)."""
    if name not in SRL_ARGUMENTS:
        raise ConfigError("buffer_name", f"one of {QUEUE_KINDS + REPLAY_KINDS}", repr(name),
                          "use one of SRL's buffer names")
    check_srl_arguments(name, buffer_args)
    check_options(lease_depth, seed_offset)
    if name in QUEUE_KINDS:
        buffer = ConduitQueueBuffer(name, lease_depth=int(lease_depth), empty_wait_s=empty_wait_s, **buffer_args)
        how = f"empty_wait_s {empty_wait_s:g}, lease_depth {int(lease_depth)}"
    else:
        args = dict(buffer_args)
        args["seed"] = args.get("seed", 0) + int(seed_offset)
        if name == "simple_replay_buffer":
            buffer = ConduitReplayBuffer(name, delivery=delivery, **args)
        else:
            buffer = _prioritized_class()(name, delivery=delivery, priority_lag=priority_lag, **args)
        how = f"delivery {'sequential' if delivery is None else delivery}"
    # what a user reads in SRL's worker log to know the trainer runs on Conduit (SRL's launcher logs INFO)
    log.info("conduit_srl: SRL's %s built on Conduit (%s; %s)", name,
             ", ".join(f"{k}={v!r}" for k, v in sorted(buffer_args.items())) or "SRL's defaults", how)
    return buffer


_PRIORITIZED_CLASS = None


def _prioritized_class():
    global _PRIORITIZED_CLASS
    if _PRIORITIZED_CLASS is None:
        try:
            from rlsrl.base.buffer import PrioritizedReplayBuffer as SRLPrioritized
            bases = (ConduitReplayBuffer, SRLPrioritized)
        except ImportError:
            bases = (ConduitReplayBuffer,)
        _PRIORITIZED_CLASS = type("ConduitPrioritizedReplayBuffer", bases,
                                  {"__module__": __name__, "__qualname__": "ConduitPrioritizedReplayBuffer"})
    return _PRIORITIZED_CLASS


def __getattr__(name: str):
    """``conduit_srl.buffers.ConduitPrioritizedReplayBuffer``, built on first use (so pickle finds it
    without this module importing SRL at import time)."""
    if name == "ConduitPrioritizedReplayBuffer":
        return _prioritized_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
