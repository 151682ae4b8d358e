"""The delivery operator: select -> gather -> delivery hooks, for ``g_del`` batches at once.

One call selects ``g_del`` batches' worth of items in a single draw and splits it, so a
larger delivery granularity amortises the selection and gather without changing what is
drawn; where a batch's items are not drawn independently (stratified prioritized, uniform
without replacement: ``Selector.independent_items``), one draw of g_del * B would not be g_del
draws of B, so each batch is its own draw. Every batch goes through the delivery hooks; if a hook fails, nothing of the call
is handed out and the selection is undone (it does not count as sampled, so the rate
limits stay exact, and the RNG continues as if the draw had not happened).

Callers serialise their calls (the data plane's delivery lock), so selections never
interleave and the RNG sequence equals a sequential run's.
"""

from __future__ import annotations

import time
from typing import Callable

from ..buffer.experience_buffer import ExperienceBuffer
from ..errors import SpecError
from ..schema.batch import Batch
from .prepared_deliveries import DeliveryRequest, PreparedBatch


class DeliveryOperator:
    """Runs delivery requests against one buffer.

    Public contract: ``hooks`` is the list of delivery hooks (Batch -> Batch), run in order;
    ``run_hooks(batch)`` runs them on one batch and names a hook that breaks the contract;
    ``run(request, timeout, ...)`` selects and gathers ``granularity`` batches for a replay
    request and returns them as ``PreparedBatch``es stamped with the guard versions given.
    """

    def __init__(self, buffer: ExperienceBuffer, hooks: list[Callable[[Batch], Batch]]):
        self._buffer = buffer
        self.hooks = hooks

    def run(self, request: DeliveryRequest, timeout: float | None, *, granularity: int, speculative: bool,
            rows_committed: int, priority_version: int) -> list[PreparedBatch]:
        """Select and gather ``granularity`` batches in one call (one selection, split).
        ``speculative``: a batch may be handed out later or never, so the selection token is
        kept to undo it; a batch handed out at once needs none. ``rows_committed`` and
        ``priority_version``: what was stored and the priority updates made before the
        selection, which the guards compare against when the batch is handed out."""
        buffer = self._buffer
        token = buffer.selection_token() if speculative else None
        sampled_before = buffer.counts.sampled
        total = request.batch_size * granularity
        out = []
        try:
            # (a batch in slot order is sorted on its own: one sorted draw split would hand the
            # lowest slots to the first batch)
            if granularity == 1 or (buffer.selector.independent_items and not request.in_slot_order):
                big = self._draw(request, total, timeout)
                batches = split_rows(big, request.batch_size) if granularity > 1 else [big]
            else:   # each batch its own draw (a failure part way undoes them all, below)
                batches = [self._draw(request, request.batch_size, timeout) for _ in range(granularity)]
            for i, b in enumerate(batches):
                b = self.run_hooks(b)
                out.append(PreparedBatch(b, request, rows_committed, priority_version, token if i == 0 else None,
                                         request.batch_size))
        except BaseException:
            # nothing of this selection is handed out: it does not count as sampled (rate limits stay true)
            buffer.rollback_selection(token, items=buffer.counts.sampled - sampled_before,
                                      restore_rng=token is not None)
            raise
        return out

    def _draw(self, request: DeliveryRequest, n: int, timeout: float | None) -> Batch:
        buffer = self._buffer
        if request.kind == "sequences":
            return buffer.sample_sequences(n, request.length, device=request.device, timeout=timeout)
        return buffer.sample(n, device=request.device, n_step=request.n_step, gamma=request.gamma, beta=request.beta,
                             timeout=timeout, episode_end=request.episode_end, fields=request.fields,
                             in_slot_order=request.in_slot_order)

    def run_hooks(self, batch: Batch) -> Batch:
        for hook in self.hooks:
            batch = hook(batch)
            if not isinstance(batch, Batch):
                raise SpecError(f"delivery hook {getattr(hook, '__name__', type(hook).__name__)}",
                                "a conduit_core.Batch", type(batch).__name__,
                                "return the (modified) Batch; add columns with batch['name'] = tensor")
        return batch


def split_rows(batch: Batch, size: int) -> list[Batch]:
    """``batch`` as consecutive batches of ``size`` rows (views, the last may be shorter),
    each keeping its rows' provenance."""
    n = batch.size
    out = []
    for s in range(0, n, size):
        e = s + size
        data = {k: v[s:e] for k, v in batch.items()}
        out.append(Batch(data, slots=batch.slots[s:e], seqs=batch.seqs[s:e], versions=batch.versions[s:e],
                         weights=None if batch.weights is None else batch.weights[s:e],
                         inserted_at_selection=batch.inserted_at_selection,
                         sources=None if batch.sources is None else batch.sources[s:e],
                         n_steps=None if batch.n_steps is None else batch.n_steps[s:e],
                         redraws=batch.redraws if s == 0 else 0, holds=batch.holds))
    return out


class InlineDelivery:
    """One replay batch drawn and handed out by the calling thread, without a request, a prepared
    entry or the operator: the data plane's route for a sequential schedule drawing one batch per
    call with no delivery hook (the data plane judges that). Under the delivery lock ``op_lock``;
    the call's time goes to ``metrics`` in one step (blocked from the call, busy from the lock);
    as ``DeliveryOperator.run`` does, a failure leaves nothing counted as sampled; ``cond`` is
    notified after (a waiting ingest may go on)."""

    def __init__(self, buffer: ExperienceBuffer, *, metrics, op_lock, cond):
        self._buffer, self._metrics, self._op_lock, self._cond = buffer, metrics, op_lock, cond

    def deliver(self, n: int, *, n_step, gamma: float, beta, device, episode_end: str, fields,
                timeout: float | None) -> Batch:
        buffer = self._buffer
        called = time.perf_counter()
        with self._op_lock:
            t0 = time.perf_counter()
            sampled_before = buffer.counts.sampled
            try:
                batch = buffer.sample(n, device=device, n_step=n_step, gamma=gamma, beta=beta, timeout=timeout,
                                      episode_end=episode_end, fields=fields)
            except BaseException:
                buffer.rollback_selection(None, items=buffer.counts.sampled - sampled_before, restore_rng=False)
                self._metrics.add_blocked("deliver", time.perf_counter() - called)
                raise
        done = time.perf_counter()
        self._metrics.add_call("deliver", done - called, done - t0, items_out=n)
        cond = self._cond
        with cond.mutex:
            if cond.waiters:
                cond.notify_all()
        return batch
