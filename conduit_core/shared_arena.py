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

* A segment's bytes below its store's end are never written again (a RaggedStore appends; a
  compaction moves live rows to a *new* segment). Rows located in a segment therefore stay what
  they were as long as the segment exists, whatever clears or overwrites follow.
* A segment is never resized, and its name (a per-owner counter) is never reused. A handle is
  ``<name>@<pid>/<fd>``; descriptor numbers are reused, so an opener checks that the descriptor
  it got is the named segment (``/proc/self/fd`` names it) and otherwise treats it as gone.
* When its store no longer uses a segment (``release``) the owner closes it, unless pinned by a
  put whose room lies in it (``pin``): then at the last ``unpin``. Its memory lives on in the
  processes that still map it and goes when they drop their mapping; a process that opens a
  handle after the close gets ``FileNotFoundError`` and asks the owner again.

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

from .errors import ConfigError


def available() -> bool:
    """Whether shared arenas can be used here (Linux: memfd and /proc)."""
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


class Segment:
    """One shared-memory segment mapped into this process, as a uint8 array (``array``):
    ``Segment.create(name, size)`` in its owner, ``Segment.attach(handle)`` elsewhere."""

    def __init__(self, handle: str, fd: int | None, mapping: mmap.mmap):
        self.handle, self._fd, self._map = handle, fd, mapping
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


def _address(arena: np.ndarray) -> int:
    return arena.__array_interface__["data"][0]


class SharedArenas:
    """A RaggedStore's arena provider over named segments ``<prefix>-<n>`` (see the module doc)."""

    def __init__(self, prefix: str):
        if not prefix or "/" in prefix or len(prefix) > 200:
            raise ConfigError("prefix", "a non-empty segment name prefix without '/'", repr(prefix),
                              "name the owner, e.g. 'cdt<run>u<rank>'")
        self.prefix = prefix
        self._next = 0
        self._segments: dict[int, Segment] = {}   # by the arena's address
        self._pins: dict[int, int] = {}
        self._released: set[int] = set()

    def new(self, size: int) -> np.ndarray:
        name = f"{self.prefix}-{self._next}"
        self._next += 1
        seg = Segment.create(name, size)
        self._segments[_address(seg.array)] = seg
        return seg.array

    def handle(self, arena: np.ndarray) -> str:
        """What another process on this node passes to ``SegmentMaps.array`` to map ``arena``."""
        return self._segments[_address(arena)].handle

    def handles(self) -> list[str]:
        """Every segment still open: in use by the store, or pinned by a put."""
        return [s.handle for s in self._segments.values()]

    def pin(self, arena: np.ndarray) -> None:
        a = _address(arena)
        self._pins[a] = self._pins.get(a, 0) + 1

    def unpin(self, arena: np.ndarray) -> None:
        a = _address(arena)
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
        self._segments.pop(a).close()

    def close(self) -> None:
        """Close every segment (the owner is done: its store is not used after this)."""
        for a in list(self._segments):
            self._free(a)
        self._pins.clear()


class SegmentMaps:
    """A process's mappings of other processes' segments, by handle, kept between calls.

    ``array(handle)`` maps a segment (``FileNotFoundError`` once its owner closed it: ask the
    owner again); ``keep_only(prefix, handles)`` drops the mappings of an owner's segments that it
    no longer lists (their memory goes once no process maps them). Hold ``lock`` across a lookup
    and the copy that uses it."""

    def __init__(self):
        self.lock = threading.RLock()
        self._maps: dict[str, Segment] = {}

    def array(self, handle: str) -> np.ndarray:
        seg = self._maps.get(handle)
        if seg is None:
            seg = self._maps[handle] = Segment.attach(handle)
        return seg.array

    def keep_only(self, prefix: str, names) -> None:
        keep = set(names)
        for name in [n for n in self._maps if n.startswith(prefix + "-") and n not in keep]:
            self._maps.pop(name).close()

    def mapped(self) -> list[str]:
        return list(self._maps)

    def close(self) -> None:
        with self.lock:
            for seg in self._maps.values():
                seg.close()
            self._maps.clear()
