"""The buffer's delivery side: draw a batch (replay), a batch of sequences, or consume the
oldest rows (FIFO), and gather them decoded on the learner's device.

Each function takes the buffer and uses only its public parts (its lock, ring, storage,
selector, episode walk, RNG, counters and ``gather``); ``ExperienceBuffer``'s methods of
the same names are the documented entry points. Arguments are checked before anything is
drawn (``sampling_args``); a lost remote shard during a draw is recovered and the draw runs
again (``shard_loss``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import CapacityError, ConfigError, ExperienceTimeout, RowsNotStored, SpecError, require_int_array
from ..schema.batch import Batch
from ..selection.rate_gate import wait_to_sample, wait_until
from ..selection.selectors import Selector, delivered_update_args, floored, require_ring_slots
from .routes import POOLED_ROWS, POOLED_WINDOWS, choose_draw
from .sampling_args import PLAIN_FIELDS, PLAIN_N_STEP, check_batch_size, check_device, check_fields, check_length, replay_args
from .selection import select_slots, weights_tensor


@dataclass
class DeliveryCounts:
    """What left the buffer: rate limits and state dicts read these."""

    sampled: int = 0         # items ever delivered by sample()/take()
    dropped_stale: int = 0   # FIFO: items dropped for being from an older policy version
    lost: int = 0            # FIFO: queued items lost with a shard (never to be taken; see shard_loss)


def sample(buf, batch_size: int, *, device: torch.device | str | None = None,
           n_step: int | tuple[int, int] | None = None, gamma: float = 0.99,
           beta: float | None = None, timeout: float | None = None,
           fields: Sequence[str] | None = None, episode_end: str = "shorten", in_slot_order: bool = False) -> Batch:
    """Select ``batch_size`` items (uniform or prioritized) and gather them, decoded,
    on ``device``. With ``n_step`` (an int, or ``(lo, hi)`` drawn per item from
    ``[lo, hi)`` as RLlib does), ``reward`` is the discounted n-step return within the
    episode and ``next_obs``/done fields come from the last step; ``n_step`` is added
    (the window's true length, for the gamma^n_step bootstrap).

    ``episode_end`` decides what happens to a window that would run past its episode's
    stored end (the episode ended, or its next steps are not stored yet). 'shorten'
    delivers the shorter window (RLlib's uniform ``EpisodeReplayBuffer`` draws these);
    'redraw' draws the item and its n again, so every delivered window has its full n
    (RLlib's ``PrioritizedEpisodeReplayBuffer``). The two are different distributions
    over the same data, and they change how fast DQN learns: pick the framework's.

    ``in_slot_order`` (1-step draws): the batch's items sorted by ring slot, stably (an item
    drawn twice keeps its draws' order), weights with them; the draw itself is the same. For a
    framework that hands its batches out so (SRL sorts its gather indices): the gather reads
    the ring in order and the adapter need not permute the batch after it.

    The one dispatcher of a draw: the arguments are checked once, then ``routes.choose_draw``
    picks the implementation that carries it out (``routes.py`` lists them); each hands out what
    ``draw_reference`` would."""
    if type(fields) not in PLAIN_FIELDS or type(n_step) not in PLAIN_N_STEP:
        fields, n_step = replay_args(fields, n_step)   # (one form for every route)
    if device is not None:
        check_device(device)
    if buf.selector.consumes:
        raise ConfigError("selector", "a selector that does not consume (uniform, prioritized) for sample()",
                          f"{buf.selector.name} (consumes=True)", "use take() to consume queued (on-policy) data")
    buf.sampling_checks.check(buf, batch_size, n_step, gamma, beta, episode_end, fields)
    if in_slot_order and n_step is not None:
        raise ConfigError("in_slot_order", "1-step draws (n_step=None)", f"n_step={n_step!r}",
                          "sample n-step windows in draw order (in_slot_order=False)")
    cond = buf.lock
    with cond.mutex:   # the condition's RLock, entered in C (the hot path; waits and notifies work under it)
        if buf.closed:
            buf.check_open()
        size, limiter, routes = buf.ring.stored_count(), buf.rate_limiter, buf.routes
        waits = limiter.samples_per_insert is not None or size < limiter.min_size   # (else wait_to_sample returns size)
        route = choose_draw(routes.draw_fits(buf.storage), waits, n_step, device, fields, episode_end, in_slot_order)
        routes.draws[route] += 1
        if route is POOLED_ROWS:
            return routes.rows.draw(batch_size, beta, size)
        if route is POOLED_WINDOWS:
            return routes.windows.draw(batch_size, n_step, gamma, beta, fields, size)
        return draw_reference(buf, batch_size, n_step, gamma, beta, episode_end, device, fields, in_slot_order,
                              size, waits, timeout)


def draw_reference(buf, batch_size, n_step, gamma, beta, episode_end, device, fields, in_slot_order, size,
                   waits, timeout) -> Batch:
    """Every replay draw, and the specification of the faster routes (``routes.py``): ``sample``'s
    arguments checked and in ``replay_args``'s forms, the buffer's lock held, ``size`` rows stored
    (``waits``: a rate limit or min_size may hold the draw back). Waits for rows or a rate limit,
    recovers a lost remote shard and draws again, gathers through the storage's general gather
    (codecs, shards, devices)."""
    ring, cond = buf.ring, buf.lock
    if waits:
        size = wait_to_sample(buf, batch_size, timeout)
    # the columns come from the output pool for a plain 1-step gather of every field on the host
    # and for host windows drawn with the redraw rule (window_outputs); the others are fresh
    out_pool = buf.output_pool
    pooled = n_step is None and gathers_pooled(buf, fields, device)
    weights_out = out_pool.next_weights(batch_size) if pooled and buf.selector.fills_weights_out else None
    if buf.storage.may_lose_shards:   # a lost remote shard: recover, wait for rows, draw again
        slots, weights, data, redraws = buf.run_storage(
            lambda: _draw(buf, batch_size, n_step, gamma, beta, episode_end, device, fields, buf.size,
                          weights_out, in_slot_order),
            then=lambda: wait_to_sample(buf, batch_size, timeout))
    else:
        slots, weights, data, redraws = _draw(buf, batch_size, n_step, gamma, beta, episode_end, device, fields, size,
                                              weights_out, in_slot_order)
    buf.counts.sampled += batch_size
    if cond.waiters:
        cond.notify_all()
    seqs, versions, sources = ring.gather_meta(slots)
    if weights_out is not None and weights is weights_out[0]:   # written in place: hand the entry out
        out_pool.advance_weights(batch_size)   # (not before: a failed draw uses up no entry)
        weights = weights_out[1]
    elif weights is not None and type(weights) is not torch.Tensor:   # (a pooled window batch's is one)
        weights = weights_tensor(weights, device)
    batch = Batch(data, slots=slots, seqs=seqs, versions=versions, weights=weights,
                  inserted_at_selection=ring.inserted, sources=sources, redraws=redraws)
    if out_pool is not None:
        out_pool.bind(batch)
    return batch


def gathers_pooled(buf, fields=None, device=None) -> bool:
    """Whether ``buf.gather(slots, device, fields)`` returns the output pool's reused host arrays
    (every field, no device, storage that fills given outputs): such a batch is valid for
    ``reuse_outputs`` more deliveries, and its importance weights may be reused with it."""
    return buf.output_pool is not None and fields is None and device is None and buf.storage.fills_outputs()


def window_outputs(buf, batch_size: int, fields=None, device=None):
    """(take_into, the output pool's next ``WindowOutputs``, the walk's ``window_plan(fields)``,
    took) for ``batch_size`` n-step windows of ``fields`` (``EpisodeWalk.window_columns``'s
    ``pooled``), or None where the batch is fresh (no pool, a device's batch, storage that cannot
    take into outputs). Not handed out until ``took()``: a draw that fails uses up no entry."""
    out_pool, storage = buf.output_pool, buf.storage
    if out_pool is None or device is not None or not storage.takes_into():
        return None
    plan = buf.walk.window_plan(fields)
    names = plan[2] + plan[1]
    return storage.take_into, out_pool.windows(batch_size, names), plan, partial(out_pool.took_windows, batch_size,
                                                                                 names)


def _draw(buf, batch_size, n_step, gamma, beta, episode_end, device, fields, size, weights_out=None,
          in_slot_order=False):
    """One draw of ``sample`` (the lock held; ``size`` items stored): (slots, importance weights
    or None, columns, items redrawn). A plain draw's weights go into ``weights_out`` (array, tensor) if given."""
    ring, walk, selector = buf.ring, buf.walk, buf.selector
    if n_step is None:
        slots, weights = select_slots(ring, selector, buf.rng, batch_size, size, beta,
                                      None if weights_out is None else weights_out[0])
        if in_slot_order and slots.size > 1 and not bool((slots[1:] >= slots[:-1]).all()):
            order = np.argsort(slots, kind="stable")
            slots = slots[order]
            if weights is not None:
                weights[:] = weights[order]   # (in place: a pooled weights array stays the one handed out)
        return slots, weights, buf.gather(slots, device, fields), 0
    if episode_end == "redraw":
        pooled = window_outputs(buf, batch_size, fields, device)   # (steps and weights written in place)
        slots, weights, ret, last, steps, redraws = walk.sample_windows(
            ring, buf.storage, selector, buf.rng, batch_size, n_step, gamma, beta, redraw=True,
            out=None if pooled is None else (pooled[1].walk["weights"], pooled[1].walk["n_step"]), stored=size)
        data = walk.window_columns(buf.storage.gather_each, slots, ret, last, steps, device, fields,
                                   fresh=buf.storage, pooled=pooled)
        if pooled is not None:   # drawn: the entry goes out with the batch
            pooled[3]()
            if weights is not None:
                weights = pooled[1].weights_tensor()
        return slots, weights, data, redraws
    slots, weights = select_slots(ring, selector, buf.rng, batch_size, size, beta)
    return slots, weights, walk.n_step_columns(ring, buf.storage, buf.rng, slots, n_step, gamma, device,
                                               fields), 0


def sample_sequences(buf, batch_size: int, length: int, *, device=None, timeout: float | None = None) -> Batch:
    """``batch_size`` sequences of ``length`` consecutive steps of one episode each,
    shaped ``[B, T, ...]``, with a boolean ``mask`` [B, T] that is False after the
    episode ends (those steps repeat the last real step and must be ignored).
    Starts are chosen by the selector."""
    check_length(length, buf.capacity)
    if device is not None:
        check_device(device)
    if buf.selector.consumes:
        raise ConfigError("selector", "a selector that does not consume (uniform, prioritized) for sample_sequences()",
                          f"{buf.selector.name} (consumes=True)", "use take() for queued (on-policy) data")
    check_batch_size(batch_size, buf.row_bytes)
    ring = buf.ring
    with buf.lock:
        buf.check_open()
        wait_to_sample(buf, batch_size, timeout)

        def draw():
            starts, weights = select_slots(ring, buf.selector, buf.rng, batch_size, buf.size, None)
            grid, mask = buf.walk.sequence_grid(ring, starts, length)
            return starts, weights, mask, buf.gather(grid, device)
        starts, weights, mask, data = buf.run_storage(draw, then=lambda: wait_to_sample(buf, batch_size, timeout))
        dev = torch.device(device) if device is not None else torch.device("cpu")
        data["mask"] = torch.from_numpy(mask).to(dev)
        buf.counts.sampled += batch_size
        buf.lock.notify_all()
        batch = Batch(data, slots=starts, seqs=ring.meta["seq"][starts], versions=ring.meta["version"][starts],
                      weights=None if weights is None else torch.from_numpy(weights).to(dev),
                      inserted_at_selection=ring.inserted)
        if buf.output_pool is not None:
            buf.output_pool.bind(batch)
        return batch


def take(buf, batch_size: int | None = None, *, policy_version: int | None = None,
         device=None, timeout: float | None = None, wait: bool = True) -> Batch:
    """Consume queued items, each exactly once: those the consuming selector picks (``Fifo``: the
    oldest, in order; a ``select`` of your own: any positions among the queued rows, oldest = 0).

    With ``policy_version``, items from older versions are dropped (counted in
    ``dropped_stale``), never delivered; an item from a *newer* version is a caller
    error. ``batch_size=None`` takes everything available now."""
    if not buf.selector.consumes:
        raise ConfigError("selector", "a consuming selector (Fifo(), or one with consumes = True) for take()",
                          buf.selector.name, "build the buffer with selector=Fifo() for on-policy data")
    if device is not None:
        check_device(device)
    ring = buf.ring

    def drop_stale() -> None:
        if policy_version is not None:
            buf.counts.dropped_stale += ring.drop_stale_prefix(policy_version)

    def enough() -> bool:
        drop_stale()
        return ring.queued(policy_version) >= batch_size

    def wait_for_rows() -> None:
        """Until ``batch_size`` rows of the version are queued (again, after a lost shard)."""
        if batch_size is None:
            drop_stale()
            return
        if enough():
            return
        gaps = ring.inserted - ring.head - ring.queued()
        if gaps and ring.inserted - ring.head >= buf.capacity:   # full of queued rows and gaps: no insert can come
            raise ExperienceTimeout(
                f"take: expected {batch_size} items of policy version {policy_version}, "
                f"{ring.queued(policy_version)} are queued and no more can be: a lost shard's rows hold "
                f"{gaps} slots until the rows before them are taken. Fix: "
                "take what is there (batch_size=None), then go on.")
        if not wait:
            raise ExperienceTimeout(
                f"take: expected {batch_size} items of policy version {policy_version}, "
                f"{ring.queued(policy_version)} are available. Fix: flush the "
                "producers first, or take batch_size=None for what is there.")
        wait_until(buf.lock, enough, limiter=buf.rate_limiter, timeout=timeout,
                   why=f"{ring.queued(policy_version)} of {batch_size} items of version {policy_version} "
                       "available", kind="take", check_open=buf.check_open)

    def draw():
        queued = ring.queued(policy_version)
        k = queued if batch_size is None else batch_size
        if k:   # (only the front of the queue the positions reach is listed: FIFO's k rows, not the whole queue)
            positions = consumed_positions(buf.selector, k, queued, buf.rng)
            seqs = ring.queued_seqs(int(positions.max()) + 1)[positions]
        else:
            seqs = np.empty(0, dtype=np.int64)
        slots = seqs % buf.capacity
        data = buf.gather(slots, device) if k else {f.name: torch.empty((0, *f.shape), dtype=f.dtype)
                                                     for f in buf.spec}
        return k, seqs, slots, data
    with buf.lock:
        buf.check_open()
        if batch_size is not None:
            check_batch_size(batch_size, buf.row_bytes)
            if batch_size > buf.capacity:
                raise CapacityError(f"batch_size: expected at most capacity={buf.capacity}, got "
                                    f"{batch_size}. Fix: raise capacity or take smaller batches.")
        wait_for_rows()
        k, seqs, slots, data = buf.run_storage(draw, then=wait_for_rows)   # a lost shard's rows are passed over
        versions = ring.meta["version"][slots].copy()
        removed = ring.consume(seqs)
        if removed is not None:   # taken from behind the front: as an eviction, for the parts that keep rows
            buf.selector.on_evict(removed[1])
            if buf.dual_writer is not None:
                buf.dual_writer.on_evict(removed[0])
        buf.counts.sampled += k
        buf.lock.notify_all()
        batch = Batch(data, slots=slots, seqs=seqs, versions=versions, inserted_at_selection=ring.inserted)
        if buf.output_pool is not None:
            buf.output_pool.bind(batch)
        return batch


def consumed_positions(selector, k: int, queued: int, rng: np.random.Generator) -> np.ndarray:
    """The consuming selector's choice of ``k`` of the ``queued`` rows (positions, oldest first),
    checked: each row is delivered once, so a position twice or out of range is the selector's bug."""
    positions, _ = selector.select(k, queued, rng)
    positions = np.asarray(positions)
    if positions.shape != (k,) or positions.dtype.kind not in "iu" or (k and (
            positions.min() < 0 or positions.max() >= queued or np.unique(positions).size != k)):
        got = f"shape {positions.shape}, dtype {positions.dtype}" + (
            f", range [{positions.min()}, {positions.max()}], {np.unique(positions).size} distinct"
            if positions.size and positions.dtype.kind in "iu" else "")
        raise ConfigError(f"{type(selector).__name__}.select({k}, {queued}, rng)",
                          f"{k} distinct int positions in [0, {queued}) (a consuming selector delivers each row once)",
                          got, "return positions among the queued rows, oldest = 0, each at most once")
    return positions.astype(np.int64, copy=False)


def update_priorities(buf, slots: np.ndarray, priorities: Any, *, seqs: np.ndarray | None = None,
                      abs_floor: float | None = None, slots_only: bool = False) -> int:
    """Set new priorities for delivered items: ``slots`` and ``seqs`` of the delivered Batch, so
    that items overwritten since they were delivered are skipped (their slots hold other rows
    now). ``slots_only=True`` updates whatever row sits in each slot now, without that check:
    for a caller that knows no insert can have come between. ``abs_floor``: priorities given as
    TD errors, each stored as ``max(|p|, abs_floor)`` (RLlib floors at 1e-12). Returns how
    many were updated."""
    if seqs is None and slots_only is not True:
        raise ConfigError("seqs", "the delivered batch's seqs (batch.seqs)", "None",
                          "pass seqs=batch.seqs, so rows overwritten since the batch was delivered keep their "
                          "priority; slots_only=True updates whatever row now sits in each slot")
    if abs_floor is not None and not (type(abs_floor) is float and 0.0 <= abs_floor < math.inf) and (
            isinstance(abs_floor, (bool, np.bool_)) or not isinstance(abs_floor, (int, float, np.integer, np.floating))
            or not 0.0 <= abs_floor < math.inf):
        raise ConfigError("abs_floor", "None or a finite number >= 0", repr(abs_floor),
                          "e.g. abs_floor=1e-12 for |TD error| priorities, or None to store them as given")
    selector = buf.selector
    slots, seqs, pr = delivered_update_args(slots, seqs, priorities)   # (a batch's own arrays: identity checks)
    if abs_floor is not None:
        abs_floor = float(abs_floor)
        if not selector.floors_priorities:   # a selector written before abs_floor: floored here for it
            pr, abs_floor = floored(pr, abs_floor), None
    with buf.lock.mutex:
        if buf.closed:
            buf.check_open()
        if seqs is not None:   # the usual case: the selector's one step (native where it has one)
            stored_seqs = buf.ring.meta["seq"]
            if abs_floor is None:
                done = selector.update_delivered(slots, seqs, pr, stored_seqs)
            else:
                done = selector.update_delivered(slots, seqs, pr, stored_seqs, abs_floor=abs_floor)
            if done is None:   # a selector written to the contract before 0.2, where None declined
                warnings.warn(f"{type(selector).__name__}.update_delivered returned None: it must now return how "
                              "many rows it set (the base class's update is the reference; call "
                              "super().update_delivered(...) instead of returning None). Taking the reference "
                              "update for it until 0.3.", DeprecationWarning, stacklevel=2)
                done = Selector.update_delivered(selector, slots, seqs, pr, stored_seqs, abs_floor=abs_floor)
            return done
        pr = floored(pr, abs_floor)
        require_ring_slots(slots, buf.capacity)
        stored = buf.ring.meta["seq"][slots]
        if slots.size and not (live := buf.ring.live(slots, stored)).all():
            bad = int(slots[~live][0])
            raise SpecError("slots", "slots that hold a stored row", f"slot {bad} (empty or evicted)",
                            "pass the slots of a delivered Batch, with its seqs so rows overwritten since "
                            "are skipped")
        selector.update_priorities(slots, pr)
        return int(slots.shape[0])


def read(buf, seqs, *, fields: Sequence[str] | None = None,
         device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """Stored rows by their seq, decoded: each field shaped ``seqs.shape + field shape``.

    For an adapter that rebuilds its framework's own objects around rows it already
    knows (RLlib's episode slices, with their lookback): no selection, no RNG draw,
    nothing counted as sampled. A seq that is not stored (never written, overwritten by
    the ring, evicted, or on a lost shard) is an error naming it; nothing is read then.
    A remote shard found lost by the read is recovered (``ExperienceBuffer.losses``) and the
    read checked again: its rows asked for are then not stored (``RowsNotStored``)."""
    given = seqs if isinstance(seqs, np.ndarray) else np.asarray(seqs)
    flat = require_int_array("seqs", given, fix="pass the seqs of stored rows (e.g. a delivered batch's seqs)")
    seqs = flat.reshape(given.shape)
    check_fields(buf.spec, fields)
    if device is not None:
        check_device(device)
    target = None if device is None else torch.device(device)

    def checked_gather():   # again after a recovery: the lost shard's rows left the ring
        live = buf.ring.stored(flat)
        if not live.all():
            bad = int(flat[np.argmin(live)])
            raise RowsNotStored(f"read: seq {bad} is not stored (stored seqs are in [{buf.ring.lo()}, "
                                f"{buf.ring.inserted}) minus evicted rows and rows of lost shards). Fix: read "
                                "only rows this buffer still holds (e.g. seqs from a delivered batch or from the "
                                "adapter's own ledger of stored episodes, updated from ExperienceBuffer.losses).")
        return buf.storage.gather((flat % buf.capacity).reshape(seqs.shape), device=target, fields=fields)

    with buf.lock:
        buf.check_open()
        data = buf.run_storage(checked_gather)
    return dict(data)


def reserve_prepared_outputs(buf, prepared: int) -> None:
    """Output entries made ahead for up to ``prepared`` batches drawn ahead of the learner (a data
    plane's): its refills then allocate nothing (validity is kept by ``OutputPool.bind``)."""
    if buf.output_pool is not None:
        buf.output_pool.reserve(prepared)
