"""The same-node path of ``tq_backend``: a client on a storage unit's node moves the bytes through
the unit's shared arenas (``conduit_core.kv.shared_arena``), the Ray actor calls carry only keys,
offsets and lengths.

    put:  unit.reserve(keys, sizes) -> (segment, offset) per field   one small call per unit
          client copies each field's rows into the segment            the one copy of a put
          unit.commit_put(ticket) -> undo                                rows recorded in place
    get:  unit.locate(keys, fields) -> (segment, starts, lengths)     one small call per unit
          client copies the rows into the batch's own arrays          the one copy of a get

Reserve and commit are two calls, not one, because the bytes must be in the segment before the
unit records rows on them (a reader must never see a row whose bytes are not written yet), and
the unit, not the client, decides where they go (it alone knows the arena's end). A put that
fails before its commits aborts every ticket (the room becomes dead bytes, fields the reserve
created leave); a commit that fails is undone on the other units as on the Ray-object path.

A get is safe against any put, clear or compaction racing it: located bytes are never written
again while their segment is the field's arena, and a segment released and reused since has a
new generation, checked after the copy (see ``shared_arena``); when a segment was closed or
reused between the unit's answer and the end of the copy, the get asks again. Units on another node, or all units
with ``shared_memory=false``, take the Ray-object path (``unit.put`` / ``unit.get``); both paths
assemble a get through ``assemble`` (one copy into the returned arrays).
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from typing import Any, Awaitable, Callable

import numpy as np

from conduit_core.kv.ragged import Column, copy_segments, gather_segments

GET_ATTEMPTS = 4   # a get re-asks when a segment went between the unit's answer and the open

# how long a put or a load cancelled while its units work waits for their answers before it
# gives up with an error (their state then unknown) instead of hanging on a stuck unit
CANCEL_GRACE_S = 120.0


# how long any call to a storage unit may take before it counts as failed (TQ's SimpleStorage gives
# a unit 200 s too: TQ_SIMPLE_STORAGE_SEND_RECV_TIMEOUT); a stuck unit must not hang the trainer
UNIT_CALL_TIMEOUT_S = float(os.environ.get("CONDUIT_TQ_UNIT_TIMEOUT_S", 200))


class UnitTimeout(RuntimeError):
    """A storage unit did not answer a call in time: what it did with the call is unknown."""


UNIT_LIMIT = "unit-limit"   # wait_all's default: UNIT_CALL_TIMEOUT_S, read when the wait starts


async def wait_all(refs, *, limit_s: float | None | str = UNIT_LIMIT) -> list:
    """Each call's result or exception, in order; a call not answered within ``limit_s`` (default
    ``UNIT_CALL_TIMEOUT_S``; None: no limit, for checkpoints, whose size sets their time) gets a
    ``UnitTimeout`` in its place (the operation then fails or is undone as for any failed unit; the
    call itself goes on in the unit, so what it stored stays unknown, as the error says)."""
    futures = [asyncio.wrap_future(r.future()) for r in refs]
    if not futures:
        return []
    limit = UNIT_CALL_TIMEOUT_S if limit_s == UNIT_LIMIT else limit_s
    _, pending = await asyncio.wait(futures, timeout=limit)
    out = []
    for f in futures:
        if f in pending:
            f.cancel()   # this wait's own future only: the call itself goes on in the unit
            out.append(UnitTimeout(
                f"a storage unit did not answer within {limit:.0f} s (a stuck or overloaded actor?): what it did "
                "with this call is unknown. Fix: check the unit, then clear the keys or restart TransferQueue; "
                "CONDUIT_TQ_UNIT_TIMEOUT_S sets the limit"))
        elif f.cancelled():
            out.append(asyncio.CancelledError())
        else:
            out.append(f.exception() or f.result())
    return out


async def through_cancel(start: Callable[[], Awaitable], *, again: bool = True,
                         grace_s: float | None = None) -> tuple[Any, bool]:
    """The outcome of ``start()``'s work, waited for through any cancel of this coroutine, and
    whether one came: a cancel stops neither the units (they act on calls already sent) nor TQ's
    controller, so what the work did, not the cancel, decides what the caller must undo before it
    lets the cancel through. Once cancelled, the wait lasts ``grace_s`` more at most (then a
    RuntimeError: what the units did is unknown). Where the event loop itself cancels the work
    (it shuts down), ``start()`` is called again when ``again`` (asking a Ray call's outcome twice
    is harmless), else the cancel goes through."""
    grace_s = CANCEL_GRACE_S if grace_s is None else grace_s
    task, cancelled, deadline = asyncio.ensure_future(start()), False, None
    while True:
        try:
            if deadline is None:
                return await asyncio.shield(task), cancelled
            done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                raise RuntimeError(f"cancelled, and the storage units had not answered {grace_s:.0f} s later: what "
                                   "they stored of this call is unknown. Fix: check the units (a stuck actor?), "
                                   "then clear the keys or restart TransferQueue")
            return task.result(), cancelled
        except asyncio.CancelledError:
            cancelled = True
            deadline = deadline if deadline is not None else time.monotonic() + grace_s
            if task.cancelled():
                if not again:
                    raise
                task = asyncio.ensure_future(start())


async def settled(refs, **kw) -> tuple[list, bool]:
    """Every call's outcome (its result or its exception), waited for through a cancel
    (``through_cancel``), and whether one came."""
    return await through_cancel(lambda: wait_all(refs), **kw)


def sizes_only(col: Column, pos: np.ndarray | None) -> Column:
    """What a reserve sends for a field: a tensor column's per-row sizes (no bytes), an object
    column whole (its values go through Ray in any case)."""
    if col.kind == "object":
        return col if pos is None else Column("object", col.data[pos])
    nbytes, lengths = (col.nbytes, col.lengths) if pos is None else (col.nbytes[pos], col.lengths[pos])
    return Column("tensor", np.empty(0, np.uint8), nbytes, lengths, col.dtype, col.inner, col.scalar)


async def reserve_and_write(units, maps, prefixes, routes, columns, shared) -> dict[int, int]:
    """Reserve room on every shared unit of ``routes``, write each unit's rows into it; returns
    {route index: ticket}. If anything fails, every ticket is aborted and the error raised:
    nothing of the put is stored."""
    multi = len(routes) > 1
    todo = [i for i, (u, _, _) in enumerate(routes) if shared[u]]
    if not todo:
        return {}
    refs = [units[routes[i][0]].reserve.remote(routes[i][2], {n: sizes_only(c, routes[i][1] if multi else None)
                                                               for n, c in columns.items()}) for i in todo]
    try:
        answers = await wait_all(refs)
    except BaseException:   # cancelled (a timeout) while the units reserve: they reserve regardless, and
        # a ticket never committed or aborted pins its segment in the unit for good; abort each once answered
        asyncio.ensure_future(_abort_when_answered(units, routes, todo, refs))
        raise
    tickets = {i: a["ticket"] for i, a in zip(todo, answers) if not isinstance(a, BaseException)}
    try:
        failed = [a for a in answers if isinstance(a, BaseException)]
        if failed:
            raise failed[0]
        _write(maps, prefixes, routes, columns, todo, answers)
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)   # views of the segments die now, not with the error
        await wait_all([units[routes[i][0]].abort_put.remote(t) for i, t in tickets.items()])
        raise
    return tickets


async def _abort_when_answered(units, routes, todo, refs) -> None:
    answers = await wait_all(refs, limit_s=None)
    await wait_all([units[routes[i][0]].abort_put.remote(a["ticket"]) for i, a in zip(todo, answers)
                 if not isinstance(a, BaseException)])


def _write(maps, prefixes, routes, columns, todo, answers) -> None:
    """Each unit's rows of each field into the room it reserved: the put's one copy."""
    multi = len(routes) > 1
    starts = {n: np.cumsum(c.nbytes) - c.nbytes for n, c in columns.items() if c.kind == "tensor" and multi}
    with maps.lock:
        for i, answer in zip(todo, answers):
            u, pos, _ = routes[i]
            for name, (segment, at) in answer["room"].items():
                col = columns[name]
                seg = maps.arena(segment)
                if multi:
                    need = int(col.nbytes[pos].sum())
                    gather_segments(col.data, starts[name][pos], col.nbytes[pos], out=seg[at:at + need])
                else:
                    seg[at:at + col.data.size] = col.data
                del seg
            maps.keep_only(prefixes[u], answer["segments"])


async def locate_parts(units, routes, fields, shared) -> list:
    """Each route's part of a get: from a shared unit where its rows lie, from any other the rows."""
    refs = [units[u].locate.remote(keys, fields) if shared[u] else units[u].get.remote(keys, fields)
            for u, _, keys in routes]
    parts = await wait_all(refs)
    for p in parts:
        if isinstance(p, BaseException):
            raise p
    return parts


def assemble(parts, routes, fields, rows: int, maps, prefixes, shared) -> dict[str, Column]:
    """One Column per field, rows in the batch's order, copied once out of the units' segments
    (shared) or the arrays Ray delivered (the other path). ``FileNotFoundError`` (``SegmentGone``
    among them): a segment was closed or reused since its unit answered; ask again."""
    try:
        return _assemble(parts, routes, fields, rows, maps, prefixes, shared)
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)   # views of the segments die now, not with the error
        raise


def _layout(part) -> tuple:
    """A unit's part of a tensor field: (dtype, inner shape, scalar), from a Column or a shared-memory part."""
    if isinstance(part, Column):
        return part.dtype, tuple(part.inner), part.scalar
    return part["dtype"], tuple(part["inner"]), part["scalar"]


def _assemble(parts, routes, fields, rows: int, maps, prefixes, shared) -> dict[str, Column]:
    multi = len(routes) > 1
    out = {}
    with maps.lock:
        for name in fields:
            first = parts[0][name] if not shared[routes[0][0]] else parts[0]["fields"][name]
            got = [p["fields"][name] if shared[u] else p[name] for (u, _, _), p in zip(routes, parts)]
            kinds = {"object" if isinstance(g, Column) and g.kind == "object" else "tensor" for g in got}
            if len(kinds) > 1:   # (one unit holds the field as objects, another as tensor rows)
                from conduit_core import ConfigError
                raise ConfigError(f"field {name!r}", "one kind on every storage unit", "objects on some units "
                                  "and tensor rows on others", "put this field with one dtype and row shape")
            if isinstance(first, Column) and first.kind == "object":
                data = np.concatenate([g.data for g in got]) if multi else got[0].data
                if multi:
                    data = data[np.argsort(np.concatenate([pos for _, pos, _ in routes]), kind="stable")]
                out[name] = Column("object", data)
                continue
            nbytes = np.empty(rows, np.int64)
            lengths = np.empty(rows, np.int64)
            for (_, pos, _), g in zip(routes, got):
                nbytes[pos], lengths[pos] = (g.nbytes, g.lengths) if isinstance(g, Column) else (g["nbytes"], g["lengths"])
            dst = np.empty(int(nbytes.sum()), np.uint8)
            dst_starts = np.cumsum(nbytes) - nbytes
            for (u, pos, _), g in zip(routes, got):
                if isinstance(g, Column):      # the Ray-object path: its rows back to back
                    src, src_starts, lens = g.data, np.cumsum(g.nbytes) - g.nbytes, g.nbytes
                else:
                    src, src_starts, lens = maps.arena(g["segment"]), g["starts"], g["nbytes"]
                if not multi and not isinstance(g, Column):
                    gather_segments(src, src_starts, lens, out=dst)
                else:
                    copy_segments(src, src_starts, lens, dst, dst_starts[pos])
                del src
                if not isinstance(g, Column):   # were they still those rows? (SegmentGone: ask again)
                    maps.check(g["segment"], g["generation"])
            dtype, inner, scalar = _layout(first)
            if multi:   # each unit checks its own puts only: rows of one field stored otherwise elsewhere
                for (u, _, _), g in zip(routes, got):
                    if _layout(g) != (dtype, inner, scalar):
                        from conduit_core import ConfigError
                        raise ConfigError(f"field {name!r}", f"one dtype and row shape on every storage unit "
                                          f"({dtype}, inner shape {inner} on unit {routes[0][0]})",
                                          f"{_layout(g)[0]}, inner shape {_layout(g)[1]} on unit {u}",
                                          "put this field with one dtype and row shape in every put")
            out[name] = Column("tensor", dst, nbytes, lengths, dtype, inner, scalar)
        for (u, _, _), p in zip(routes, parts):
            if shared[u]:
                maps.keep_only(prefixes[u], p["segments"])
    return out
