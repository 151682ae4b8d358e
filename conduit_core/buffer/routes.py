"""Which implementation carries out a buffer operation: decided once per call, here.

Each operation has one reference implementation, which handles every case and is the
specification, and faster implementations of the cases a training loop runs every step. A
faster one hands out exactly what the reference would (values, provenance, weights, counts,
the RNG's state afterwards); the tests compare the two call after call
(tests/core/buffer/test_row_draw.py, test_window_draw.py, test_inline_insert.py). The choice
is a pure function of the call's arguments and of facts about the buffer (its storage's
layout, what the call would have to wait for), made in one place per operation; an
implementation never hands a call on to another.

Draw (``ExperienceBuffer.sample``; ``choose_draw``):

| route | implementation | the draws it carries out |
|---|---|---|
| ``pooled_rows`` | ``row_draw.PooledRowDraw.draw`` | 1-step batches of every field, into the output pool (one plain host shard) |
| ``pooled_windows`` | ``window_draw.PooledWindowDraw.draw`` | n-step windows with the redraw rule, into the output pool (one plain host shard) |
| ``reference`` | ``delivery.draw_reference`` | every draw: devices, field subsets, shortened windows, slot order, rate limits to wait on, codecs, shards, lost shards |

Insert (``ExperienceBuffer.add``, ``add_encoded_many`` and the data plane's ingest; ``choose_insert``):

| route | implementation | the inserts it carries out |
|---|---|---|
| ``native`` | ``inline_insert.InlineInsert`` | rollouts of plain host columns in the spec's exact form: checked and copied natively |
| ``together`` | ``insertion.insert_together`` | encoded rollouts stored under one lock hold, the ring advanced once |
| ``reference`` | ``insertion.add_encoded``, one by one | every insert: waits (rate limits, FIFO space), frame pools, migrations, lost shards |

Two facts are known only inside the native insert: whether the native check takes the
rollouts as they are (a tensor, a strided view or a NaN reward is left to the reference, which
converts it or names the error), and what the buffer must wait for once its lock is held.
That route answers ``DECLINED`` for them, having changed nothing, and its caller (the one
insert dispatcher of each entry point) runs the reference.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

POOLED_ROWS, POOLED_WINDOWS, REFERENCE = "pooled_rows", "pooled_windows", "reference"
NATIVE, TOGETHER = "native", "together"
DRAW_ROUTES = (POOLED_ROWS, POOLED_WINDOWS, REFERENCE)
INSERT_ROUTES = (NATIVE, TOGETHER, REFERENCE)


class _Declined:
    """The native insert's answer where it does not take the call (nothing changed)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DECLINED"


DECLINED = _Declined()


def choose_draw(fits: tuple[bool, bool], waits: bool, n_step: int | tuple[int, int] | None, device: Any,
                fields: Sequence[str] | None, episode_end: str,
                in_slot_order: bool) -> str:
    """The route of one replay draw, its arguments already checked. ``fits``: whether the
    storage suits the pooled 1-step and window routes (``Routes.draw_fits``); ``waits``: the
    draw may have to wait for rows or a rate limit (only the reference waits)."""
    if waits or device is not None or in_slot_order:
        return REFERENCE
    if n_step is None:
        return POOLED_ROWS if fits[0] and fields is None else REFERENCE
    return POOLED_WINDOWS if fits[1] and episode_end == "redraw" else REFERENCE


def choose_insert(native_fits: bool, parts: int, stores_at_once: bool) -> str:
    """The route of an insert of ``parts`` encoded rollouts (``native_fits``: the storage is one
    host shard of plain columns and the rollouts come as columns to check natively;
    ``stores_at_once``: ``insertion.stores_at_once``, judged under the buffer's lock)."""
    if not stores_at_once:
        return REFERENCE
    if native_fits:
        return NATIVE
    return TOGETHER if parts >= 2 else REFERENCE


class Routes:
    """One buffer's draw and insert implementations, and which of them may run.

    Public contract: ``draw_fits(storage)`` is ``choose_draw``'s storage facts (fixed for a
    storage's life: a migration swaps the storage, a lost shard's replacement keeps its kind);
    ``draws`` and ``inserts`` count the calls the buffer's dispatchers sent to each route (a
    workload whose draws go to the reference where a pooled route was expected shows it here; a
    data plane that stores a lone encoded rollout with ``add_encoded`` directly is not counted;
    counted without a lock, so exact for one caller at a time); ``fast = False`` sends every
    call to the reference (differential tests, benchmarks of a route, and isolating a suspected
    bug in a faster route)."""

    def __init__(self, rows: Callable[..., Any], windows: Callable[..., Any], inline_insert: Callable[..., Any],
                 row_fits: Callable[[Any], bool], window_fits: Callable[[Any], bool]) -> None:
        self.rows, self.windows, self.inline_insert = rows, windows, inline_insert
        self._row_fits, self._window_fits = row_fits, window_fits
        self.fast = True
        self.draws = dict.fromkeys(DRAW_ROUTES, 0)      # route -> draws it carried out
        self.inserts = dict.fromkeys(INSERT_ROUTES, 0)  # route -> insert calls it carried out
        self._fits = (None, (False, False))   # (storage, its draw_fits): one tuple, replaced whole

    def draw_fits(self, storage: Any) -> tuple[bool, bool]:
        known = self._fits
        if known[0] is storage:
            return known[1] if self.fast else (False, False)
        fits = (self.rows is not None and self._row_fits(storage),
                self.windows is not None and self._window_fits(storage))
        self._fits = (storage, fits)
        return fits if self.fast else (False, False)
