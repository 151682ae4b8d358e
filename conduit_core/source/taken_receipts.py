"""Which receipts of the writers at the source a buffer took: each (writer, ticket) once.

A writer numbers its receipts 0, 1, 2, ... (``SourceWriter.write``), and they are committed about
in that order, so the set is kept per writer as a floor (every ticket below it was taken) and the
few tickets above it taken out of order. Its size, in memory and in every checkpoint, is a few
ints per writer however long the run; keeping every key (as before) grew with every receipt. A
ticket never committed nor declined keeps the writer's later tickets listed until it is.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class TakenReceipts:
    """A set of (writer id, ticket) keys: ``key in taken``, ``taken.add(key)``, ``len(taken)``."""

    __slots__ = ("floors", "above")

    def __init__(self) -> None:
        self.floors: dict[str, int] = {}        # writer -> every ticket below it taken
        self.above: dict[str, set[int]] = {}    # writer -> tickets at or above its floor taken

    def __contains__(self, key) -> bool:
        writer, ticket = key
        return ticket < self.floors.get(writer, 0) or ticket in self.above.get(writer, ())

    def add(self, key) -> None:
        writer, ticket = key
        floor = self.floors.get(writer, 0)
        if ticket < floor:
            return
        if ticket != floor:
            self.above.setdefault(writer, set()).add(ticket)
            return
        out_of_order = self.above.get(writer)
        floor += 1
        while out_of_order and floor in out_of_order:
            out_of_order.discard(floor)
            floor += 1
        self.floors[writer] = floor
        if out_of_order is not None and not out_of_order:
            del self.above[writer]

    def missing_below(self, writer: str, ticket: int) -> list[int]:
        """The tickets of ``writer`` below ``ticket`` not taken (a few: the gaps above its floor)."""
        floor, above = self.floors.get(writer, 0), self.above.get(writer, ())
        return [t for t in range(floor, ticket) if t not in above]

    def __len__(self) -> int:
        return sum(self.floors.values()) + sum(len(t) for t in self.above.values())

    def state(self) -> dict:
        """Plain values: ``writers`` (ids), ``floors`` (one per writer), ``above`` ((writer index,
        ticket) rows)."""
        writers = sorted(set(self.floors) | set(self.above))
        index = {w: i for i, w in enumerate(writers)}
        rows = [(index[w], t) for w, tickets in self.above.items() for t in sorted(tickets)]
        return {"writers": writers, "floors": np.asarray([self.floors.get(w, 0) for w in writers], dtype=np.int64),
                "above": np.asarray(rows, dtype=np.int64).reshape(-1, 2)}

    @staticmethod
    def from_state(state: Mapping, bad) -> "TakenReceipts":
        """From ``state()``'s output, or from a ledger saved before this form (``committed``:
        (writer index, ticket, first seq) rows); ``bad(part, expected, got)`` makes the error."""
        writers = state.get("writers")
        if not isinstance(writers, (list, tuple)) or not all(isinstance(w, str) for w in writers):
            raise bad("writers", "a list of writer ids (str)", type(writers).__name__)
        if len(set(writers)) != len(writers):
            raise bad("writers", "distinct writer ids", f"{len(writers) - len(set(writers))} repeated")
        taken = TakenReceipts()
        if "floors" not in state:   # the earlier form: every key listed
            rows = _int_rows(state.get("committed"), 3, len(writers), bad, "committed",
                             f"(writer index < {len(writers)}, ticket >= 0, seq >= -1) int rows")
            if rows.size and rows[:, 2].min() < -1:
                raise bad("committed", "seq >= -1", int(rows[:, 2].min()))
            for w, t in rows[:, :2].tolist():
                taken.add((writers[w], t))
            return taken
        floors = _array(state.get("floors"), bad, "floors")
        if floors.shape != (len(writers),) or (floors.size and (floors.dtype.kind not in "iu" or floors.min() < 0)):
            raise bad("floors", f"{len(writers)} ints >= 0 (one per writer)", f"{floors.dtype} {floors.shape}")
        rows = _int_rows(state.get("above"), 2, len(writers), bad, "above",
                         f"(writer index < {len(writers)}, ticket >= 0) int rows")
        for w, floor in zip(writers, floors.tolist()):
            if floor:
                taken.floors[w] = floor
        for w, t in rows.tolist():
            if t < floors[w]:
                raise bad("above", f"tickets at or above their writer's floor ({int(floors[w])})", t)
            taken.add((writers[w], t))
        return taken


def _array(value, bad, part: str) -> np.ndarray:
    if value is None:
        raise bad(part, "present", "missing")
    try:
        return np.asarray(value)
    except ValueError as exc:   # ragged rows
        raise bad(part, "a rectangular int array", f"{type(value).__name__} ({exc})") from None


def _int_rows(value, width: int, writers: int, bad, part: str, expected: str) -> np.ndarray:
    rows = _array(value, bad, part)
    if rows.ndim != 2 or rows.shape[1] != width or (rows.size and (rows.dtype.kind not in "iu" or rows[:, :2].min() < 0
                                                                    or rows[:, 0].max() >= writers)):
        raise bad(part, expected, f"{rows.dtype} {rows.shape}")
    return rows.astype(np.int64, copy=False)
