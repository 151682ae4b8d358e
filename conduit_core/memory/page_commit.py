"""A lazily mapped ring's pages committed ahead of its writer, off the writer's thread.

A frame pool's frames live in an anonymous mapping (``tiers.LazyHostSegment``) whose pages
are committed on first write. During a buffer's first pass over its ring, every
new frame lands on memory never written before, so the insert pays the page fault: on this
machine 0.09 ms per 2 MB huge page where the machine already backed the memory, and 16 ms
where it did not (memory new to the virtual machine). Inside RLlib's Qbert run that put the
frame pool's write at 0.016-0.30 ms per training step by run, against ~0.015 ms once the
pages exist.

``CommitAhead`` keeps the pages past the write position committed: once the writer comes
within half a window (``ahead`` bytes) of what was asked for, a short-lived thread commits up
to a window past the writer, a huge page per ``madvise(MADV_POPULATE_WRITE)`` call
(``_pages.populate_write``, GIL released), stopping between calls when closed. A populate
changes no byte (untouched pages of a private anonymous mapping are zero-filled, present ones
left as they are), so it may overlap the writer's own writes to the same pages. Nothing is
committed before the first write.

Committing ahead only saves time, so only one failure is the caller's business: ENOMEM, the
machine could not back the memory the writer is about to write, raised once by ``check``
before the insert that would write there changes anything (then committing ahead stops). Anything else (a kernel without the advice,
Linux < 5.14; a sandbox refusing it; no thread to be had) just stops committing ahead, and
pages fault on write as before (``supported`` turns False). A forked child does not commit
ahead (its copy of a running thread does not exist). The decision (which range next) is
``next_commit_range``, a pure function.
"""

from __future__ import annotations

import errno
import os
import threading
import weakref

import numpy as np

from ..errors import CapacityError

try:
    from .._native._pages import populate_write as _c_populate_write
except ImportError:  # pragma: no cover - no C compiler where it was installed: pages fault on write
    _c_populate_write = None

AHEAD_BYTES = 8 << 20    # the window: committed past the write position (RSS runs up to this ahead of the writes)
CHUNK_BYTES = 2 << 20    # one populate call per huge page; the calls start on its boundaries

_LIVE: weakref.WeakSet = weakref.WeakSet()


def next_commit_range(written: int, requested: int, total: int, *, ahead: int) -> tuple[int, int] | None:
    """The byte range to commit next, or None. Asked for once the writer (at ``written``) is
    within half the window of what was asked for so far (``requested``): from there (or from the
    writer, if it ran past) to one window past the writer, never past ``total``. So the pages
    committed ahead of the writer stay between half a window and a window."""
    if requested >= total or written + ahead // 2 < requested:
        return None
    start, stop = max(written, requested), min(total, written + ahead)
    return (start, stop) if start < stop else None


class CommitAhead:
    """Commits ``mapping``'s first ``total`` bytes ahead of a writer that fills them in order
    once (a ring's first pass); ``note_written(upto)`` after each write."""

    def __init__(self, mapping, total: int, *, name: str, ahead: int | None = None, chunk: int | None = None):
        self.total, self.name = int(total), name
        self.ahead = int(AHEAD_BYTES if ahead is None else ahead)
        self.chunk = int(CHUNK_BYTES if chunk is None else chunk)
        self.supported = _c_populate_write is not None
        self.committed = 0                 # committed up to here, as far as the thread got
        self._mapping = mapping
        self._base = _address_of(mapping) % self.chunk   # chunks end on huge-page boundaries of memory
        self._requested = 0                # asked for up to here (the writer's side)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: OSError | None = None
        self._refused = 0                  # where the refused range began
        _LIVE.add(self)

    def note_written(self, upto: int) -> None:
        """The writer wrote every byte below ``upto``: commit the next range if it is near.
        Never raises: committing ahead only saves time."""
        if not self.supported or upto + self.ahead // 2 < self._requested or self._requested >= self.total:
            return
        if self._thread is not None:
            if self._thread.is_alive():    # still committing the last range: asked again at the next write
                return
            self._thread.join()
            self._thread = None
        rng = next_commit_range(upto, self._requested, self.total, ahead=self.ahead)
        if rng is None or self._error is not None or self._stop.is_set():
            return
        thread = threading.Thread(target=self._commit, args=rng, name=f"conduit-commit-{self.name}", daemon=True)
        try:
            thread.start()
        except RuntimeError:   # no thread to be had (a process limit, interpreter shutdown): fault on write
            self.supported = False
            return
        self._thread, self._requested = thread, rng[1]

    def wrote_through(self, upto: int) -> None:
        """The writer wrote every byte below ``upto`` in one go (a restore): those pages are
        committed; committing ahead goes on from there. A refusal above ``upto`` stays pending."""
        upto = min(int(upto), self.total)
        self._requested = max(self._requested, upto)
        self.committed = max(self.committed, upto)
        if self._error is not None and self._refused < upto:   # below what was just written: moot
            self._error = None

    def _commit(self, start: int, stop: int) -> None:
        lo = start
        try:
            while lo < stop and not self._stop.is_set():
                hi = min(stop, ((self._base + lo) // self.chunk + 1) * self.chunk - self._base)   # a huge page's end
                err = _c_populate_write(self._mapping, lo, hi - lo)
                if err == errno.ENOMEM:
                    self._refused, self._error = lo, OSError(err, os.strerror(err))
                    return
                if err:   # the advice unknown or refused here: pages fault on write, as without this
                    self.supported = False
                    return
                self.committed = hi
                lo = hi
        except Exception:   # (a mapping gone under it): committing ahead stops, pages fault on write
            self.supported = False

    def check(self, written: int, upto: int) -> None:
        """Before an insert that writes bytes [``written``, ``upto``) changes anything: raise a
        refused commit once that insert would write into the refused range; one below it goes
        ahead and the refusal stays pending; once the writer is past it, it is moot (the next
        write asks again from there). Once raised, committing ahead stops for good: the machine
        is short of memory, and the writes fault their pages in as without it."""
        if self._error is None or (written <= self._refused and upto <= self._refused):
            return
        error, self._error = self._error, None
        self._requested = max(self._refused, min(written, self.total))
        if written > self._refused:   # the writer's own faults got those pages since: moot
            return
        self.supported = False
        raise CapacityError(
                f"{self.name}: the machine could not commit memory for the buffer's next pages (from byte "
                f"{self._refused} of {self.total}: {error}). Nothing of this insert was stored; a retry "
                "stores it, its pages faulted in as it writes (committing ahead is off from here). Fix: lower the "
                "buffer's capacity (or frame budget), or free memory on this machine") from error

    def wait(self) -> None:
        """Until the range asked for so far is committed (or committing stopped)."""
        thread = self._thread
        if thread is not None:
            thread.join()

    def close(self) -> None:
        """Stop after the populate call in progress and join the thread."""
        self._stop.set()
        self.wait()
        self._thread = None
        self._mapping = None

    def after_fork_in_child(self) -> None:
        """In a forked child: the parent's committing thread does not exist here; stop."""
        self._thread = None
        self.supported = False
        self._error = None


def _address_of(mapping) -> int:
    """The mapping's first byte's address (a numpy view made and dropped: no export left)."""
    view = np.frombuffer(mapping, dtype=np.uint8, count=1)
    try:
        return int(view.__array_interface__["data"][0])
    finally:
        del view


def _reset_in_child() -> None:
    for c in list(_LIVE):
        c.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
