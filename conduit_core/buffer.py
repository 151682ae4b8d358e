"""The experience buffer: columnar storage + a selector + a rate limiter, thread-safe.

This is the synchronous core every control point drives. It owns the ring:

    seq  (global insertion number, 0, 1, 2, ...)  ->  slot = seq % capacity

so the write cursor, the FIFO head and "was this slot overwritten since it was
selected?" are all plain integer arithmetic. Per-slot metadata (seq, policy version,
source, episode successor) lives in host arrays beside the columns and is what
n-step returns and sequences follow, so both respect episode boundaries even when
several sources' rollouts interleave in the ring.

All public methods take the buffer's lock; waits (rate limits, FIFO space) have a
timeout and end in a clear error, never a hang.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from .batch import Batch
from .episodes import EPISODE_END_RULES, EpisodeWalk
from .memory import available_bytes, fmt, needed_bytes
from .errors import (ShardLost, CapacityError, ConfigError, ExperienceTimeout, RateLimitError, RateLimitTimeout,
                     SemanticError, SpecError)
from .rate_limiter import RateLimiter
from .buffer_state import SCHEMA_VERSION, check_state
from .ring import META_FIELDS, Ring
from .selectors import Fifo, Prioritized, Selector, Uniform
from .spec import ExperienceSpec
from .shards import ShardSpec, shard_class
from .storage import ColumnarStorage
from .tiers import Tier

log = logging.getLogger("conduit")


@dataclass(frozen=True)
class ShardLoss:
    """A remote shard lost: its rows left the buffer (they are not in len(), never delivered)."""

    shard: int
    node_resource: str | None
    rows: int
    seq_range: tuple[int, int] | None
    cause: str
    replaced_on: str
    at: float

    def describe(self) -> str:
        where = f"seqs {self.seq_range[0]}..{self.seq_range[1]}" if self.seq_range else "no stored rows"
        return (f"remote shard {self.shard} (node resource {self.node_resource!r}) lost {self.rows} rows ({where}): "
                f"{self.cause}; replaced by an empty shard on node {self.replaced_on[:12]}")




class OutputPool:
    """Reused host output arrays: a delivered batch stays valid for ``depth`` more
    deliveries of the same shape. Avoids first-touch page faults on large gathers, and
    keeps each array's tensor view, so a delivery wraps no arrays."""

    def __init__(self, depth: int, layout: dict[str, tuple[tuple[int, ...], np.dtype]]):
        self.depth, self.layout = depth, layout
        self._rings: dict[tuple, list[tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]]] = {}
        self._next: dict[tuple, int] = {}

    def get(self, lead: tuple[int, ...]) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
        """The next (arrays, their tensor views) for batches of leading shape ``lead``."""
        ring = self._rings.get(lead)
        if ring is None:
            ring = self._rings[lead] = []
            for _ in range(self.depth):
                arrays = {name: np.empty((*lead, *shape), dtype=dt) for name, (shape, dt) in self.layout.items()}
                ring.append((arrays, {name: torch.from_numpy(a) for name, a in arrays.items()}))
            self._next[lead] = 0
        i = self._next[lead]
        self._next[lead] = (i + 1) % self.depth
        return ring[i]


class ExperienceBuffer:
    """Columnar replay/queue storage of one experience spec.

    Keyword-only. ``selector``: Uniform() (default), Prioritized(...) or Fifo().
    ``shards`` places slot ranges on tiers (default: one shard on ``tier``).
    ``reuse_outputs``: keep this many output buffers per shape and reuse them (0 =
    fresh memory per delivery, always safe). ``seed`` seeds the selection RNG.
    """

    def __init__(self, *, spec: ExperienceSpec, capacity: int, selector: Selector | None = None,
                 shards: Sequence[ShardSpec] | None = None, tier: Tier | str = Tier.PAGEABLE,
                 rate_limiter: RateLimiter | None = None, seed: int = 0, reuse_outputs: int = 0,
                 done_fields: tuple[str, ...] = ("terminated", "truncated")):
        if not isinstance(spec, ExperienceSpec):
            raise ConfigError("spec", "an ExperienceSpec", type(spec).__name__,
                              "build one with ExperienceSpec.transition(...) or ExperienceSpec([FieldSpec...])")
        if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ConfigError("capacity", "a positive int number of transitions", repr(capacity),
                              "use e.g. capacity=100_000")
        self.spec = spec
        self._row_bytes = spec.bytes_per_transition  # delivered bytes per row (checked per sample: cached)
        capacity = int(capacity)
        shards = list(shards) if shards else [ShardSpec(Tier.parse(tier), capacity)]
        if sum(s.capacity for s in shards) != capacity:
            raise ConfigError("shards", f"capacities summing to capacity={capacity}",
                              sum(s.capacity for s in shards), "make the shard capacities add up to capacity")
        self.selector = selector if selector is not None else Uniform()
        if not isinstance(self.selector, Selector):
            raise ConfigError("selector", "a Selector (Uniform(), Prioritized(...), Fifo())",
                              type(self.selector).__name__, "pass one of the selectors in conduit_core")
        _check_memory(capacity, spec, shards, self.selector)
        self.selector.bind(capacity)
        self.rate_limiter = rate_limiter or RateLimiter()
        self.done_fields = tuple(f for f in done_fields if f in spec)
        self.walk = EpisodeWalk(spec, self.done_fields)  # n-step windows and sequences over the ring
        self.storage = ColumnarStorage(spec=spec, shards=shards)
        try:
            self.ring = Ring(capacity, shared=any(s.tier is Tier.SHARED for s in shards))
        except BaseException:  # a constructor that fails part-way returns what it took, at once
            self.storage.close()
            raise
        self.rng = np.random.default_rng(seed)
        self._seed = seed
        self._sampled = 0         # items ever delivered by sample()/take()
        self._dropped_stale = 0   # FIFO: items dropped for being from an older policy version
        self._migration = None    # an active Migration (see migration.py) receives every insert
        self._losses: list[ShardLoss] = []  # remote shards lost (actor died, node left), with their rows
        self._cond = threading.Condition(threading.RLock())
        self._closed = False
        self._out = OutputPool(reuse_outputs, self.storage.stored_numpy_dtypes()) if reuse_outputs > 0 else None

    # ------------------------------------------------------------ properties
    def __len__(self) -> int:
        return self.size

    @property
    def size(self) -> int:
        """Items currently stored (for FIFO: not yet consumed)."""
        if self.selector.consumes:
            return self.ring.inserted - self.ring.head
        return self.ring.inserted - self.ring.lo() - self.ring.holes

    @property
    def capacity(self) -> int:
        return self.ring.capacity

    @property
    def meta(self) -> dict[str, np.ndarray]:
        """The ring's per-slot metadata (seq, version, source, next_seq): read-only for others."""
        return self.ring.meta

    @property
    def evicted_early(self) -> int:
        """Rows evicted before the ring wrapped because the frame pool needed their frames."""
        return self.ring.evicted_early

    @property
    def inserted(self) -> int:
        return self.ring.inserted

    @property
    def sampled(self) -> int:
        return self._sampled

    @property
    def dropped_stale(self) -> int:
        return self._dropped_stale

    @property
    def lock(self) -> threading.Condition:
        return self._cond

    # ---------------------------------------------------------------- insert
    def encode(self, batch: Mapping[str, Any]) -> tuple[int, dict[str, torch.Tensor]]:
        """Validate and encode a batch; pure with respect to the buffer (stores nothing)."""
        n, cols = self.spec.validate(batch)
        if n > self.capacity:
            raise CapacityError(f"batch: expected at most capacity={self.capacity} transitions, got {n}. "
                                "Fix: raise the buffer capacity or ingest the rollout in smaller pieces.")
        return n, self.spec.encode(cols)

    def add(self, batch: Mapping[str, Any], *, source: int = 0, policy_version: int = 0,
            timeout: float | None = None, priorities: Any = None) -> int:
        """Store a batch of transitions (one source's, in time order). Returns the first seq.

        ``priorities`` (prioritized selectors only): one initial priority per item instead of the
        running max (e.g. from a TD error the actor computed, as SRL's buffer does).
        Validation and encoding happen before anything is written: a rejected batch
        leaves the buffer untouched."""
        n, enc = self.encode(batch)
        return self.add_encoded(enc, n, source=source, policy_version=policy_version, timeout=timeout,
                                priorities=priorities)

    def add_encoded(self, enc: Mapping[str, torch.Tensor], n: int, *, source: int = 0, policy_version: int = 0,
                    timeout: float | None = None, priorities: Any = None) -> int:
        if n == 0:
            return self.ring.inserted
        if priorities is not None:
            if self._migration is not None:
                raise ConfigError("priorities", "no initial priorities while a migration runs", "priorities",
                                  "wait for the migration to finish, or add without priorities")
            priorities = self.selector.check_initial_priorities(n, priorities)  # before anything is written
        with self._cond:
            self._check_open()
            self._wait_for_insert(n, timeout)
            first = self.ring.inserted
            start = first % self.capacity
            if self.storage.pools:
                enc = dict(enc)
                pending = self.storage.plan_frames(enc, n)
                self._evict_for_frames(pending, n)
                self.storage.commit_frames(pending)
            leaving = self.ring.holes_leaving(n)  # removed rows the ring now overwrites leave the window
            self._with_lost_shards(lambda: self.storage.write(start, enc, n), keep_from=first + n - self.capacity)
            self.ring.holes -= leaving  # only once the write happened: a failed insert changes nothing
            prev_tail = self.ring.write(first, n, enc, self.done_fields, int(source), int(policy_version))
            if self._migration is not None:  # dual write: the new layout gets every insert too
                self._migration.on_insert(first, enc, n, int(source), int(policy_version), prev_tail)
            self.ring.advance(n)
            self.selector.on_insert(start, n, min(self.ring.inserted, self.capacity))
            if priorities is not None:
                self.selector.set_initial_priorities((start + np.arange(n)) % self.capacity, priorities)
            self._cond.notify_all()
            return first

    # ------------------------------------------------------------ lost shards
    def _with_lost_shards(self, op, *, keep_from: int | None = None, then=None):
        """Run a storage operation (under the lock); when a remote shard turns out lost, its
        rows leave the buffer (reported in ``losses``), a new empty shard takes its place,
        and the operation runs again (after ``then()``, e.g. waiting until enough rows are
        left to sample). ``keep_from``: rows below this seq are being overwritten by the
        operation itself, so they are not counted as lost. A FIFO buffer cannot skip lost
        on-policy rows without breaking its order: there the loss is raised."""
        for _ in range(len(self.storage.shards) + 1):
            try:
                return op()
            except ShardLost as lost:
                if self.selector.consumes:
                    raise
                self._lose_shard(lost, self.ring.lo() if keep_from is None else max(self.ring.lo(), keep_from))
                if then is not None:
                    then()
        return op()

    def _lose_shard(self, lost: ShardLost, keep_from: int) -> None:
        s = lost.shard
        slots = np.arange(int(self.storage.bounds[s]), int(self.storage.bounds[s + 1]), dtype=np.int64)
        seqs = self.meta["seq"][slots]
        gone = seqs[self.ring.live(slots, seqs) & (seqs >= keep_from)]
        self.evict(gone)
        loss = ShardLoss(shard=s, node_resource=lost.node, rows=int(gone.size),
                         seq_range=(int(gone.min()), int(gone.max())) if gone.size else None,
                         cause=f"{type(lost.cause).__name__}: {lost.cause}", replaced_on="(not replaced)",
                         at=time.time())
        self._losses.append(loss)  # recorded before the replacement, which may fail in turn
        log.warning("conduit: %s", loss.describe())
        node = self.storage.replace_shard(s)
        self._losses[-1] = dataclasses.replace(loss, replaced_on=node)

    @property
    def losses(self) -> list["ShardLoss"]:
        """Every remote shard lost so far: which, its rows (count and seq range), the cause,
        and where the empty shard that replaced it runs."""
        with self._cond:
            return list(self._losses)

    # -------------------------------------------------------------- eviction
    def evict(self, seqs) -> int:
        """Remove stored rows before the ring would overwrite them: a framework's own
        eviction rule (RLlib's is whole oldest episodes) on top of the ring's. Rows already
        gone are skipped. Removed rows are never delivered again (uniform selection redraws
        a removed slot; a prioritized one has priority 0); the ring reuses their slots in
        turn. Returns how many rows were removed."""
        if self.selector.consumes:
            raise ConfigError("evict()", "a replay buffer (uniform or prioritized)", "fifo",
                              "FIFO data leaves when it is taken; use take()")
        seqs = np.unique(np.asarray(seqs, dtype=np.int64).reshape(-1))
        with self._cond:
            self._check_open()
            seqs, slots = self.ring.remove(seqs)
            if not seqs.size:
                return 0
            self.selector.on_evict(slots)
            if self._migration is not None:
                self._migration.on_evict(seqs)
            self._cond.notify_all()
            return int(seqs.size)

    def read(self, seqs, *, fields: Sequence[str] | None = None,
             device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
        """Stored rows by their seq, decoded: each field shaped ``seqs.shape + field shape``.

        For an adapter that rebuilds its framework's own objects around rows it already
        knows (RLlib's episode slices, with their lookback): no selection, no RNG draw,
        nothing counted as sampled. A seq that is not stored (never written, overwritten by
        the ring, evicted, or on a lost shard) is an error naming it; nothing is read then."""
        seqs = np.asarray(seqs, dtype=np.int64)
        flat = seqs.reshape(-1)
        self._check_fields(fields)
        with self._cond:
            self._check_open()
            slots = flat % self.capacity
            live = self.ring.stored(flat)
            if not live.all():
                bad = int(flat[np.argmin(live)])
                raise SemanticError(f"read: seq {bad} is not stored (stored seqs are in [{self.ring.lo()}, "
                                    f"{self.ring.inserted}) minus evicted rows). Fix: read only rows this buffer "
                                    "still holds (e.g. seqs from a delivered batch or from the adapter's own "
                                    "ledger of stored episodes).")
            data = self.storage.gather(slots.reshape(seqs.shape),
                                       device=None if device is None else torch.device(device), fields=fields)
        return dict(data)

    def _check_fields(self, fields) -> None:
        if fields is None:
            return
        if isinstance(fields, str):
            raise ConfigError("fields", "a sequence of field names", repr(fields), f"pass [{fields!r}]")
        unknown = [f for f in fields if f not in self.spec]
        if unknown:
            raise SpecError(f"fields[{unknown[0]!r}]", f"one of the spec's fields {list(self.spec.names)}",
                            "not in the spec", "ask for declared fields only")

    def recount_holes(self) -> None:
        """Recompute the removed-row count from the metadata (after a layout change)."""
        with self._cond:
            self.ring.recount_holes()

    @property
    def migrating(self) -> bool:
        return self._migration is not None

    # ------------------------------------------------- layout changes (migration.py)
    def check_open(self) -> None:
        """Raise ClosedError if the buffer is closed."""
        self._check_open()

    def live_range(self) -> tuple[int, int]:
        """(oldest seq that may be stored, next seq): the window of live rows (evicted rows
        inside it are marked in ``meta['seq']``)."""
        with self._cond:
            return self.ring.lo(), self.ring.inserted

    def attach_dual_writer(self, writer) -> tuple[int, int]:
        """From now on every insert and eviction also goes to ``writer`` (its ``on_insert`` and
        ``on_evict``, called under the buffer's lock): how a migration keeps its new layout
        current while it copies. Returns ``live_range()`` at that moment: the rows to copy.
        One writer at a time."""
        with self._cond:
            self._check_open()
            if self._migration is not None:
                raise ConfigError("migration", "one migration at a time", "another one running",
                                  "finish() the running migration first")
            self._migration = writer
            return self.ring.lo(), self.ring.inserted

    def detach_dual_writer(self, writer) -> None:
        with self._cond:
            if self._migration is writer:
                self._migration = None

    def stored_columns(self, seqs: np.ndarray) -> dict[str, torch.Tensor]:
        """Every field of rows ``seqs`` as stored (encoded), on the host: what a copy moves."""
        slots = np.asarray(seqs, dtype=np.int64) % self.capacity
        return {f.name: self.storage.gather_stored(f.name, slots) for f in self.spec}

    def adopt_layout(self, storage: ColumnarStorage, meta: dict[str, np.ndarray], capacity: int) -> ColumnarStorage:
        """Swap in a new layout that holds every live row at ``seq % capacity`` (a finished
        migration), atomically with respect to inserts and deliveries; the dual writer is
        detached. Returns the old storage, for the caller to close outside the lock."""
        with self._cond:
            lo = self.ring.lo()
            seqs = np.arange(lo, self.ring.inserted, dtype=np.int64)
            self.selector.rebind(capacity, seqs % self.capacity, seqs % capacity)
            old = self.storage
            self.storage = storage
            self.ring.adopt(meta, capacity)
            self._migration = None
            self._cond.notify_all()
            return old

    def _evict_for_frames(self, pending: list, n: int) -> None:
        """Evict (oldest first) the rows whose frames the pending frame writes overwrite."""
        cap = self.capacity
        a = max(self.ring.lo(), self.ring.inserted + n - cap)  # rows that survive the ring
        b = self.ring.inserted
        new_floor = a
        for pool, _stacks, _sel, count, last in pending:
            keep_from = pool.cursor + count - pool.capacity  # smallest frame id that survives
            if last.size and int(last.min()) - pool.k + 1 < keep_from:
                raise CapacityError(f"rollout: its {count} new frames exceed the frame pool ({pool.capacity} "
                                    "frames). Fix: ingest shorter rollouts or raise FrameStackCodec.frame_budget.")
            ids = self.storage.host_view(pool.fields[0])
            lo_s, hi_s = a, b  # first seq in [a, b) whose first frame survives
            while lo_s < hi_s:
                mid = (lo_s + hi_s) // 2
                if int(ids[mid % cap]) - pool.k + 1 >= keep_from:
                    hi_s = mid
                else:
                    lo_s = mid + 1
            new_floor = max(new_floor, lo_s)
        if new_floor <= a:
            return
        if self.selector.consumes and new_floor > self.ring.head:
            raise CapacityError(f"frame pool full: storing this rollout would evict {new_floor - self.ring.head} "
                                "unconsumed on-policy rows. Fix: consume first or raise frame_budget.")
        self.selector.on_evict(self.ring.raise_floor(a, new_floor))

    def _wait_for_insert(self, n: int, timeout: float | None) -> None:
        rl = self.rate_limiter

        def fifo_full() -> bool:
            return self.selector.consumes and (self.ring.inserted + n - self.ring.head) > self.capacity

        def allowed() -> bool:
            return not fifo_full() and rl.can_insert(inserts=self.ring.inserted, samples=self._sampled,
                                                     n=n, size=self.size)
        if allowed():
            return
        if fifo_full():
            why = (f"the FIFO queue holds {self.ring.inserted - self.ring.head} unconsumed items of "
                   f"capacity {self.capacity}; overwriting them would lose on-policy data")
        else:
            why = rl.why_not_insert(inserts=self.ring.inserted, samples=self._sampled, n=n)
        self._wait(allowed, timeout, why, kind="insert")

    def _wait(self, predicate, timeout: float | None, why: str, *, kind: str) -> None:
        rl = self.rate_limiter
        if rl.on_limit == "raise":
            raise RateLimitError(f"{kind} refused: {why}. Fix: deliver/consume first, or use "
                                 "RateLimiter(on_limit='block') with a background worker.")
        limit = rl.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not predicate():
            self._check_open()
            left = deadline - time.monotonic()
            if left <= 0:
                raise RateLimitTimeout(f"{kind} waited {limit:.3g} s: {why}. Fix: make sure the other "
                                       "side (actors or learner) is running, or relax the RateLimiter.")
            self._cond.wait(min(left, 0.05))

    # ---------------------------------------------------------------- select
    def sample(self, batch_size: int, *, device: torch.device | str | None = None,
               n_step: int | tuple[int, int] | None = None, gamma: float = 0.99,
               beta: float | None = None, timeout: float | None = None,
               fields: Sequence[str] | None = None, episode_end: str = "shorten") -> Batch:
        """Select ``batch_size`` items (uniform or prioritized) and gather them, decoded,
        on ``device``. With ``n_step`` (an int, or ``(lo, hi)`` drawn per item from
        ``[lo, hi)`` as RLlib does), ``reward`` is the discounted n-step return within the
        episode and ``next_obs``/done fields come from the last step; ``n_step`` is added
        (the window's true length, for the gamma^n_step bootstrap).

        ``episode_end`` decides what happens to a window that would run past its episode's
        stored end (the episode ended, or its next steps are not stored yet). 'shorten'
        delivers the shorter window (RLlib's uniform ``EpisodeReplayBuffer`` draws these);
        'redraw' draws the item and its n again, so every delivered window has its full n
        (RLlib's ``PrioritizedEpisodeReplayBuffer``). The two are different distributions
        over the same data, and they change how fast DQN learns: pick the framework's."""
        if self.selector.consumes:
            raise ConfigError("selector", "uniform or prioritized for sample()", "fifo",
                              "use take() to consume FIFO (on-policy) data")
        if episode_end not in EPISODE_END_RULES:
            raise ConfigError("episode_end", f"one of {EPISODE_END_RULES}", repr(episode_end),
                              "'redraw' for RLlib's prioritized buffer, 'shorten' for its uniform one")
        if isinstance(n_step, list):
            n_step = tuple(n_step)
        self._check_sampling(n_step, gamma, beta)
        self._check_batch_size(batch_size)
        self._check_fields(fields)
        if n_step is not None and episode_end == "redraw" and getattr(self.selector, "stratified", False):
            raise ConfigError("episode_end", "'shorten' with Prioritized(stratified=True)", "'redraw'",
                              "the redraw walk draws items independently (RLlib's rule): use "
                              "Prioritized(stratified=False) for it")
        if n_step is not None and episode_end == "redraw" and not self.selector.native_windows:
            raise ConfigError("episode_end", f"'shorten' with the {self.selector.name} selector", "'redraw'",
                              "the redraw rule runs in the native walk, which draws plain uniform or "
                              "prioritized items: use episode_end='shorten' with this selector")
        with self._cond:
            self._check_open()
            self._wait_for_sample(batch_size, timeout)

            def draw():
                if n_step is not None and episode_end == "redraw":
                    slots, weights, ret, last, steps = self.walk.sample_windows(
                        self.ring, self.storage, self.selector, self.rng, batch_size, n_step, gamma, beta, redraw=True)
                    return slots, weights, self.walk.window_columns(self._gather, slots, ret, last, steps, device,
                                                                    fields)
                slots, weights = self._select(batch_size, beta)
                if n_step is None:
                    return slots, weights, self._gather(slots, device, fields)
                return slots, weights, self.walk.n_step_columns(self.ring, self.storage, self.rng, self._gather, slots,
                                                                n_step, gamma, device, fields)
            slots, weights, data = self._with_lost_shards(
                draw, then=lambda: self._wait_for_sample(batch_size, timeout))
            self._sampled += batch_size
            self._cond.notify_all()
            return Batch(data, slots=slots, seqs=self.meta["seq"][slots], versions=self.meta["version"][slots],
                         weights=None if weights is None else (torch.from_numpy(weights) if device is None
                                                               else torch.from_numpy(weights).to(device)),
                         inserted_at_selection=self.ring.inserted)

    def _select(self, batch_size: int, beta: float | None):
        """Slots for a batch. A weighted selector draws slots from its own index; any other
        names positions among the stored rows, oldest first (removed rows are not
        positions). An order-free one (plain uniform: its distribution is the same under any
        reordering of the rows) may have its positions read as slots where that is the same
        set, which spares the mapping on the hot path."""
        if self.selector.weighted:
            return self.selector.select(batch_size, self.size, self.rng, beta=beta)
        lo = self.ring.lo()
        if not self.selector.order_free:
            if self.ring.holes:
                live = self.ring.live_seqs()
                off, weights = self.selector.select(batch_size, int(live.size), self.rng)
                return live[off] % self.capacity, weights
            off, weights = self.selector.select(batch_size, self.ring.inserted - lo, self.rng)
            return (lo + off) % self.capacity, weights
        off, weights = self.selector.select(batch_size, self.ring.inserted - lo, self.rng)
        if self.ring.holes:
            return self._redraw_holes(lo, off), weights
        if self.ring.floor > max(self.ring.inserted - self.capacity, 0):  # early eviction: a shifted window
            return (lo + off) % self.capacity, weights
        return off, weights

    def _redraw_holes(self, lo: int, off: np.ndarray) -> np.ndarray:
        """Uniform over the stored rows when some were removed: offsets that fall on a removed
        row are drawn again (each round keeps the live ones, so the result is uniform)."""
        window = self.ring.inserted - lo
        seqs = lo + off
        for _ in range(1000):
            dead = self.meta["seq"][seqs % self.capacity] != seqs
            if not dead.any():
                return seqs % self.capacity
            seqs[dead] = lo + self.rng.integers(0, window, int(dead.sum()))
        live = self.ring.live_seqs()
        dead = self.meta["seq"][seqs % self.capacity] != seqs
        seqs[dead] = live[self.rng.integers(0, live.size, int(dead.sum()))]
        return seqs % self.capacity

    def _check_batch_size(self, batch_size: int) -> None:
        if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise ConfigError("batch_size", "a positive int", repr(batch_size), "pass e.g. batch_size=32")
        out = int(batch_size) * self._row_bytes
        if out < (256 << 20):  # the usual case costs no system call on the hot path
            return
        free = available_bytes(Tier.PAGEABLE)
        if free is not None and out > free:
            raise CapacityError(f"batch_size: a batch of {batch_size} rows needs {fmt(out)}, {fmt(free)} of host "
                                "memory is free. Fix: sample smaller batches.")

    @staticmethod
    def _check_sampling(n_step, gamma: float, beta: float | None) -> None:
        """Sampling arguments, checked before anything is drawn."""
        if type(n_step) is int and n_step >= 1 and type(gamma) is float and 0.0 <= gamma <= 1.0 \
                and (beta is None or (type(beta) is float and 0.0 <= beta < math.inf)):
            return  # the usual call, decided without a function call
        ok = lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
        if n_step is not None:
            if isinstance(n_step, (tuple, list)):
                if len(n_step) != 2 or not all(ok(v) for v in n_step) or not 1 <= n_step[0] <= n_step[1]:
                    raise ConfigError("n_step", "an int >= 1 or (lo, hi) ints with 1 <= lo <= hi (drawn from "
                                      "[lo, hi))", repr(n_step), "e.g. n_step=3 or n_step=(2, 5)")
            elif not ok(n_step) or n_step < 1:
                raise ConfigError("n_step", "an int >= 1 or (lo, hi)", repr(n_step), "e.g. n_step=3 or (2, 5)")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or not 0.0 <= gamma <= 1.0:
            raise ConfigError("gamma", "a discount in [0, 1]", repr(gamma), "e.g. gamma=0.99")
        if beta is not None and (isinstance(beta, bool) or not isinstance(beta, (int, float, np.floating))
                                 or not np.isfinite(beta) or beta < 0):
            raise ConfigError("beta", "a finite number >= 0 (or None: the selector's)", repr(beta), "e.g. beta=0.4")

    def _wait_for_sample(self, n: int, timeout: float | None) -> None:
        rl = self.rate_limiter

        def allowed() -> bool:
            return rl.can_sample(size=self.size, inserts=self.ring.inserted, samples=self._sampled, n=n)
        if not allowed():
            self._wait(allowed, timeout, rl.why_not_sample(size=self.size, inserts=self.ring.inserted,
                                                           samples=self._sampled, n=n), kind="sample")

    def _gather(self, slots: np.ndarray, device, fields=None) -> dict[str, torch.Tensor]:
        out, views = (None, None) if self._out is None or fields is not None else self._out.get(slots.shape)
        return self.storage.gather(slots, device=None if device is None else torch.device(device),
                                   out=out, out_tensors=views, fields=fields)

    def sample_sequences(self, batch_size: int, length: int, *, device=None, timeout: float | None = None) -> Batch:
        """``batch_size`` sequences of ``length`` consecutive steps of one episode each,
        shaped ``[B, T, ...]``, with a boolean ``mask`` [B, T] that is False after the
        episode ends (those steps repeat the last real step and must be ignored).
        Starts are chosen by the selector."""
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 1 <= length <= self.capacity:
            raise ConfigError("length", f"an int in [1, capacity={self.capacity}]", repr(length),
                              "use e.g. length=20")
        if self.selector.consumes:
            raise ConfigError("selector", "uniform or prioritized for sample_sequences()", "fifo",
                              "use take() for FIFO data")
        self._check_batch_size(batch_size)
        with self._cond:
            self._check_open()
            self._wait_for_sample(batch_size, timeout)

            def draw():
                starts, weights = self._select(batch_size, None)
                grid, mask = self.walk.sequence_grid(self.ring, starts, length)
                data = self._gather(grid, device)
                return starts, weights, grid, mask, data
            starts, weights, grid, mask, data = self._with_lost_shards(
                draw, then=lambda: self._wait_for_sample(batch_size, timeout))
            dev = torch.device(device) if device is not None else torch.device("cpu")
            data["mask"] = torch.from_numpy(mask).to(dev)
            self._sampled += batch_size
            self._cond.notify_all()
            return Batch(data, slots=starts, seqs=self.meta["seq"][starts], versions=self.meta["version"][starts],
                         weights=None if weights is None else torch.from_numpy(weights).to(dev),
                         inserted_at_selection=self.ring.inserted)


    def take(self, batch_size: int | None = None, *, policy_version: int | None = None,
             device=None, timeout: float | None = None, wait: bool = True) -> Batch:
        """Consume the oldest unconsumed items, each exactly once (FIFO selector only).

        With ``policy_version``, items from older versions are dropped (counted in
        ``dropped_stale``), never delivered; an item from a *newer* version is a caller
        error. ``batch_size=None`` takes everything available now."""
        if not self.selector.consumes:
            raise ConfigError("selector", "Fifo() for take()", self.selector.name,
                              "build the buffer with selector=Fifo() for on-policy data")
        with self._cond:
            self._check_open()
            if batch_size is not None:
                self._check_batch_size(batch_size)
                if batch_size > self.capacity:
                    raise CapacityError(f"batch_size: expected at most capacity={self.capacity}, got "
                                        f"{batch_size}. Fix: raise capacity or take smaller batches.")

                def enough() -> bool:
                    self._drop_stale(policy_version)
                    return self._available(policy_version) >= batch_size
                if not enough():
                    if not wait:
                        raise ExperienceTimeout(
                            f"take: expected {batch_size} items of policy version {policy_version}, "
                            f"{self._available(policy_version)} are available. Fix: flush the "
                            "producers first, or take batch_size=None for what is there.")
                    self._wait(enough, timeout, f"{self._available(policy_version)} of {batch_size} "
                               f"items of version {policy_version} available", kind="take")
            else:
                self._drop_stale(policy_version)
            avail = self._available(policy_version)
            k = avail if batch_size is None else batch_size
            seqs = np.arange(self.ring.head, self.ring.head + k, dtype=np.int64)
            slots = seqs % self.capacity
            data = self._gather(slots, device) if k else {f.name: torch.empty((0, *f.shape), dtype=f.dtype)
                                                           for f in self.spec}
            versions = self.meta["version"][slots].copy()
            self.ring.head += k
            self._sampled += k
            self._cond.notify_all()
            return Batch(data, slots=slots, seqs=seqs, versions=versions, inserted_at_selection=self.ring.inserted)

    def _drop_stale(self, policy_version: int | None) -> None:
        if policy_version is not None:
            self._dropped_stale += self.ring.drop_stale_prefix(policy_version)

    def _available(self, policy_version: int | None) -> int:
        return self.ring.queued(policy_version)

    # ------------------------------------------------------------- rollback
    def selection_token(self) -> tuple:
        """The selection-side state (RNG, counters) before a speculative delivery."""
        with self._cond:
            return (self.rng.bit_generator.state, self._sampled, self.ring.head, self._dropped_stale)

    def rollback_selection(self, token: tuple, *, items: int, restore_rng: bool) -> None:
        """Undo a speculative delivery that was never handed out: its items count as not
        sampled (so rate limits stay exact) and, if asked, the RNG continues as if the
        selection never happened (so overlapped runs draw what sequential runs draw)."""
        with self._cond:
            if restore_rng:
                self.rng.bit_generator.state = token[0]
            self._sampled -= items
            self._cond.notify_all()

    # ------------------------------------------------------------ priorities
    def update_priorities(self, slots: np.ndarray, priorities: Any, *, seqs: np.ndarray | None = None) -> int:
        """Set new priorities for delivered items. With ``seqs`` (from the Batch), items
        overwritten since they were delivered are skipped. Returns how many were updated."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        pr = priorities.detach().cpu().numpy() if isinstance(priorities, torch.Tensor) else np.asarray(priorities)
        pr = pr.reshape(-1)
        if pr.shape[0] != slots.shape[0]:
            raise SpecError("priorities", f"{slots.shape[0]} values (one per delivered item)", pr.shape[0],
                            "pass one priority per row of the batch")
        with self._cond:
            self._check_open()
            if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
                bad = int(slots[(slots < 0) | (slots >= self.capacity)][0])
                raise SpecError("slots", f"ring slots in [0, {self.capacity})", bad,
                                "pass the slots of a delivered Batch (batch.slots) with batch.seqs")
            stored = self.meta["seq"][slots]
            if seqs is not None:
                keep = stored == np.asarray(seqs).reshape(-1)
                if not keep.all():  # rows overwritten since delivery: skipped
                    slots, pr = slots[keep], pr[keep]
            elif slots.size and not (live := self.ring.live(slots, stored)).all():
                bad = int(slots[~live][0])
                raise SpecError("slots", "slots that hold a stored row", f"slot {bad} (empty or evicted)",
                                "pass the slots of a delivered Batch, with its seqs so rows overwritten since "
                                "are skipped")
            self.selector.update_priorities(slots, pr)
            return int(slots.shape[0])

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Everything needed to continue exactly: data, metadata, selector, counters, RNG.
        Values are numpy arrays, numbers, strings, lists and dicts (no pickle needed)."""
        with self._cond:
            self._check_open()
            stored = min(self.ring.inserted, self.capacity)
            rows = self._with_lost_shards(lambda: self.storage.read_rows(0, stored))  # what survives
            data = {k: v.cpu().numpy() if v.dtype != torch.bfloat16 else v.view(torch.int16).numpy()
                    for k, v in rows.items()}
            return {
                "schema_version": SCHEMA_VERSION,
                "spec": self.spec.to_config(),
                "capacity": self.capacity,
                "selector": self.selector.to_config(),
                "selector_state": self.selector.state_dict(),
                "counters": {"inserted": self.ring.inserted, "sampled": self._sampled, "head": self.ring.head,
                             "dropped_stale": self._dropped_stale, "floor": self.ring.floor,
                             "evicted_early": self.ring.evicted_early, "holes": self.ring.holes},
                "pools": {name: pool.state() for name, pool in self.storage.pools.items()},
                "open_tail": [[int(k), int(v)] for k, v in self.ring.open_tail.items()],
                "rng": self.rng.bit_generator.state,
                "data": data,
                "meta": {k: v[:stored].copy() for k, v in self.meta.items()},
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from ``state_dict`` (exact round trip), all or nothing: every
        part is checked (spec, capacity, selector, counters against the data, metadata,
        priorities, frame pools, RNG) before the first byte of this buffer changes, so a
        damaged state raises ``StateError`` and leaves the buffer as it was."""
        checked = check_state(state, spec=self.spec, capacity=self.capacity, selector=self.selector,
                              pools=self.storage.pools, rng_kind=type(self.rng.bit_generator).__name__)
        with self._cond:
            self._check_open()
            enc, meta, c, stored = checked["data"], checked["meta"], checked["counters"], checked["stored"]
            if stored:
                self.storage.write(0, enc, stored)
            written = min(self.ring.inserted, self.capacity)  # slots this buffer wrote before: cleared past `stored`
            for k in META_FIELDS:
                self.meta[k][:stored] = meta[k]
                if written > stored:
                    self.meta[k][stored:written] = 0
            self.ring.inserted, self._sampled = c["inserted"], c["sampled"]
            self.ring.head, self._dropped_stale = c["head"], c["dropped_stale"]
            self.ring.floor, self.ring.evicted_early = c["floor"], c["evicted_early"]
            self.ring.holes = c["holes"]
            for name, pstate in checked["pools"].items():
                self.storage.pools[name].load(pstate)
            self.ring.open_tail = checked["open_tail"]
            self.rng.bit_generator.state = checked["rng"]
            self.selector.load_state_dict(checked["selector_state"])
            self._cond.notify_all()

    # ----------------------------------------------------------------- close
    def _check_open(self) -> None:
        if self._closed:
            from .errors import ClosedError
            raise ClosedError("the buffer is closed. Fix: build a new one; state_dict() before close() keeps the data.")

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self.storage.close()
            self.ring.close()
            self.ring.meta = {}
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


def _check_memory(capacity: int, spec: ExperienceSpec, shards, selector: Selector) -> None:
    """Refuse a capacity the tiers cannot hold, before anything is allocated: each tier's
    columns, plus the per-slot metadata (and the selector's per-slot state, e.g. priority
    trees) in host or shared memory."""
    row = spec.stored_bytes_per_transition
    prioritized = selector.bytes_per_slot > 0
    meta = needed_bytes(capacity, 0, selector_bytes_per_slot=selector.bytes_per_slot)
    need: dict[Tier, int] = {}
    for shard in shards:   # each kind says what it takes from which tier (pinned pages come from host RAM)
        for tier, n in shard_class(shard.kind).memory_needed(shard, row).items():
            need[tier] = need.get(tier, 0) + n
    shared = any(s.tier is Tier.SHARED for s in shards)
    need[Tier.SHARED if shared else Tier.PAGEABLE] = need.get(Tier.SHARED if shared else Tier.PAGEABLE, 0) + meta
    for tier, n in need.items():
        free = available_bytes(tier)
        if free is not None and n > free:
            raise CapacityError(
                f"capacity: {capacity} transitions of {row} B need {fmt(n)} on tier '{tier.value}' (columns and "
                f"per-slot metadata{', priority trees' if prioritized else ''}), {fmt(free)} is free there. Fix: "
                "lower capacity, or place part of it on another tier (shards=[ShardSpec(...), ...]; `conduit plan` "
                "sizes them).")


def replay(*, spec: ExperienceSpec, capacity: int, seed: int = 0, **kw) -> ExperienceBuffer:
    """Preset: uniform replay (RLlib's EpisodeReplayBuffer semantics)."""
    return ExperienceBuffer(spec=spec, capacity=capacity, selector=Uniform(), seed=seed, **kw)


def prioritized_replay(*, spec: ExperienceSpec, capacity: int, alpha: float = 0.6, beta: float = 0.4,
                       seed: int = 0, **kw) -> ExperienceBuffer:
    """Preset: proportional prioritized replay (RLlib's PrioritizedEpisodeReplayBuffer semantics)."""
    return ExperienceBuffer(spec=spec, capacity=capacity, selector=Prioritized(alpha=alpha, beta=beta),
                            seed=seed, **kw)


def queue(*, spec: ExperienceSpec, capacity: int, **kw) -> ExperienceBuffer:
    """Preset: FIFO consume-once queue for on-policy data."""
    return ExperienceBuffer(spec=spec, capacity=capacity, selector=Fifo(), **kw)
