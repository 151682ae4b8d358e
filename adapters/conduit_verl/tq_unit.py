"""One storage unit of Conduit's TransferQueue backend (``tq_backend`` runs it as a Ray actor):
a ``RaggedStore`` with the calls a client makes, by the Ray-object path (``put``/``get``: the
bytes travel in the call) or, for a client on its node, the shared-memory path (``reserve``,
``commit_put``/``abort_put``, ``locate``: the bytes go through its arenas, see ``tq_shared_path``),
and a checkpoint's ``save``/``stage``/``commit``/``finish``/``rollback``/``abort``."""

from __future__ import annotations

import os
import pickle
import time
from collections import OrderedDict, deque

import numpy as np
import ray

from conduit_core.kv import shared_arena
from conduit_core.errors import ConfigError
from conduit_core.kv.ragged import Column, Located, RaggedStore

from .put_undo import put_undo, restore_put

STATE_VERSION = 1   # of a unit's checkpoint file
# a reserved put not committed or aborted within this long is aborted (its client died or was
# cancelled between the two calls): otherwise its pins keep a whole released arena open for good
TICKET_TTL_S = 600.0
# puts a unit remembers the undo of, for a ``revoke`` queued behind a put its client stopped waiting
# for (one that replaced more than REVOKE_BYTES of values, or any object values, is not remembered:
# its revoke answers 'forgotten', as does one whose undo was dropped for newer ones)
RECENT_PUTS, REVOKE_BYTES, FORGOTTEN = 64, 8 << 20, 4096


class StorageUnit:
    """One shard of the store: a RaggedStore behind a Ray actor (one call per batch, any node).
    With ``shm_prefix`` its arenas are shared-memory segments ``<shm_prefix>-<n>`` that clients on
    its node read and write directly (``reserve``/``commit_put``/``abort_put``, ``locate``); the unit stays
    the one authority on which bytes are which row's."""

    def __init__(self, slots: int = 1024, shm_prefix: str | None = None):
        self.arenas = shared_arena.SharedArenas(shm_prefix) if shm_prefix else None
        self.prefix = shm_prefix
        self.store = RaggedStore(slots=slots, arenas=self.arenas)
        self._staged: RaggedStore | None = None   # a checkpoint read aside, until every unit has one
        self._previous: RaggedStore | None = None  # the rows before a load, until every unit switched
        self._tickets: dict[int, dict] = {}         # puts reserved, not yet committed or aborted
        self._next_ticket = 0
        self._writes = 0                            # puts, restores and clears so far
        self._recent_writes: deque = deque(maxlen=4 * RECENT_PUTS)   # (write number, keys) of the latest
        self._undo_of: OrderedDict = OrderedDict()  # a put's call id -> (write number, keys, undo)
        self._forgotten: OrderedDict = OrderedDict()  # call ids of stored puts whose undo was dropped

    def where(self) -> tuple[str, str | None]:
        """This unit's node id, and its segments' prefix (None: no shared memory)."""
        return ray.get_runtime_context().get_node_id(), self.prefix

    # ------------------------------------------------------- the same-node path (tq_shared_path)
    def reserve(self, keys: np.ndarray, columns: dict[str, Column]) -> dict:
        """Room for a put's tensor bytes (columns carry sizes, no bytes), checked as ``put`` checks;
        the client writes them, then ``commit_put`` (or ``abort_put``). Pins the segments the room lies in."""
        room = {n: c if c.kind == "object" else Column(c.kind, np.broadcast_to(np.zeros(1, np.uint8), (int(c.nbytes.sum()),)),
                                                        c.nbytes, c.lengths, c.dtype, c.inner, c.scalar)
                for n, c in columns.items()}
        self._expire_tickets()
        placed, created = self.store.reserve(keys, room)
        for arena, _ in placed.values():
            self.arenas.pin(arena)
        ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
        self._tickets[ticket] = {"keys": keys, "columns": columns, "placed": placed, "created": created,
                                 "at": time.monotonic()}
        return {"ticket": ticket, "segments": self.arenas.handles(),
                "room": {n: (self.arenas.handle(a), at) for n, (a, at) in placed.items()}}

    def commit_put(self, ticket: int, call: str | None = None) -> dict:
        """Record a reserved put's rows on the bytes the client wrote (in place; copied if the
        field's arena moved since); returns what undoes it, as ``put`` does (``call``: as for ``put``)."""
        t = self._take(ticket)
        try:
            columns = dict(t["columns"])
            for name, (arena, at) in t["placed"].items():
                c = columns[name]
                columns[name] = Column("tensor", arena[at:at + int(c.nbytes.sum())], c.nbytes, c.lengths,
                                       c.dtype, c.inner, c.scalar)
            undo = put_undo(self.store, t["keys"], columns)
            undo["created"] = [*undo["created"], *t["created"]]
            self.store.put(t["keys"], columns)
            self._wrote(t["keys"], call, undo)
            return undo
        except BaseException:
            self._drop_created(t["created"])
            raise
        finally:
            self._unpin(t)

    def abort_put(self, ticket: int, *, expired: bool = False) -> None:
        """Forget a reserved put (its room stays dead bytes; fields it created leave). ``expired``:
        its client may still be writing (stalled past the TTL), so the segments holding its room are
        never reused for other rows once released (they are closed)."""
        t = self._tickets.pop(ticket, None)
        if t is not None:
            self._drop_created(t["created"])
            self._unpin(t, reuse=not expired)

    def locate(self, keys: np.ndarray, fields: list[str]) -> dict:
        """Where the rows of ``fields`` lie (segment, starts, sizes; objects as values): a get's answer
        on the same-node path, a few bytes per row."""
        out = {}
        for name, at in self.store.locate(keys, fields).items():
            out[name] = at if not isinstance(at, Located) else {
                "segment": self.arenas.handle(at.arena), "generation": self.arenas.generation(at.arena),
                "starts": at.starts, "nbytes": at.nbytes,
                "lengths": at.lengths, "dtype": at.dtype, "inner": at.inner, "scalar": at.scalar}
        return {"fields": out, "segments": self.arenas.handles()}

    def close(self) -> int:
        """Close every shared segment (before the unit is killed); returns how many there were."""
        if self.arenas is None:
            return 0
        n = len(self.arenas.handles())   # in use, pinned and kept for reuse
        self._tickets.clear()
        self.arenas.close()
        # the arrays over the segments go too: a mapping lasts as long as an array views it
        self.store, self._staged, self._previous, self.arenas, self.prefix = RaggedStore(), None, None, None, None
        return n

    def _expire_tickets(self) -> None:
        now = time.monotonic()
        for ticket in [t for t, v in self._tickets.items() if now - v["at"] > TICKET_TTL_S]:
            self.abort_put(ticket, expired=True)

    def _take(self, ticket: int) -> dict:
        try:
            return self._tickets.pop(ticket)
        except KeyError:
            raise ConfigError("ticket", "a put reserved on this unit and not yet committed or aborted", ticket,
                              "put again (the unit restarted, or the put was aborted)") from None

    def _unpin(self, t: dict, *, reuse: bool = True) -> None:
        for arena, _ in t["placed"].values():
            self.arenas.unpin(arena, reuse=reuse)

    def _drop_created(self, fields: list[str]) -> None:
        for name in fields:
            try:
                self.store.drop_field(name)
            except ConfigError:        # rows hold it now (another put's): it stays theirs
                pass

    # ------------------------------------------------------------------ the Ray-object path

    def put(self, keys: np.ndarray, columns: dict[str, Column], call: str | None = None) -> dict:
        """Store the rows; returns what undoes it (``restore``): a put spread over several units
        is all or nothing, so the units that took their part give it back when another refused.
        ``call``: the client's id for this put, for a ``revoke`` if it stops waiting for the answer."""
        undo = put_undo(self.store, keys, columns)
        self.store.put(keys, columns)
        self._wrote(keys, call, undo)
        return undo

    def restore(self, undo: dict) -> int:
        """Undo a ``put``: its new rows leave, fields it set are unset, values it replaced return."""
        restore_put(self.store, undo)
        self._wrote(np.concatenate([undo["new"], *(np.concatenate(f[:2]) for f in undo["fields"].values())]),
                    None, None)
        return len(self.store)

    def revoke(self, call: str) -> str:
        """Give back put ``call``, which its client stopped waiting for (it did not answer in time):
        the client queues this call right behind the put, and a unit runs one caller's calls in order,
        so it runs after the put. 'revoked': done; 'kept': a later put, restore or clear touched the
        same rows, which are then theirs (undoing it would undo that); 'forgotten': the put was stored
        but what undoes it is no longer known (dropped for newer puts, too large, a checkpoint loaded
        or rolled back since, or more writes since than the unit remembers): its rows stay; 'unknown':
        no such put was stored here (it failed)."""
        rec = self._undo_of.pop(call, None)
        if rec is None:
            return "forgotten" if self._forgotten.pop(call, None) is not None else "unknown"
        at, keys, undo = rec
        later = [k for n, k in self._recent_writes if n > at]
        oldest = self._recent_writes[0][0] if self._recent_writes else at + 1
        if oldest > at + 1:
            return "forgotten"
        if any(np.intersect1d(k, keys).size for k in later):
            return "kept"
        restore_put(self.store, undo)
        self._wrote(keys, None, None)
        return "revoked"

    def _wrote(self, keys: np.ndarray, call: str | None, undo: dict | None) -> None:
        """Note a write of ``keys`` (for ``revoke``), with the undo of put ``call`` if it has one."""
        self._writes += 1
        keys = np.array(keys, dtype=np.int64).reshape(-1)   # (a copy: never a view of a call's argument)
        self._recent_writes.append((self._writes, keys))
        if call is not None and undo is not None:
            replaced = [v for _, _, v in undo["fields"].values() if v is not None]
            if all(v.kind != "object" for v in replaced) and sum(int(v.data.nbytes) for v in replaced) <= REVOKE_BYTES:
                self._undo_of[call] = (self._writes, keys, undo)
                while len(self._undo_of) > RECENT_PUTS:
                    self._forget(self._undo_of.popitem(last=False)[0])
            else:
                self._forget(call)

    def _forget(self, *calls) -> None:
        for call in calls:
            self._forgotten[call] = True
        while len(self._forgotten) > FORGOTTEN:
            self._forgotten.popitem(last=False)

    def get(self, keys: np.ndarray, fields: list[str]) -> dict[str, Column]:
        return self.store.get(keys, fields)

    def clear(self, keys: np.ndarray) -> int:
        self._wrote(keys, None, None)
        return self.store.clear(keys)

    def stats(self) -> dict:
        return {"rows": len(self.store), "nbytes": self.store.nbytes(), "fields": self.store.fields,
                "tickets": len(self._tickets), "segments": self.arenas.handles(pooled=False) if self.arenas else [],
                "open_segments": self.arenas.handles() if self.arenas else []}

    def save(self, path: str) -> int:
        """Write every stored row to ``path`` (written aside, then renamed: never half a file)."""
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump({"schema_version": STATE_VERSION, "store": self.store.state()}, f,
                        protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
        return len(self.store)

    def stage(self, path: str) -> int:
        """Read what ``save`` wrote into a store held aside (the live one untouched): the first half
        of a load that every unit must pass before any unit commits."""
        with open(path, "rb") as f:
            saved = pickle.load(f)
        if not isinstance(saved, dict) or saved.get("schema_version") != STATE_VERSION:
            raise ConfigError(f"{path}", f"a Conduit unit file of schema version {STATE_VERSION}",
                              repr(saved.get("schema_version") if isinstance(saved, dict) else type(saved).__name__),
                              "load a checkpoint saved by this version of conduit_verl")
        self.finish()    # a load before this one whose client never finished it: final now, its old rows go
        if self._staged is not None:
            self._staged.release()
        self._staged = RaggedStore.from_state(saved["store"], arenas=self.arenas)
        return len(self._staged)

    def commit(self) -> int:
        """The second half of a load: the staged store becomes the live one. The old one is kept
        until ``finish`` (every unit switched) or put back by ``rollback`` (one did not)."""
        if self._staged is None:
            raise ConfigError("staged checkpoint", "a unit file read by stage()", "none (never staged, aborted, "
                              "or the unit restarted)", "load the checkpoint again")
        self._previous, self.store, self._staged = self.store, self._staged, None
        self._forget(*self._undo_of)   # (another store: the puts to revoke are not in it)
        self._undo_of.clear()
        return len(self.store)

    def finish(self) -> None:
        """Every unit switched: the rows held before the load (and their arenas) go."""
        old, self._previous = self._previous, None
        if old is not None:
            old.release()

    def rollback(self) -> int:
        """A load that failed on another unit: back to the rows held before it (whichever half this
        unit reached), the loaded ones dropped."""
        self.abort()
        if self._previous is not None:
            loaded, self.store, self._previous = self.store, self._previous, None
            loaded.release()
            self._forget(*self._undo_of)   # (the rows of puts before the load are back, their undo gone)
            self._undo_of.clear()
        return len(self.store)

    def abort(self) -> None:
        if self._staged is not None:
            self._staged.release()
        self._staged = None
