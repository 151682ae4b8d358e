"""A lazily mapped ring's pages committed ahead of its writer, off the writer's thread.

A frame pool (and any host column from ``tiers.LAZY_THRESHOLD`` up) is an anonymous mapping
whose pages are committed on first write. During a buffer's first pass over its ring, every
new frame lands on memory never written before, so the insert pays the page fault: on this
machine 0.09 ms per 2 MB huge page where the machine already backed the memory, and 16 ms
where it did not (memory new to the virtual machine). Inside RLlib's Qbert run that put the
frame pool's write at 0.016-0.30 ms per training step by run, against ~0.015 ms once the
pages exist.

``CommitAhead`` keeps a window of ``ahead`` bytes past the write position committed: when the
writer comes within half of it, a short-lived thread commits the next range with
``madvise(MADV_POPULATE_WRITE)`` (``_pages.populate_write``, GIL released). A populate changes
no byte, so it may overlap the writer's own writes to the same pages. Where the kernel lacks
the advice (Linux < 5.14, other systems) nothing is committed ahead and pages fault on write
as before (``supported`` says which). Any other failure (the machine could not back the memory)
is raised by the next ``check`` (called before an insert changes anything). ``close`` joins the
thread. The decision (which range next) is ``next_commit_range``, a pure function.
"""

from __future__ import annotations

import errno
import os
import threading

from .errors import CapacityError

try:
    from ._pages import populate_write as _c_populate_write
except ImportError:  # pragma: no cover - no C compiler where it was installed: pages fault on write
    _c_populate_write = None

AHEAD_BYTES = 16 << 20   # kept committed past the write position
CHUNK_BYTES = 2 << 20    # one populate call per huge page (a failure stops at the chunk that failed)
_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)


def next_commit_range(written: int, requested: int, total: int, *, ahead: int) -> tuple[int, int] | None:
    """The byte range to commit next, or None: once the writer (at ``written``) is within half
    the window of what was asked for so far (``requested``), up to ``ahead`` past the writer,
    never past ``total``."""
    if requested >= total or written + ahead // 2 < requested:
        return None
    return requested, min(total, max(written, requested) + ahead)


class CommitAhead:
    """Commits ``mapping``'s first ``total`` bytes ahead of a writer that fills them in order
    once (a ring's first pass); ``note_written(upto)`` after each write."""

    def __init__(self, mapping, total: int, *, name: str, ahead: int = AHEAD_BYTES, chunk: int = CHUNK_BYTES):
        self.total, self.name, self.ahead, self.chunk = int(total), name, int(ahead), int(chunk)
        self.supported = _c_populate_write is not None
        self.committed = 0                 # bytes committed so far (the thread's progress)
        self._mapping = mapping
        self._requested = 0                # bytes asked for so far (the writer's side)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.note_written(0)

    def note_written(self, upto: int) -> None:
        """The writer wrote every byte below ``upto``: commit the next range if it is near."""
        if not self.supported or upto + self.ahead // 2 < self._requested or self._requested >= self.total:
            return
        if self._thread is not None:
            if self._thread.is_alive():    # still committing the last range: asked again at the next write
                return
            self._thread.join()
        rng = next_commit_range(upto, self._requested, self.total, ahead=self.ahead)
        if rng is None or self._error is not None:
            return
        self._requested = rng[1]
        self._thread = threading.Thread(target=self._commit, args=rng, name=f"conduit-commit-{self.name}", daemon=True)
        self._thread.start()

    def _commit(self, start: int, stop: int) -> None:
        try:
            for lo in range(start, stop, self.chunk):
                hi = min(stop, lo + self.chunk)
                err = _c_populate_write(self._mapping, lo, hi - lo)
                if err in _UNSUPPORTED:
                    self.supported = False
                    return
                if err:
                    raise OSError(err, os.strerror(err))
                self.committed = hi
        except BaseException as exc:   # reaches the writer through check()
            self._error = exc

    def check(self) -> None:
        """Raise what the committing thread met (before an insert changes anything), once: the
        next write asks again from where committing stopped."""
        if self._error is not None:
            error, self._error = self._error, None
            self._requested = self.committed
            raise CapacityError(
                f"{self.name}: the machine could not commit memory for the buffer's next pages (from byte "
                f"{self.committed} of {self.total}: {error}). Nothing of this insert was stored. Fix: lower the "
                "buffer's capacity (or frame budget), or free memory on this machine") from error

    def wait(self) -> None:
        """Until the range asked for so far is committed (or committing stopped)."""
        thread = self._thread
        if thread is not None:
            thread.join()

    def close(self) -> None:
        """Join the committing thread (a populate call ends within a chunk's faults)."""
        self.wait()
        self._thread = None
        self._mapping = None
