"""Arenas in shared memory: a store's bytes that other processes on the node map directly.

A ``RaggedStore`` built with ``arenas=SharedArenas(prefix)`` keeps each field's arena in its own
anonymous shared-memory file (Linux ``memfd``, named ``<prefix>-<n>`` for diagnostics only). The
owner (one process, e.g. a storage-unit actor) stays the one authority on which bytes belong to
which row; another process on the same node asks it where rows lie (segment handle, offsets,
lengths: a small message) and copies them out of its own mapping (``SegmentMaps``), or writes a
put's bytes into room the owner reserved for it. The bytes cross the process boundary once, with
no serialisation.

A segment is reached through the owner's open descriptor, ``/proc/<pid>/fd/<fd>``, and has no
name in any file system: when the owner closes it, or dies however it dies (``ray.kill`` sends
SIGKILL: no handler runs), the kernel frees it once the last mapping goes. Nothing is left in
/dev/shm to clean up, and /dev/shm's size (small in containers) does not bound the arenas.

Lifetime rules, which make a reader safe without any lock shared between processes:

* While a segment is a store's arena its bytes below the store's end are never written again (a
  RaggedStore appends; a compaction moves live rows to another segment). Rows located in it
  stay what they were, whatever clears or overwrites follow, until the segment is released.
* A segment is never resized, and its name (a per-owner counter) is never reused. A handle is
  ``<name>@<pid>/<fd>``; descriptor numbers are reused, so an opener checks that the descriptor
  it got is the named segment (``/proc/self/fd`` names it) and otherwise treats it as gone.
* When its store no longer uses a segment (``release``; deferred to the last ``unpin`` while a
  put's room lies in it) the owner keeps it for reuse or closes it. Reuse first bumps the
  segment's generation (its first 8 bytes); a reader copies the rows it located, then checks the
  generation is still the one located (``SegmentMaps.check``) and otherwise asks again: bytes
  are only ever written into room handed out after the bump, so a reader never keeps another
  row's bytes. A closed segment's memory lives on in the processes that still map it; opening
  its handle after the close gives ``FileNotFoundError`` (ask again).

    owner (unit actor)                             client process, same node
    store.locate(keys) -> (segment, starts) ---->  SegmentMaps.array(segment)[starts...] -> copy out
    store.reserve(...) -> (segment, offset) ---->  write the put's bytes at offset
    store.put(... bytes in place, no copy) <----   commit (small call)
"""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from ..errors import ConfigError


def available() -> bool:
    """Whether shared arenas can be used here (Linux: memfd and /proc)."""
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


class Segment:
    """One shared-memory segment mapped into this process, as a uint8 array (``array``):
    ``Segment.create(name, size)`` in its owner, ``Segment.attach(handle)`` elsewhere."""

    def __init__(self, handle: str, fd: int | None, mapping: mmap.mmap):
        self.handle, self._fd, self._map, self.size = handle, fd, mapping, len(mapping)
        self.array = np.frombuffer(mapping, dtype=np.uint8)

    @classmethod
    def create(cls, name: str, size: int) -> "Segment":
        if not available():  # pragma: no cover
            raise ConfigError("shared memory", "Linux (memfd_create and /proc)", os.name,
                              "set transfer_queue.backend.Conduit.shared_memory=false")
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(f"{name}@{os.getpid()}/{fd}", fd, mapping)

    @classmethod
    def attach(cls, handle: str) -> "Segment":
        """Map another process's segment; ``FileNotFoundError`` when it is no longer there."""
        name, _, where = handle.rpartition("@")
        pid, _, fd = where.partition("/")
        try:
            own = os.open(f"/proc/{int(pid)}/fd/{int(fd)}", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise
        except ProcessLookupError as exc:
            raise FileNotFoundError(handle) from exc
        try:
            if os.readlink(f"/proc/self/fd/{own}") != f"/memfd:{name} (deleted)":
                raise FileNotFoundError(f"{handle}: the descriptor now holds another file")
            mapping = mmap.mmap(own, 0)
        finally:
            os.close(own)
        return cls(handle, None, mapping)

    def close(self) -> None:
        """Drop this process's mapping (and, in the owner, the segment: gone once unmapped everywhere)."""
        self.array = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:   # a view made from the array is still alive: unmapped when it goes
                pass
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


HEADER = 64   # bytes before the arena in its segment: the generation (int64), bumped at every reuse


class SegmentGone(FileNotFoundError):
    """A located segment is no longer what was located (closed, or reused since): ask again."""


def _address(arena: np.ndarray) -> int:
    return arena.__array_interface__["data"][0]


def _generation(segment_array: np.ndarray) -> int:
    return int(segment_array[:8].view(np.int64)[0])


class SharedArenas:
    """A RaggedStore's arena provider over segments ``<prefix>-<n>`` (see the module doc).

    A released segment is kept for reuse (up to as many bytes as the arenas in use hold) rather
    than closed: a new segment's pages cost more to fault in than to copy into (4 KiB shmem pages).
    Reuse bumps the segment's generation first; a reader checks it after its copy (``check``)."""

    def __init__(self, prefix: str):
        if not prefix or "/" in prefix or len(prefix) > 200:
            raise ConfigError("prefix", "a non-empty segment name prefix without '/'", repr(prefix),
                              "name the owner, e.g. 'cdt<run>u<rank>'")
        self.prefix = prefix
        self._next = 0
        self._segments: dict[int, Segment] = {}   # in use or pinned, by the arena's address
        self._pins: dict[int, int] = {}
        self._released: set[int] = set()
        self._pool: list[Segment] = []            # released, kept for reuse (oldest first)
        self._no_reuse: set[int] = set()          # closed when released, never reused (see unpin)

    def new(self, size: int) -> np.ndarray:
        fit = [s for s in self._pool if size <= s.size - HEADER <= 2 * size]
        if fit:
            seg = min(fit, key=lambda s: s.size)
            self._pool.remove(seg)
            seg.array[:8].view(np.int64)[0] += 1     # before any room in it is handed out again
        else:
            seg = Segment.create(f"{self.prefix}-{self._next}", HEADER + size)
            self._next += 1
        arena = seg.array[HEADER:]
        self._segments[_address(arena)] = seg
        return arena

    def handle(self, arena: np.ndarray) -> str:
        """What another process on this node passes to ``SegmentMaps.arena`` to map ``arena``."""
        return self._segments[_address(arena)].handle

    def generation(self, arena: np.ndarray) -> int:
        return _generation(self._segments[_address(arena)].array)

    def handles(self, *, pooled: bool = True) -> list[str]:
        """Every open segment: in use by the store, pinned by a put, and (``pooled``) kept for reuse."""
        return [s.handle for s in self._segments.values()] + ([s.handle for s in self._pool] if pooled else [])

    def pin(self, arena: np.ndarray) -> None:
        a = _address(arena)
        self._pins[a] = self._pins.get(a, 0) + 1

    def unpin(self, arena: np.ndarray, *, reuse: bool = True) -> None:
        """``reuse=False``: a pin whose holder may still write into its room (a put reservation that
        expired with its client stalled): once released, the segment is closed rather than kept
        for reuse, so no late write can land in another field's rows."""
        a = _address(arena)
        if not reuse:
            self._no_reuse.add(a)
        self._pins[a] -= 1
        if not self._pins[a]:
            del self._pins[a]
            if a in self._released:
                self._free(a)

    def release(self, arena: np.ndarray) -> None:
        a = _address(arena)
        if a not in self._segments:
            return
        if a in self._pins:
            self._released.add(a)
        else:
            self._free(a)

    def _free(self, a: int) -> None:
        self._released.discard(a)
        seg = self._segments.pop(a)
        if a in self._no_reuse:
            self._no_reuse.discard(a)
            seg.close()
            return
        self._pool.append(seg)
        in_use = sum(s.size for s in self._segments.values())
        while self._pool and sum(s.size for s in self._pool) > in_use:
            self._pool.pop(0).close()

    def close(self) -> None:
        """Close every segment (the owner is done: its store is not used after this)."""
        for seg in [*self._segments.values(), *self._pool]:
            seg.close()
        self._segments, self._pool = {}, []
        self._pins.clear()
        self._released.clear()
        self._no_reuse.clear()


class SegmentMaps:
    """A process's mappings of other processes' segments, by handle, kept between calls.

    ``arena(handle)`` maps a segment's arena (``FileNotFoundError`` once its owner closed it: ask
    the owner again); ``check(handle, generation)`` after a copy out of it raises ``SegmentGone``
    if it was reused since it was located; ``keep_only(prefix, handles)`` drops the mappings of an
    owner's segments that it no longer lists (their memory goes once no process maps them). Hold
    ``lock`` across a lookup and the copy that uses it."""

    def __init__(self):
        self.lock = threading.RLock()
        self._maps: dict[str, Segment] = {}

    def arena(self, handle: str) -> np.ndarray:
        seg = self._maps.get(handle)
        if seg is None:
            seg = self._maps[handle] = Segment.attach(handle)
        return seg.array[HEADER:]

    def check(self, handle: str, generation: int) -> None:
        """After copying rows located at ``generation``: were they still those rows throughout?"""
        if _generation(self._maps[handle].array) != generation:
            raise SegmentGone(f"{handle}: reused since its rows were located")

    def keep_only(self, prefix: str, handles) -> None:
        keep = set(handles)
        for name in [n for n in self._maps if n.startswith(prefix + "-") and n not in keep]:
            self._maps.pop(name).close()

    def mapped(self) -> list[str]:
        return list(self._maps)

    def close(self) -> None:
        with self.lock:
            for seg in self._maps.values():
                seg.close()
            self._maps.clear()
