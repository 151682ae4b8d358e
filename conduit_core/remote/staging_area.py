"""The staging side of a shard's actor: rollouts that writers at the source staged under
(writer id, ticket), the slices another actor or the driver pulls, and the copy into the actor's
own storage once the buffer commits them (``conduit_core.source`` is the writers' side)."""

from __future__ import annotations

import threading

from ..errors import ConfigError
from .wire import join_reply, reply_layout

RETIRED = "retired"         # a stage's answer for a writer the buffer retired
PULL_FAILED = "failed"      # a pull's status when it failed for a reason other than lost rows
STAGING_GROUP = "staging"   # the actor's concurrency group for staging calls (another thread than its storage's)


class TicketSet:
    """Tickets of one writer, kept as 'every ticket below ``low``' plus the ones above it."""

    def __init__(self):
        self.low, self.above = 0, set()

    def __contains__(self, ticket: int) -> bool:
        return ticket < self.low or ticket in self.above

    def add(self, ticket: int) -> None:
        self.above.add(ticket)
        while self.low in self.above:
            self.above.discard(self.low)
            self.low += 1


class StagingArea:
    """The staging side of a shard actor: rows staged under (writer, ticket), pieces of them
    pulled in from another actor, and the copy into ``self.storage``. Staging calls run in the
    actor's ``STAGING_GROUP`` thread, storage calls in its default one: an actor that waits for
    another's staged rows never blocks that one's own pull (no cycle can deadlock)."""

    def init_staging(self) -> None:
        self.staging_lock = threading.Lock()
        # key -> [(first row, n, columns, pulled)]: the rollout as staged here (pulled False), or pieces
        # of it pulled from the actor that staged it (dropped once written)
        self.staged: dict[tuple[str, int], list[tuple[int, int, dict, bool]]] = {}
        self.released: dict[str, TicketSet] = {}
        self.retired: set[str] = set()   # writers the buffer replaced: nothing of theirs is staged again

    def stage(self, writer: str, ticket: int, n: int, names: list[str], *pieces) -> str:
        """Hold ``n`` encoded rows under (writer, ticket); again for the same key changes nothing."""
        key = (writer, int(ticket))
        with self.staging_lock:
            if writer in self.retired:
                return RETIRED
            if key[1] in self.released.get(writer, ()):
                return "committed"
            if key in self.staged:
                held = self.staged[key][0][1]
                if held != n:
                    raise ConfigError("ticket", f"{held} rows as first staged under writer {writer[:8]} ticket {ticket}",
                                      n, "give each process its own writer (ExperienceBuffer.writer)")
                return "again"
            self.staged[key] = [(0, n, join_reply(reply_layout(self.storage.spec, names, n), list(pieces)), False)]
            return "staged"

    def find_staged(self, writer: str, ticket: int, first: int, n: int) -> dict | None:
        with self.staging_lock:
            for off, m, cols, _ in self.staged.get((writer, int(ticket)), ()):
                if off <= first and first + n <= off + m:
                    return {name: c[first - off: first - off + n] for name, c in cols.items()}
        return None

    def staged_slice(self, writer: str, ticket: int, first: int, n: int, names: list[str]):
        """Rows ``first .. first+n`` of a staged rollout, cut as ``reply_layout`` cuts them
        (call with ``num_returns`` = the layout's length)."""
        cols = self.find_staged(writer, ticket, first, n)
        if cols is None:
            raise KeyError(f"rows {first}..{first + n} of writer {writer[:8]} ticket {ticket} are not staged here")
        out = [cols[name][a:b] for name, cuts in reply_layout(self.storage.spec, names, n) for a, b in cuts]
        return tuple(out) if len(out) > 1 else out[0]

    def pull_staged(self, writer: str, ticket: int, first: int, n: int, src) -> str:
        """Make rows ``first .. first+n`` of (writer, ticket) local: already here (this actor
        staged them), or pulled from ``src``, actor to actor. 'ok', or why not."""
        if self.find_staged(writer, ticket, first, n) is not None:
            return "ok"
        import ray

        names = list(self.storage.spec.names)
        layout = reply_layout(self.storage.spec, names, n)
        k = sum(len(p) for _, p in layout)
        try:
            refs = src.staged_slice.options(num_returns=k, concurrency_group=STAGING_GROUP).remote(
                writer, ticket, first, n, names)
            values = ray.get(refs if k > 1 else [refs])
            piece = join_reply(layout, values)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            return f"lost: {type(exc).__name__}: {exc}"
        except ray.exceptions.RayTaskError as exc:
            return f"missing: {exc}"
        except Exception as exc:  # noqa: BLE001 - any other failure is an answer too: a release that
            # waits on this call (passed as its argument) would otherwise fail unrun, its rows staying
            return f"{PULL_FAILED}: {type(exc).__name__}: {exc}"
        with self.staging_lock:
            self.staged.setdefault((writer, int(ticket)), []).append((first, n, piece, True))
        return "ok"

    def write_staged(self, start: int, writer: str, ticket: int, first: int, n: int, src) -> str:
        """Store rows ``first .. first+n`` of (writer, ticket) at local slots ``start ..``:
        a copy from this actor's staging (pulled from ``src`` first if not here)."""
        status = self.pull_staged(writer, ticket, first, n, src)
        if status != "ok":
            return status
        self.storage.write(start, self.find_staged(writer, ticket, first, n), n)
        with self.staging_lock:   # a piece pulled for this write is done with (a rollout staged here stays)
            parts = self.staged.get((writer, int(ticket)), [])
            parts[:] = [p for p in parts if not (p[3] and p[0] == first and p[1] == n)]
            if not parts:
                self.staged.pop((writer, int(ticket)), None)
        return "ok"

    def release(self, keys: list[tuple[str, int]], *after) -> None:
        """The buffer took these rollouts: drop their rows; staging them again does nothing.
        ``after``: pull calls the caller began here (Ray runs this once they are done)."""
        with self.staging_lock:
            for writer, ticket in keys:
                self.staged.pop((writer, int(ticket)), None)
                self.released.setdefault(writer, TicketSet()).add(int(ticket))

    def retire_writer(self, writer: str) -> int:
        """Drop every rollout ``writer`` staged here and refuse its later stages (its rollouts
        nobody will commit: results its caller dropped); returns how many were dropped."""
        with self.staging_lock:
            keys = [k for k, parts in self.staged.items() if k[0] == writer and not parts[0][3]]
            for k in keys:
                del self.staged[k]
            self.retired.add(writer)
        return len(keys)

    def staging_stats(self) -> dict[str, int]:
        with self.staging_lock:
            return {"rollouts": len(self.staged),
                    "bytes": sum(c.nbytes for parts in self.staged.values() for _, _, cols, _ in parts
                                 for c in cols.values())}
