"""Selectors decide *which* slots a delivery reads; the storage turns slots into data.

Every selector is a small object with explicit state (numpy arrays and counters)
and a ``state_dict``. They are driven by the buffer, which holds the lock:

    on_insert(start, n)        n new items were written at ring slots start.. (wrapping)
    select(batch_size, rng)    -> (slots, weights or None)
    update_priorities(slots, priorities)          (prioritized only)

Presets over the same primitive (cf. Reverb's ``Table.queue``) live in ``buffer/experience_buffer.py``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import inspect
import math
from abc import ABC, abstractmethod

import numpy as np
from numpy.typing import ArrayLike

from ..errors import ConfigError, SpecError, StateError, require_int_array
from ..memory.budget import PRIORITY_BYTES_PER_SLOT
from .sumtree import PriorityIndex

try:
    from .._native._draws import uniform_ints as _c_uniform_ints
except ImportError:  # pragma: no cover - no C compiler where it was installed
    _c_uniform_ints = None
try:
    from .._native._sumtree import draw_weighted as _c_draw_weighted
    from .._native._sumtree import set_delivered as _c_set_delivered
    from .._native._sumtree import set_priorities
except ImportError:  # pragma: no cover - no C compiler where it was installed
    _c_draw_weighted = _c_set_delivered = set_priorities = None


def uniform_ints(rng: np.random.Generator, n: int, count: int) -> np.ndarray:
    """``count`` draws uniform on ``[0, n)`` from ``rng``'s bit generator: exactly uniform
    (Lemire's method in C; ``Generator.integers`` costs ~8 us per call in argument handling)."""
    if _c_uniform_ints is None or n < 1:
        return rng.integers(0, n, count, dtype=np.int64)
    out = np.empty(count, dtype=np.int64)
    bits = rng.bit_generator
    with bits.lock:
        _c_uniform_ints(bits.capsule, n, out)
    return out


_I64, _F64, _F32 = np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.float32)


def delivered_update_args(slots: Any, seqs: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """A priority update's arguments as the selector takes them: 1-D int64 slots and seqs and 1-D
    float64 or float32 priorities of one length, each named when it is not. A delivered batch's
    own arrays pass through as they are (checked by identity of their dtypes: this is per step)."""
    if type(slots) is np.ndarray and slots.dtype is _I64 and slots.ndim == 1 and type(priorities) is np.ndarray \
            and (priorities.dtype is _F64 or priorities.dtype is _F32) and priorities.shape == slots.shape \
            and (seqs is None or (type(seqs) is np.ndarray and seqs.dtype is _I64 and seqs.shape == slots.shape)):
        return slots, seqs, priorities   # (contiguous or not: a native update declines a strided one to the reference)
    slots = require_int_array("slots", slots, fix="pass the delivered batch's slots (batch.slots)")
    if seqs is not None:
        seqs = require_int_array("seqs", seqs, fix="pass the delivered batch's seqs (batch.seqs)")
        if seqs.shape != slots.shape:
            raise SpecError("seqs", f"{slots.shape[0]} seqs (one per slot)", seqs.shape[0],
                            "pass the slots and seqs of the same delivered batch")
    pr = np.asarray(priorities.detach().cpu() if hasattr(priorities, "detach") else priorities)   # (a torch tensor)
    pr = pr.reshape(-1)
    if pr.dtype != _F64 and pr.dtype != _F32:
        pr = pr.astype(np.float64)
    if pr.shape[0] != slots.shape[0]:
        raise SpecError("priorities", f"{slots.shape[0]} values (one per delivered item)", pr.shape[0],
                        "pass one priority per row of the batch")
    return (np.ascontiguousarray(slots), None if seqs is None else np.ascontiguousarray(seqs),
            np.ascontiguousarray(pr))



def floored(priorities: np.ndarray, abs_floor: float | None) -> np.ndarray:
    """Priorities as float64, given as TD errors when ``abs_floor`` is set: ``max(|p|, abs_floor)``."""
    pr = priorities.astype(np.float64, copy=False)
    return pr if abs_floor is None else np.maximum(np.abs(pr), abs_floor)


def require_ring_slots(slots: np.ndarray, capacity: int) -> None:
    """Refuse a slot outside a ring of ``capacity`` slots, naming the first."""
    if slots.size and (slots.min() < 0 or slots.max() >= capacity):
        bad = int(slots[(slots < 0) | (slots >= capacity)][0])
        raise SpecError("slots", f"ring slots in [0, {capacity})", bad,
                        "pass the slots of a delivered Batch (batch.slots) with batch.seqs")

class Selector(ABC):
    """Chooses slots among the ``size`` valid ones of a ring of ``capacity`` slots."""

    name: str = "abstract"
    # The remover rule (Reverb's max_times_sampled=1): a row is delivered once, then leaves.
    # A consuming selector is driven by ``ExperienceBuffer.take()``, which asks its ``select``
    # for positions among the queued rows (oldest first) and removes the rows delivered; the
    # buffer never overwrites a queued row (a full queue makes inserts wait). FIFO, LIFO and
    # any consuming selector of your own are selectors like the others. The ring frees slots
    # oldest first: a row taken from behind the oldest queued one frees its slot once the rows
    # before it leave, so a LIFO's room is what lies beyond its oldest queued row.
    consumes: bool = False
    # Selection follows per-row priorities the learner updates: it draws ring slots from its
    # own index (not positions in the live window), delivers importance weights, and a batch
    # drawn before a priority update is not the one the framework would draw after it.
    # A weighted selector keeps ``trees`` (sum tree, min tree, leaf offset), which the fused walk reads.
    weighted: bool = False
    # Not weighted: ``select`` returns positions among the stored rows, oldest first.
    # ``order_free``: its distribution is the same under any reordering of the rows (plain
    # uniform), so the buffer may skip mapping positions to slots.
    order_free: bool = False
    # The fused native pass (select, walk the n-step window, redraw a cut one) draws exactly
    # this selector's distribution: plain uniform and independent prioritized draws do.
    native_windows: bool = False
    # Each item of a batch is drawn independently of the others (with replacement, not
    # stratified), so one draw of k * B items split into k batches has the distribution of k
    # draws of B: what lets a delivery call draw its g_del batches at once.
    independent_items: bool = False
    bytes_per_slot: int = 0  # memory the selector keeps per ring slot (priority trees)
    # A weighted selector whose ``select`` takes ``weights_out`` (a float32 [batch_size] array)
    # and returns it filled with the weights: a pooled batch's weights are then written in place.
    # Read from each class's own ``select`` signature (``__init_subclass__``), so a subclass
    # that overrides ``select`` without the parameter is never passed it.
    fills_weights_out: bool = False
    # Whether ``update_delivered`` takes ``abs_floor`` (a selector written before it did not: the
    # buffer floors the priorities for it instead). Read from each class's own signature.
    floors_priorities: bool = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.fills_weights_out = "weights_out" in inspect.signature(cls.select).parameters
        cls.floors_priorities = "abs_floor" in inspect.signature(cls.update_delivered).parameters

    def bind(self, capacity: int) -> None:
        self.capacity = capacity

    def rebind(self, capacity: int, old_slots: np.ndarray, new_slots: np.ndarray) -> None:
        """The ring moves to ``capacity`` slots (a migration): the live rows at ``old_slots``
        now sit at ``new_slots``. Selectors that keep per-row state carry it over."""
        self.bind(capacity)

    def on_insert(self, start: int, n: int, size: int) -> None:
        """Items were written at slots ``start .. start+n`` (mod capacity); ``size`` valid now."""

    @abstractmethod
    def select(self, batch_size: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
        ...

    def on_evict(self, slots: np.ndarray) -> None:
        """The rows at ``slots`` were removed: they must not be selected again."""

    def update_delivered(self, slots: np.ndarray, seqs: np.ndarray, priorities: np.ndarray,
                         stored_seqs: np.ndarray, *, abs_floor: float | None = None) -> int:
        """A delivered batch's priority update: the rows whose slot still holds the seq they
        were delivered with (``stored_seqs`` is the ring's seq column) get their priority (with
        ``abs_floor``: ``max(|p|, abs_floor)``); rows overwritten since are skipped. Returns how
        many were set. ``slots`` and ``seqs`` are 1-D int64, ``priorities`` 1-D float64 or
        float32, all of one length (the buffer checks that first; they may be strided views). Bad values raise with nothing
        changed.

        This is the reference a selector's faster update must equal; a selector keeping
        priorities gets it by implementing ``update_priorities``."""
        slots, seqs, priorities = delivered_update_args(slots, seqs, priorities)
        require_ring_slots(slots, stored_seqs.shape[0])
        pr = floored(priorities, abs_floor)
        keep = stored_seqs[slots] == seqs
        if not keep.all():   # rows overwritten since delivery: skipped
            slots, pr = slots[keep], pr[keep]
        self.update_priorities(slots, pr)
        return int(slots.shape[0])

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        raise ConfigError("selector", "a prioritized selector for update_priorities", self.name,
                          "build the buffer with selector=Prioritized(...) or stop updating priorities")

    def check_initial_priorities(self, n: int, priorities: ArrayLike) -> np.ndarray:
        """Validate priorities given with an insert of ``n`` items (instead of the running max);
        returns them as float64. Changes nothing."""
        raise ConfigError("priorities", "no priorities at insert for a non-prioritized selector", self.name,
                          "build the buffer with selector=Prioritized(...) or add without priorities")

    def set_initial_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set checked initial priorities of the items just inserted at ``slots``."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def check_state(self, state: dict) -> None:
        """Raise StateError if ``state`` cannot be loaded; changes nothing."""

    def to_config(self) -> dict:
        return {"name": self.name}


class Uniform(Selector):
    """Uniform over every stored item: with replacement (RLlib's and Reverb's default), or
    ``replace=False``: no item twice within one batch (SRL's replay buffers, TorchRL's
    ``SamplerWithoutReplacement`` per batch)."""

    name = "uniform"

    def __init__(self, *, replace: bool = True, draw: Callable[..., np.ndarray] | None = None) -> None:
        """``draw``: the hook for exact equivalence with a framework's own buffer. A callable
        ``draw(count, batch_size)`` returning ``batch_size`` ints in ``[0, count)``, each the
        position of an item among the ``count`` stored ones, oldest first; it consumes the
        framework's RNG stream exactly as the framework's sampler does (e.g. minirl's
        ``rng.randrange(len(items))`` per item), so both deliver the same rows in the same
        order, not only the same distribution. The buffer's own RNG is then not used for
        selection, and the callable's RNG state is not part of the buffer's state."""
        if not isinstance(replace, (bool, np.bool_)):
            raise ConfigError("Uniform.replace", "True or False", repr(replace),
                              "pass replace=False to draw distinct items per batch")
        if draw is not None and (not callable(draw) or not replace):
            raise ConfigError("Uniform.draw", "a callable (count, batch_size) -> positions, with replace=True",
                              repr(draw), "pass a function that draws as the framework's sampler does")
        self.replace = bool(replace)
        self.draw = draw

    @property
    def order_free(self) -> bool:
        # an external draw's positions must mean the framework's order; a draw without
        # replacement must see the live rows only (a redraw of a removed one could repeat a row)
        return self.draw is None and self.replace

    @property
    def native_windows(self) -> bool:
        return self.draw is None and self.replace

    @property
    def independent_items(self) -> bool:
        return self.draw is None and self.replace   # an external draw may couple a batch's items

    def select(self, batch_size: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, None]:
        if self.draw is not None:
            return self._external(batch_size, size), None
        if self.replace:
            return uniform_ints(rng, size, batch_size), None
        if batch_size > size:
            raise ConfigError("batch_size", f"at most the {size} stored items (Uniform(replace=False))",
                              batch_size, "wait until more items are stored (a warm-up) or draw with replacement")
        return rng.choice(size, batch_size, replace=False).astype(np.int64), None

    def _external(self, batch_size: int, size: int) -> np.ndarray:
        got = np.asarray(self.draw(size, batch_size))
        if got.shape != (batch_size,) or got.dtype.kind not in "iu" or (got.size and (got.min() < 0 or got.max() >= size)):
            raise ConfigError("Uniform.draw(count, batch_size)", f"{batch_size} ints in [0, {size})",
                              f"shape {got.shape}, dtype {got.dtype}" + (f", range [{got.min()}, {got.max()}]"
                                                                          if got.size else ""),
                              "return one position per item, oldest stored item = 0")
        return got.astype(np.int64, copy=False)

    def to_config(self) -> dict[str, Any]:
        return {"name": self.name, "replace": self.replace}


class Prioritized(Selector):
    """Proportional prioritized replay (Schaul et al. 2016), as RLlib implements it:
    P(i) = p_i^alpha / sum_j p_j^alpha; new items get the running max priority;
    weights w_i = (N P(i))^-beta / max_j (N P(j))^-beta (normalised by the global minimum)."""

    name = "prioritized"
    weighted = True

    @property
    def native_windows(self) -> bool:
        return not self.stratified  # the walk draws items independently

    @property
    def independent_items(self) -> bool:
        return not self.stratified   # stratified: one stratum per item of the batch being drawn
    bytes_per_slot = PRIORITY_BYTES_PER_SLOT  # the sum and min trees

    def __init__(self, *, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6, stratified: bool = False):
        for name, v, fix in (("alpha", alpha, "use e.g. alpha=0.6 (0 = uniform)"),
                             ("beta", beta, "use e.g. beta=0.4 (0 = no correction)"),
                             ("eps", eps, "use e.g. eps=1e-6 (added to every priority; 0 = none)")):
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not np.isfinite(v) or v < 0:
                raise ConfigError(f"Prioritized.{name}", "a finite number >= 0", repr(v), fix)
        if not isinstance(stratified, (bool, np.bool_)):
            raise ConfigError("Prioritized.stratified", "True or False", repr(stratified),
                              "True draws one item from each of batch_size equal slices of the priority mass")
        self.alpha, self.beta, self.eps = float(alpha), float(beta), float(eps)
        # stratified: item i of a batch is drawn from the i-th of batch_size equal slices of the total
        # mass (SRL's and Schaul et al.'s proportional sampling); otherwise independent draws (RLlib)
        self.stratified = bool(stratified)
        self.max_priority = 1.0

    def _masses(self, batch_size: int, total: float, rng: np.random.Generator) -> np.ndarray:
        """Prefix-sum targets in [0, total): independent, or one per equal slice (stratified)."""
        u = rng.random(batch_size)
        m = (u + np.arange(batch_size)) * (total / batch_size) if self.stratified else u * total
        return np.minimum(m, np.nextafter(total, 0))  # rounding must not reach past the last item

    def bind(self, capacity: int) -> None:
        super().bind(capacity)
        self.index = PriorityIndex(capacity)
        self.trees = self.index.trees()   # (sum, min, leaf offset): fixed for the index's life; read-only

    def rebind(self, capacity: int, old_slots: np.ndarray, new_slots: np.ndarray) -> None:
        priorities = self.index.get(old_slots).copy()
        self.bind(capacity)
        self.index.set(new_slots, priorities)

    def on_insert(self, start: int, n: int, size: int) -> None:
        self.index.set_range(start, n, self.max_priority ** self.alpha)

    def on_evict(self, slots: np.ndarray) -> None:
        self.index.set(slots, 0.0)

    def select(self, batch_size: int, size: int, rng: np.random.Generator, *, beta: float | None = None,
               weights_out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """(slots, float32 importance weights); the weights go into ``weights_out`` if given."""
        beta = self.beta if beta is None else beta
        if self.index.use_c:  # draws, search and weights in one C pass (the numpy route's values)
            trees = self.trees
            slots = np.empty(batch_size, dtype=np.int64)
            weights = np.empty(batch_size, dtype=np.float32) if weights_out is None else weights_out
            bits = rng.bit_generator
            with bits.lock:   # (the total: the sum tree's root, as index.total reads it)
                _c_draw_weighted(*trees, bits.capsule, float(trees[0][1]), self.stratified, float(beta), slots, weights)
            return slots, weights
        total = self.index.total
        slots = self.index.find_prefixsum(self._masses(batch_size, total, rng))
        if beta == 0.0:
            weights = np.ones(batch_size, dtype=np.float32)
        else:
            p = self.index.get(slots) / total
            p_min = self.index.min / total
            weights = ((p / p_min) ** (-beta)).astype(np.float32)  # == (N p)^-beta / (N p_min)^-beta
        if weights_out is None:
            return slots, weights
        weights_out[:] = weights
        return slots, weights_out

    def update_delivered(self, slots: np.ndarray, seqs: np.ndarray, priorities: ArrayLike, stored_seqs: np.ndarray,
                         *, abs_floor: float | None = None) -> int:
        """One native pass where the C helper is built: check every kept row, then set them
        all. It refuses what the reference would refuse (a slot out of range, a priority that
        is not finite and >= 0, or 0 with eps = 0) with nothing changed, and the reference then
        names the error; the two are held equal by tests/core/selection/test_sumtree_batched.py."""
        if not self.index.use_c:
            return super().update_delivered(slots, seqs, priorities, stored_seqs, abs_floor=abs_floor)
        args = (*self.trees, stored_seqs, slots, seqs, priorities, self.alpha, self.eps)
        got = _c_set_delivered(*args) if abs_floor is None else _c_set_delivered(*args, abs_floor)
        if got is None:   # refused, nothing changed: the reference raises with the field and the fix
            return super().update_delivered(slots, seqs, priorities, stored_seqs, abs_floor=abs_floor)
        count, mx = got
        if count:
            self.max_priority = max(self.max_priority, mx)
        return count

    def update_priorities(self, slots: np.ndarray, priorities: ArrayLike) -> None:
        pr = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if self.index.use_c and pr.shape[0] == np.asarray(slots).reshape(-1).shape[0]:
            idx = np.ascontiguousarray(slots, dtype=np.int64).reshape(-1)
            mx = -1.0 if (self.eps == 0 and (pr == 0).any()) else set_priorities(
                *self.index.trees(), idx, np.ascontiguousarray(pr), self.alpha, self.eps)
            if mx >= 0:
                self.max_priority = max(self.max_priority, mx)
                return
            # invalid input: fall through to the checks below for the error message
        if pr.shape[0] != np.asarray(slots).reshape(-1).shape[0]:
            raise SpecError("priorities", f"{np.asarray(slots).size} values (one per slot)", pr.shape[0],
                            "pass one priority per delivered item")
        if pr.size and not (np.isfinite(pr).all() and pr.min() >= 0):
            bad = pr[~np.isfinite(pr) | (pr < 0)][0]
            raise SpecError("priorities", "finite values >= 0", bad,
                            "pass |TD error| (add eps); NaN usually means the loss diverged")
        if pr.size == 0:
            return
        if self.eps == 0 and (pr == 0).any():
            raise SpecError("priorities", "values > 0 with Prioritized(eps=0)", 0.0,
                            "floor them (e.g. max(p, 1e-12), as RLlib does) or use eps > 0: a zero priority is "
                            "never drawn again")
        pr = pr + self.eps
        self.max_priority = max(self.max_priority, float(pr.max()))
        self.index.set(slots, libm_powers(pr, self.alpha))

    def check_initial_priorities(self, n: int, priorities: ArrayLike) -> np.ndarray:
        pr = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if pr.shape[0] != n:
            raise SpecError("priorities", f"{n} values (one per inserted item)", pr.shape[0],
                            "pass one priority per item of the insert")
        if not (np.isfinite(pr).all() and (pr >= 0).all()):
            bad = pr[~np.isfinite(pr) | (pr < 0)][0]
            raise SpecError("priorities", "finite values >= 0", float(bad),
                            "pass |TD error| or leave the priorities out for the running max; NaN usually means "
                            "the values diverged")
        if self.alpha > 1.0 and pr.size:
            with np.errstate(over="ignore"):
                overflow = ~np.isfinite((pr + self.eps) ** self.alpha)
            if overflow.any():
                raise SpecError("priorities", f"values whose (p + eps) ** alpha (alpha={self.alpha:g}) is finite",
                                float(pr[overflow][0]),
                                "scale the priorities down (a sum tree of inf draws nothing sensible)")
        # a zero (with eps=0) is stored as SRL stores it: the item is not drawn until its priority is raised
        return pr

    def set_initial_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Priorities given at insert replace the running max for those items; they do not raise
        the running max (only updates do, as in SRL's buffer, which computes them from TD errors)."""
        pr = priorities + self.eps
        self.index.set(np.asarray(slots, dtype=np.int64), pr ** self.alpha if self.alpha != 1.0 else pr)

    def state_dict(self) -> dict[str, Any]:
        return {"leaves": self.index.leaves().copy(), "max_priority": self.max_priority}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.index.rebuild(np.asarray(state["leaves"], dtype=np.float64))
        self.max_priority = float(state["max_priority"])

    def check_state(self, state: Mapping[str, Any]) -> None:
        leaves = np.asarray(state.get("leaves")) if isinstance(state, dict) and "leaves" in state else None
        if leaves is None or leaves.shape != (self.capacity,) or leaves.dtype.kind != "f" \
                or not (np.isfinite(leaves).all() and (leaves >= 0).all()):
            raise StateError(f"selector_state.leaves: expected {self.capacity} finite priorities >= 0, got "
                             f"{'nothing' if leaves is None else f'{leaves.dtype} {leaves.shape}'}. Fix: the state is "
                             "damaged or from another buffer; nothing was loaded")
        mp = state.get("max_priority")
        if not isinstance(mp, (int, float)) or not np.isfinite(mp) or mp <= 0:
            raise StateError(f"selector_state.max_priority: expected a finite number > 0, got {mp!r}. Fix: the "
                             "state is damaged; nothing was loaded")

    def to_config(self) -> dict[str, Any]:
        return {"name": self.name, "alpha": self.alpha, "beta": self.beta, "eps": self.eps,
                "stratified": self.stratified}


class Fifo(Selector):
    """First in, first out, each item delivered exactly once (on-policy data).

    The buffer never overwrites an unconsumed FIFO item: a full queue makes inserts
    wait (or raise), so data already accepted is never lost."""

    name = "fifo"
    consumes = True

    def select(self, batch_size: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, None]:
        return np.arange(batch_size, dtype=np.int64), None   # the oldest queued rows, in order


def libm_powers(pr: np.ndarray, alpha: float) -> np.ndarray:
    """``pr ** alpha`` element by element with the C library's ``pow``, the function the native
    priority update calls, so that both routes store the same leaves bit for bit (numpy's
    vectorised power differs from it in the last bit on some CPUs, e.g. with AVX-512)."""
    if alpha == 1.0:
        return pr
    return np.fromiter((_libm_pow(p, alpha) for p in pr.tolist()), dtype=np.float64, count=pr.shape[0])


def _libm_pow(p: float, alpha: float) -> float:
    try:
        return p ** alpha
    except OverflowError:   # C's pow returns inf there (and so did numpy's route): the same value
        return math.inf
