"""Waiting for the rate limiter: the buffer's inserts and samples wait on its lock until
``RateLimiter``'s pure decisions allow them, or end in a clear error, never a hang."""

from __future__ import annotations

import threading
import time

from ..errors import RateLimitError, RateLimitTimeout
from .rate_limiter import RateLimiter


class BufferCondition(threading.Condition):
    """The buffer's lock and condition (and the data plane's, which guards its shared counts
    with one of these too). Every insert and delivery notifies (a consumer may wait
    for rows, a producer for room), and almost always nobody waits: ``notify_all`` then returns
    at once instead of walking the standard library's notify (~0.6 us per insert). Called with
    the lock held, as ``threading.Condition`` requires, so the waiter list cannot change under it.
    ``mutex`` is that lock, for hot paths: ``with cond:`` enters it through a Python method; and
    ``waiters`` the waiter list, for hot paths too: ``if cond.waiters: cond.notify_all()`` (the lock
    held) costs no call when nobody waits."""

    def __init__(self):
        self.mutex = threading.RLock()   # ``with cond.mutex:`` holds the same lock, entered in C
        super().__init__(self.mutex)
        self.waiters = self._waiters   # (the standard library's deque; it never replaces it)

    def notify_all(self) -> None:
        if self._waiters:
            super().notify_all()


def wait_until(cond, predicate, *, limiter: RateLimiter, timeout: float | None, why: str, kind: str,
               check_open) -> None:
    """Wait on ``cond`` (held) until ``predicate()``: raise at once under ``on_limit='raise'``,
    else wait at most ``timeout`` (the limiter's when None) and end in a clear error, never a
    hang. ``check_open`` raises when the buffer was closed meanwhile."""
    if limiter.on_limit == "raise":
        raise RateLimitError(f"{kind} refused: {why}. Fix: deliver/consume first, or use "
                             "RateLimiter(on_limit='block') with a background worker.")
    limit = limiter.timeout if timeout is None else timeout
    deadline = time.monotonic() + limit
    while not predicate():
        check_open()
        left = deadline - time.monotonic()
        if left <= 0:
            raise RateLimitTimeout(f"{kind} waited {limit:.3g} s: {why}. Fix: make sure the other "
                                   "side (actors or learner) is running, or relax the RateLimiter.")
        cond.wait(min(left, 0.05))


def wait_to_insert(buf, n: int, timeout: float | None) -> None:
    """Wait (the buffer's lock held) until ``n`` rows may be inserted: a FIFO buffer never
    overwrites unconsumed rows, and the limiter's ratio holds."""
    rl, ring = buf.rate_limiter, buf.ring
    if rl.samples_per_insert is None and not buf.selector.consumes:
        return   # no ratio to keep and no unconsumed rows to protect: nothing to wait for

    def fifo_full() -> bool:
        return buf.selector.consumes and (ring.inserted + n - ring.head) > buf.capacity

    def allowed() -> bool:
        return not fifo_full() and rl.can_insert(inserts=ring.inserted, samples=buf.counts.sampled + buf.counts.lost,
                                                 n=n, size=buf.size)
    if allowed():
        return
    if fifo_full():
        why = (f"the queue holds {ring.queued()} unconsumed items (and {ring.inserted - ring.head - ring.queued()} "
               f"slots of rows taken or lost among them, freed once the rows before them leave) of capacity "
               f"{buf.capacity}; overwriting them would lose on-policy data")
    else:
        why = rl.why_not_insert(inserts=ring.inserted, samples=buf.counts.sampled + buf.counts.lost, n=n)
    wait_until(buf.lock, allowed, limiter=rl, timeout=timeout, why=why, kind="insert", check_open=buf.check_open)


def wait_to_sample(buf, n: int, timeout: float | None) -> int:
    """Wait (the buffer's lock held) until the limiter lets ``n`` items be sampled; returns the
    number of items stored then (the draw that follows under the same lock reads it)."""
    rl, ring = buf.rate_limiter, buf.ring
    size = buf.size
    if rl.samples_per_insert is None and size >= rl.min_size:
        return size   # no ratio to keep and enough rows: can_sample's answer, without its keyword call

    def allowed() -> bool:
        return rl.can_sample(size=buf.size, inserts=ring.inserted, samples=buf.counts.sampled + buf.counts.lost, n=n)
    if not allowed():
        wait_until(buf.lock, allowed, limiter=rl, timeout=timeout, kind="sample", check_open=buf.check_open,
                   why=rl.why_not_sample(size=buf.size, inserts=ring.inserted,
                                         samples=buf.counts.sampled + buf.counts.lost, n=n))
    return buf.size
