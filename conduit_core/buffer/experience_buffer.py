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

import logging
from functools import partial
from typing import Any, Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike
import torch

from ..errors import CapacityError, ClosedError, ConfigError, require_int, require_int_array
from ..memory.output_pool import OutputPool
from ..memory.tiers import Tier
from ..schema.spec import ExperienceSpec
from ..selection.rate_gate import BufferCondition
from ..selection.rate_limiter import RateLimiter
from ..selection.selectors import Fifo, Prioritized, Selector, Uniform
from ..source import source_commit, writer_placement
from ..storage.columnar import ColumnarStorage
from ..storage.shards import ShardSpec, check_layout_fits
from . import delivery, insertion
from .buffer_state import capture_state, check_state_for, restore_state, same_layout, state_layout
from .episodes import EpisodeWalk
from .inline_insert import InlineInsert
from .ring import Ring
from . import row_draw, window_draw
from .routes import Routes
from .row_draw import PooledRowDraw
from .sampling_args import SamplingChecks
from .shard_loss import ShardLoss, ShardLossRecovery
from .window_draw import PooledWindowDraw

log = logging.getLogger("conduit")

__all__ = ["ExperienceBuffer", "ShardLoss", "prioritized_replay", "queue", "replay"]


class ExperienceBuffer:
    """Columnar replay/queue storage of one experience spec.

    Keyword-only. ``selector``: Uniform() (default), Prioritized(...) or Fifo().
    ``shards`` places slot ranges on tiers (default: one shard on ``tier``).
    ``reuse_outputs=k``: reuse output memory for host batches (1-step gathers of every field; redraw-rule
    windows' columns, returns, steps and weights), each valid through k more deliveries (the pool
    cycles k + 1 sets per shape, more while a learner holds batches longer); 0 = fresh memory per delivery.
    ``seed`` seeds the selection RNG.

    What a user calls: ``add``, ``sample``, ``sample_sequences``, ``take``, ``read``,
    ``update_priorities``, ``evict``, ``state_dict``/``load_state_dict``, ``close``, the counts
    (``size``, ``capacity``, ``inserted``, ``sampled``, ``dropped_stale``, ``losses``), writers at
    the source (``writer``, ``commit``) and ``routes`` (which implementation carried out each
    call). The parts, for those who compose their own: ``spec``, ``selector``, ``rate_limiter``,
    ``storage``, ``ring``, ``walk``, ``output_pool``, and the encoded route in (``encode``,
    ``add_encoded``, ``add_encoded_many``, ``gather``, ``stored_columns``). The rest is the protocol
    between the buffer and the core's other parts, not meant for a training loop: a migration's
    (``attach_dual_writer``, ``detach_dual_writer``, ``adopt_layout``, ``migrating``,
    ``live_range``), a data plane's speculative deliveries (``selection_token``,
    ``rollback_selection``), writers at the source (``retire_writer``, ``abandon_before``) and
    ``check_open``, ``meta``. What delivery needs of the output pool it asks the pool itself
    (``delivery.gathers_pooled``, ``window_outputs``, ``reserve_prepared_outputs``).
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
        require_int("seed", seed, fix="pass an int seed, e.g. seed=0")
        require_int("reuse_outputs", reuse_outputs, fix="pass how many deliveries an output stays valid for, "
                                                         "e.g. reuse_outputs=4, or 0 for fresh memory each time")
        self.spec = spec
        self.row_bytes = spec.bytes_per_transition  # delivered bytes per row (checked per sample: cached)
        capacity = int(capacity)
        shards = list(shards) if shards else [ShardSpec(Tier.parse(tier), capacity)]
        if sum(s.capacity for s in shards) != capacity:
            raise ConfigError("shards", f"capacities summing to capacity={capacity}",
                              sum(s.capacity for s in shards), "make the shard capacities add up to capacity")
        self.selector = selector if selector is not None else Uniform()
        if not isinstance(self.selector, Selector):
            raise ConfigError("selector", "a Selector (Uniform(), Prioritized(...), Fifo())",
                              type(self.selector).__name__, "pass one of the selectors in conduit_core")
        check_layout_fits(capacity, spec, shards, self.selector.bytes_per_slot)
        self.selector.bind(capacity)
        self.rate_limiter = rate_limiter or RateLimiter()
        self.done_fields = tuple(f for f in done_fields if f in spec)
        self.sampling_checks = SamplingChecks()   # sample()'s argument checks, remembered once passed
        self.walk = EpisodeWalk(spec, self.done_fields)  # n-step windows and sequences over the ring
        self.storage = ColumnarStorage(spec=spec, shards=shards)
        try:
            self.ring = Ring(capacity, shared=any(s.tier is Tier.SHARED for s in shards))
        except BaseException:  # a constructor that fails part-way returns what it took, at once
            self.storage.close()
            raise
        self.rng = np.random.default_rng(seed)
        self._seed = seed
        self.counts = delivery.DeliveryCounts()   # items delivered, and FIFO items dropped as stale
        self.dual_writer = None   # an active Migration (see migration.py) receives every insert and eviction
        # storage operations run through it: a lost remote shard's rows leave, reported, and the
        # operation runs again on a new shard (shard_loss.py); run_storage(op) is its run
        self.recovery = ShardLossRecovery(self)
        self.run_storage = self.recovery.run
        self.ingest_ledger = source_commit.CommitLedger()   # receipts of writers at the source, each taken once
        self._cond = BufferCondition()
        self.lock = self._cond   # the buffer's lock and condition, for its parts (read-only)
        self.closed = False   # (read-only for others: hot paths test it without a Python call)
        self._out = OutputPool(reuse_outputs, self.storage.stored_numpy_dtypes()) if reuse_outputs > 0 else None
        # the implementations of a draw and an insert, and the facts that choose among them (routes.py)
        self.routes = Routes(None if self._out is None else PooledRowDraw(self, self._out),
                             None if self._out is None else PooledWindowDraw(self, self._out),
                             InlineInsert(self), row_draw.fits, partial(window_draw.fits, walk=self.walk))
        log.info("conduit: experience buffer built: capacity %d, selector %s, %d B a row stored (%d delivered), "
                 "shards %s", capacity, self.selector.name, spec.stored_bytes_per_transition, self.row_bytes,
                 ", ".join(f"{s.kind or s.tier.value}:{s.capacity}" for s in shards))

    # ------------------------------------------------------------ properties
    def __len__(self) -> int:
        return self.size

    @property
    def size(self) -> int:
        """Items currently stored (for FIFO: not yet consumed)."""
        if self.selector.consumes:
            return self.ring.queued()
        return self.ring.stored_count()

    @property
    def capacity(self) -> int:
        return self.ring.capacity

    @property
    def meta(self) -> dict[str, np.ndarray]:
        """The ring's per-slot metadata (seq, version, source, next_seq): read-only for others."""
        return self.ring.meta

    @property
    def inserted(self) -> int:
        return self.ring.inserted

    @property
    def sampled(self) -> int:
        return self.counts.sampled

    @property
    def dropped_stale(self) -> int:
        return self.counts.dropped_stale

    # ---------------------------------------------------------------- insert
    def encode(self, batch: Mapping[str, Any]) -> tuple[int, dict[str, torch.Tensor]]:
        """Validate and encode a batch; pure with respect to the buffer (stores nothing)."""
        n, enc = self.spec.validate_and_encode(batch)
        if n > self.ring.capacity:
            raise CapacityError(f"batch: expected at most capacity={self.capacity} transitions, got {n}. "
                                "Fix: raise the buffer capacity or ingest the rollout in smaller pieces.")
        return n, enc

    # the write side (insertion.py): add a batch; the entry for batches ``encode`` already checked
    add = insertion.add
    add_encoded = insertion.add_encoded
    add_encoded_many = insertion.add_encoded_many

    # ingestion at the source (source_writer.py, source_commit.py): writers stage in a shard's actor,
    # commit takes each receipt once (the rows never pass through here); abandon and retire free them
    writer = writer_placement.make_writer
    commit = source_commit.commit
    abandon_before = source_commit.abandon_before
    retire_writer = source_commit.retire_writer

    # ------------------------------------------------------------ lost shards

    @property
    def losses(self) -> list["ShardLoss"]:
        """Every remote shard lost so far: which, its rows (count and exact seqs), the cause,
        and where the empty shard that replaced it runs."""
        with self._cond:
            return list(self.recovery.losses)

    # -------------------------------------------------------------- eviction
    def evict(self, seqs: ArrayLike) -> int:
        """Remove stored rows before the ring would overwrite them: a framework's own
        eviction rule (RLlib's is whole oldest episodes) on top of the ring's. Rows already
        gone are skipped. Removed rows are never delivered again (uniform selection redraws
        a removed slot; a prioritized one has priority 0); the ring reuses their slots in
        turn. Returns how many rows were removed."""
        if self.selector.consumes:
            raise ConfigError("evict()", "a replay buffer (a selector that does not consume)",
                              f"{self.selector.name} (consumes=True)", "queued data leaves when it is taken; use take()")
        seqs = np.unique(require_int_array("seqs", seqs, fix="pass the seqs of the rows to remove"))
        with self._cond:
            self.check_open()
            seqs, slots = self.ring.remove(seqs)
            if not seqs.size:
                return 0
            self.selector.on_evict(slots)
            if self.dual_writer is not None:
                self.dual_writer.on_evict(seqs)
            self._cond.notify_all()
            return int(seqs.size)


    @property
    def migrating(self) -> bool:
        return self.dual_writer is not None

    # ------------------------------------------------- layout changes (migration.py)
    def check_open(self) -> None:
        """Raise ClosedError if the buffer is closed."""
        if self.closed:
            raise ClosedError("the buffer is closed. Fix: build a new one; state_dict() before close() keeps the data.")

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
            self.check_open()
            if self.dual_writer is not None:
                raise ConfigError("migration", "one migration at a time", "another one running",
                                  "finish() the running migration first")
            self.dual_writer = writer
            return self.ring.lo(), self.ring.inserted

    def detach_dual_writer(self, writer) -> None:
        with self._cond:
            if self.dual_writer is writer:
                self.dual_writer = None

    def stored_columns(self, seqs: np.ndarray, fields=None) -> dict[str, torch.Tensor]:
        """Every field (or ``fields``) of rows ``seqs`` as stored (encoded), on the host: what a copy moves."""
        slots = np.asarray(seqs, dtype=np.int64) % self.capacity
        names = [f.name for f in self.spec] if fields is None else list(fields)
        return {name: self.storage.gather_stored(name, slots) for name in names}

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
            self.dual_writer = None
            self._cond.notify_all()
            return old

    # ---------------------------------------------------------------- delivery
    # The read side's entry points are defined in delivery.py, over the buffer's public parts.
    sample = delivery.sample
    sample_sequences = delivery.sample_sequences
    take = delivery.take
    read = delivery.read
    update_priorities = delivery.update_priorities

    @property
    def output_pool(self) -> OutputPool | None:
        """The reused outputs (``reuse_outputs``; None: fresh memory): draws ``bind`` their batches to them."""
        return self._out

    def gather(self, slots: np.ndarray, device=None, fields=None) -> dict[str, torch.Tensor]:
        """Decoded rows at ``slots`` (lock held), into the reused outputs when the buffer keeps them."""
        if self._out is None or fields is not None:
            return self.storage.gather(slots, device=None if device is None else torch.device(device), fields=fields)
        out, views = self._out.get(slots.shape)
        if device is None and slots.ndim == 1 and self.storage.takes_into():   # straight into the reused outputs
            return self.storage.gather_reused(slots, out, views)
        return self.storage.gather(slots, device=None if device is None else torch.device(device),
                                   out=out, out_tensors=views)

    # ------------------------------------------------------------- rollback
    def selection_token(self) -> tuple:
        """The selection-side state (RNG, counters) before a speculative delivery."""
        with self._cond:
            return (self.rng.bit_generator.state, self.counts.sampled, self.ring.head, self.counts.dropped_stale)

    def rollback_selection(self, token: tuple, *, items: int, restore_rng: bool) -> None:
        """Undo a speculative delivery that was never handed out: its items count as not
        sampled (so rate limits stay exact) and, if asked, the RNG continues as if the
        selection never happened (so overlapped runs draw what sequential runs draw)."""
        with self._cond:
            if restore_rng:
                self.rng.bit_generator.state = token[0]
            self.counts.sampled -= items
            self._cond.notify_all()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Everything needed to continue exactly: data, metadata, selector, counters, RNG.
        Values are numpy arrays, numbers, strings, lists and dicts (no pickle needed)."""
        with self._cond:
            self.check_open()
            return capture_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from ``state_dict`` (exact round trip), all or nothing: every
        part is checked (spec, capacity, selector, counters against the data, metadata,
        priorities, frame pools, RNG) before the first byte of this buffer changes, so a
        damaged state raises ``StateError`` and leaves the buffer as it was."""
        layout = state_layout(self)
        checked = check_state_for(self, state, layout)   # (outside the lock: a big state's checks stall no caller)
        with self._cond:
            self.check_open()
            if self.dual_writer is not None:   # its copy would bring rows of before the load back at finish()
                raise ConfigError("load_state_dict", "no migration in progress", "a migration copying the buffer",
                                  "wait for the migration to finish (its handle's wait()), then load")
            if not same_layout(state_layout(self), layout):   # a migration finished during the checks:
                checked = check_state_for(self, state, state_layout(self))   # checked again for what it built
            if self.storage.may_lose_shards:   # a shard lost mid-load: replaced, and the whole load runs again
                self.run_storage(lambda: restore_state(self, checked))
            else:
                restore_state(self, checked)
            self._cond.notify_all()

    # ----------------------------------------------------------------- close
    def close(self) -> None:
        with self._cond:
            if self.closed:
                return
            self.closed = True
            self.storage.close()
            self.ring.close()
            self.ring.meta = {}
            self._cond.notify_all()


def replay(*, spec: ExperienceSpec, capacity: int, seed: int = 0, **kw: Any) -> ExperienceBuffer:
    """Preset: uniform replay (RLlib's EpisodeReplayBuffer semantics)."""
    return ExperienceBuffer(spec=spec, capacity=capacity, selector=Uniform(), seed=seed, **kw)


def prioritized_replay(*, spec: ExperienceSpec, capacity: int, alpha: float = 0.6, beta: float = 0.4,
                       seed: int = 0, **kw: Any) -> ExperienceBuffer:
    """Preset: proportional prioritized replay (RLlib's PrioritizedEpisodeReplayBuffer semantics)."""
    return ExperienceBuffer(spec=spec, capacity=capacity, selector=Prioritized(alpha=alpha, beta=beta),
                            seed=seed, **kw)


def queue(*, spec: ExperienceSpec, capacity: int, **kw: Any) -> ExperienceBuffer:
    """Preset: FIFO consume-once queue for on-policy data."""
    return ExperienceBuffer(spec=spec, capacity=capacity, selector=Fifo(), **kw)
