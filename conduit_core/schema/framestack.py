"""Frame stacks stored once per frame: the capacity codec for pixel observations.

Atari pipelines deliver each observation as a stack of the last k frames, and ``obs``
and ``next_obs`` overlap in k-1 of them, so a transition carries 2k frames of which
~1 is new. A ``FrameStackCodec`` field stores only the id of its stack's *last* frame;
the frames live once in a ring-shaped ``FramePool`` shared by the fields of one pool
(e.g. obs and next_obs):

    rows (seq order):   obs[t]   next_obs[t]   obs[t+1]   next_obs[t+1] ...
    frame ids:          L        L+1           L+1        L+2           (k consecutive ids per stack)
    pool (ring):        [ f_{L-3} f_{L-2} f_{L-1} f_L f_{L+1} f_{L+2} ... ]

When written, each stack is compared bit for bit with the previous one: equal ->
same id; shifted by one frame -> one new frame; otherwise k new frames. Either way
decoding returns exactly the stack that was written (lossless by construction), and
the frame ids of every stack are consecutive, so a stack is one slice of the ring.

The pool holds ``frame_budget * capacity`` frames. Very short episodes need more than
one frame per transition; when the pool is about to overwrite frames that live rows
still use, the buffer evicts the oldest rows early (counted as ``evicted_early``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import math

import numpy as np
import torch

from ..errors import CapacityError, SpecError
from ..memory.output_pool import aligned_empty
from ..memory.tiers import Tier, allocate
from .codecs import AffineCodec, Codec, IdentityCodec, StoredDecoder, codec_from_config, register_codec

if TYPE_CHECKING:
    from .spec import FieldSpec

try:
    from .._native._frames import copy_frames_klast as _c_copy_frames_klast
    from .._native._frames import gather_stacks as _c_gather_stacks
    from .._native._frames import stack_links as _c_stack_links
    from .._native._frames import stack_links_klast as _c_stack_links_klast
except ImportError:  # pragma: no cover - no C compiler where it was installed: the numpy routes below
    _c_gather_stacks = _c_stack_links = _c_stack_links_klast = _c_copy_frames_klast = None


# Up to this many stacks per write, the new frames' ids are worked out in plain Python.
_FEW_STACKS = 64


@register_codec
class FrameStackCodec(Codec):
    """Store a stacked observation as one frame id; frames go to the pool ``pool``.

    ``k``: frames per stack; ``axis``: the stacking axis of the field's shape (e.g. -1
    for HxWxk, 0 for kxHxW); ``inner``: a per-frame codec (e.g. ``AffineCodec`` for
    normalised floats); ``frame_budget``: pool frames per buffer slot."""

    name = "framestack"

    def __init__(self, *, k: int, axis: int = -1, inner: Codec | None = None, pool: str = "frames",
                 frame_budget: float = 1.125):
        if k < 1:
            raise SpecError("FrameStackCodec.k", ">= 1", k, "use the framework's frame-stack depth, e.g. 4")
        if frame_budget < 1.0:
            raise SpecError("FrameStackCodec.frame_budget", ">= 1.0", frame_budget,
                            "each transition needs at least one new frame; use e.g. 1.125")
        self.k, self.axis, self.pool = int(k), int(axis), str(pool)
        self.inner = inner or IdentityCodec()
        self.frame_budget = float(frame_budget)

    @property
    def frame_pool(self) -> str:
        return self.pool

    def storage_decoder(self, pools: Any) -> "PooledDecoder":
        return PooledDecoder(pools[self.pool], self)

    def check_compatible(self, field: FieldSpec) -> None:
        if not field.shape:
            raise SpecError(f"{field.name}.codec", "a field with a stacking axis", "a scalar field",
                            "FrameStackCodec applies to stacked observations such as (84, 84, 4)")
        if field.shape[self.axis] != self.k:
            raise SpecError(f"{field.name}.shape[{self.axis}]", f"k={self.k} stacked frames",
                            field.shape[self.axis], "set axis to the stacking axis and k to its size")
        self.inner.check_compatible(field)

    def frame_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        s = list(shape)
        del s[self.axis]
        return tuple(s)

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return ()

    def stored_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.int64

    def frame_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.inner.stored_dtype(dtype)

    @property
    def refuses_nonfinite(self) -> bool:
        return self.inner.refuses_nonfinite

    @property
    def rowwise_encode(self) -> bool:
        return not self.inner.is_identity and self.inner.rowwise_encode   # (identity: nothing to share)

    def encode(self, field: str, x: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        # Per-frame encoding only; the pool interns frames when the rows are written.
        return self.inner.encode(field, x) if not self.inner.is_identity else x

    def decode(self, stored: Any, dtype: Any) -> Any:  # pragma: no cover - the storage's PooledDecoder decodes
        raise RuntimeError("a FrameStackCodec field is decoded by its storage's frame pool")

    def to_config(self) -> dict:
        return {"name": self.name, "k": self.k, "axis": self.axis, "inner": self.inner.to_config(),
                "pool": self.pool, "frame_budget": self.frame_budget}

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "FrameStackCodec":
        return cls(k=cfg["k"], axis=cfg["axis"], inner=codec_from_config(cfg["inner"]), pool=cfg["pool"],
                   frame_budget=cfg["frame_budget"])

    def __eq__(self, other):
        return isinstance(other, FrameStackCodec) and self.to_config() == other.to_config()

    def __hash__(self):
        return hash((self.name, self.k, self.axis, self.pool))


class FramePool:
    """A ring of frames addressed by monotonically growing frame ids."""

    def __init__(self, *, name: str, frames: int, frame_shape: tuple[int, ...], dtype: torch.dtype, k: int,
                 tier: Tier = Tier.PAGEABLE):
        self.name, self.capacity, self.k = name, int(frames), k
        self.frame_shape = tuple(frame_shape)
        self.tensor, self._segment = allocate(tier if tier is not Tier.DEVICE else Tier.PAGEABLE,
                                              (self.capacity, *self.frame_shape), dtype)
        self.frames = self.tensor.numpy()
        self.cursor = 0          # id of the next frame to write
        self.last_id = -1        # last frame id of the last stack written (-1: none)
        self.frame_bytes = self.frames[0].nbytes if self.capacity else 0
        # the first pass writes memory never written before: its pages committed ahead, off this thread
        self.commit_ahead = self._segment.commit_ahead(name=f"frame pool {name!r}") \
            if hasattr(self._segment, "commit_ahead") else None

    # -------------------------------------------------------------- write
    def plan(self, stacks: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """Dedup ``stacks`` [m, k, *frame] against each other and the last stack written.
        Returns (last frame id per stack, indices (stack, frame) of new frames, count)."""
        m, k = stacks.shape[0], self.k
        if self.commit_ahead is not None:   # (at most m * k new frames)
            self.commit_ahead.check(self.cursor * self.frame_bytes, (self.cursor + m * k) * self.frame_bytes)
        flat = stacks.reshape(m, k, -1)
        same = np.zeros(m, dtype=bool)
        shift = np.zeros(m, dtype=bool)
        prev = None
        if self.last_id >= 0 and self.last_id - k + 1 > self.cursor - self.capacity - 1:
            prev = self.read_stack(self.last_id).reshape(k, -1)
        if _c_stack_links is not None and flat.dtype == np.uint8 and flat.flags.c_contiguous:
            _c_stack_links(flat, prev, k, same, shift)   # one memcmp per stack and relation
        else:
            if m > 1:
                same[1:] = (flat[1:] == flat[:-1]).all(axis=(1, 2))
                shift[1:] = (flat[1:, :-1] == flat[:-1, 1:]).all(axis=(1, 2)) if k > 1 else True
            if prev is not None:
                same[0] = bool((flat[0] == prev).all())
                shift[0] = bool((flat[0, :-1] == prev[1:]).all()) if k > 1 else True
        return self._ids_from_links(m, same, shift)

    def plan_klast(self, cols: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray, int]:
        """``plan`` for stacks left in their fields' layout with the k frames last (RLlib's
        Atari [n, 84, 84, 4]): ``cols`` holds one C-contiguous uint8 array per field of the
        pool, stack i being field ``i % len(cols)``'s row ``i // len(cols)`` (``plan``'s order).
        The same links and ids as ``plan`` on the transposed copy, without making it."""
        n, k = cols[0].shape[0], self.k
        m = n * len(cols)
        if self.commit_ahead is not None:   # (at most m * k new frames)
            self.commit_ahead.check(self.cursor * self.frame_bytes, (self.cursor + m * k) * self.frame_bytes)
        same = np.zeros(m, dtype=bool)
        shift = np.zeros(m, dtype=bool)
        prev = None
        if self.last_id >= 0 and self.last_id - k + 1 > self.cursor - self.capacity - 1:
            prev = self.read_stack(self.last_id).reshape(k, -1)
        _c_stack_links_klast(cols, n, prev, k, same, shift)
        return self._ids_from_links(m, same, shift)

    def _ids_from_links(self, m: int, same: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """(last frame id per stack, (stack, frame) of each new frame, count) from the links.

        A few stacks (an env step's add) in plain Python: a dozen numpy calls on arrays of ten
        cost more than the loop, above all with the caches cold between training steps."""
        k = self.k
        # Invariant: the last stack written always ends at frame cursor-1, so ids follow.
        if m <= _FEW_STACKS:
            last, stacks, frames, end = [], [], [], self.cursor - 1
            for i, (s, h) in enumerate(zip(same.tolist(), shift.tolist())):
                new = 0 if s else (1 if h else k)
                end += new
                last.append(end)
                stacks.extend([i] * new)
                frames.extend(range(k - new, k))
            return (np.array(last, dtype=np.int64), np.array([stacks, frames], dtype=np.int64).reshape(2, -1),
                    len(stacks))
        shift &= ~same
        n_new = np.where(same, 0, np.where(shift, 1, k))
        last = self.cursor - 1 + np.cumsum(n_new)
        # new frames in write order: the last frame of 'shift' stacks, all k of fresh ones
        sel_stack = np.repeat(np.arange(m), n_new)
        first_new = np.cumsum(n_new) - n_new
        sel_frame = np.arange(int(n_new.sum())) - np.repeat(first_new, n_new) + np.repeat(k - n_new, n_new)
        return last.astype(np.int64), np.stack([sel_stack, sel_frame]), int(n_new.sum())

    def write(self, stacks: np.ndarray | tuple, sel: np.ndarray, count: int, last: np.ndarray) -> None:
        """The new frames ``plan`` (``stacks``: [m, k, *frame]) or ``plan_klast`` (``stacks``:
        its tuple of k-last columns) picked, at the next frame ids."""
        if count:
            if isinstance(stacks, tuple):
                _c_copy_frames_klast(stacks, stacks[0].shape[0], self.k, np.ascontiguousarray(sel[0]),
                                     np.ascontiguousarray(sel[1]), self.frames, self.cursor)
            else:
                ids = self.cursor + np.arange(count)
                self.frames[ids % self.capacity] = stacks[sel[0], sel[1]]
            self.cursor += count
        if last.size:
            self.last_id = int(last[-1])
        if count and self.commit_ahead is not None and self.cursor <= self.capacity:   # (the first pass)
            self.commit_ahead.note_written(self.cursor * self.frame_bytes)

    # --------------------------------------------------------------- read
    def read_stack(self, last_id: int) -> np.ndarray:
        ids = (last_id - self.k + 1 + np.arange(self.k)) % self.capacity
        return self.frames[ids]

    def gather(self, last_ids: np.ndarray) -> np.ndarray:
        """[B, k, *frame] stacks for the given last-frame ids."""
        ids = (last_ids.reshape(-1, 1) - self.k + 1 + np.arange(self.k)) % self.capacity
        return self.frames.take(ids.reshape(-1), axis=0).reshape(last_ids.shape[0], self.k, *self.frame_shape)

    def state(self) -> dict:
        n = min(self.cursor, self.capacity)
        ids = (self.cursor - n + np.arange(n)) % self.capacity
        return {"cursor": self.cursor, "last_id": self.last_id, "frames": self.frames[ids].copy()}

    def load(self, state: dict) -> None:
        self.cursor, self.last_id = int(state["cursor"]), int(state["last_id"])
        fr = np.asarray(state["frames"])
        n = fr.shape[0]
        ids = (self.cursor - n + np.arange(n)) % self.capacity
        self.frames[ids] = fr
        if self.commit_ahead is not None:
            self.commit_ahead.wrote_through(min(self.cursor, self.capacity) * self.frame_bytes)

    def close(self) -> None:
        if self.commit_ahead is not None:
            self.commit_ahead.close()
        self.frames = None
        self.tensor = None
        if self._segment is not None:
            self._segment.close()


class PooledDecoder(StoredDecoder):
    """Decodes a FrameStackCodec field's stored ids back into stacks (on the target device).

    Host targets get the float stacks from one C pass per batch (gather the k frames of each
    stack side by side, in the field's layout, through a 256-entry table the codec computed
    with its own decode: exact for any uint8 codec). GPU targets get the uint8 stacks, 4x
    fewer bytes over the link, and decode on the device.
    """

    keeps_stored_on_host = True   # the ids index the host's frame pool; the stacks go to the target

    def __init__(self, pool: FramePool, codec: FrameStackCodec, *, vectorise: bool = True):
        """``vectorise=False`` keeps the table lookup per byte where vector arithmetic would give
        the same values (for comparing the two routes)."""
        self.pool, self.codec = pool, codec
        self.vectorise = vectorise
        nd = len(pool.frame_shape) + 1
        self._k_axis = 1 + codec.axis % nd           # where the k frames go in a [B, ...] stack
        self._k_last = self._k_axis == nd
        self._native = (_c_gather_stacks is not None and pool.frames.dtype == np.uint8
                        and self._k_axis in (1, nd))
        self._tables: dict[torch.dtype, torch.Tensor | None] = {}
        self._affine: dict[torch.dtype, tuple[float, bool, float] | None] = {}

    def _table(self, dtype: torch.dtype) -> torch.Tensor | None:
        """float32 decode of every uint8 value, from the codec's own decode (None: no table applies)."""
        if dtype not in self._tables:
            inner, table = self.codec.inner, None
            if dtype == torch.float32 and not inner.is_identity:
                table = inner.decode(torch.arange(256, dtype=torch.uint8), dtype).contiguous()
                if table.dtype != torch.float32 or table.shape != (256,):
                    table = None
            self._tables[dtype] = table
        return self._tables[dtype]

    def _affine_args(self, dtype: torch.dtype, table: torch.Tensor) -> tuple[float, bool, float] | None:
        """(a, divide, offset) whose float32 ``q / a + offset`` (``divide``) or ``q * a + offset``
        (an operation, then an add) is the decode table bit for bit for all 256 values, or None:
        with it the native gather decodes with vector instructions instead of a lookup per byte
        (the same values)."""
        if dtype not in self._affine:
            inner, args = self.codec.inner, None
            offset = getattr(inner, "offset", None)
            if offset is not None:
                divisor = getattr(inner, "divisor", None)
                q = np.arange(256, dtype=np.float32)
                want = table.numpy().view(np.uint32)
                # a multiply where it is exact (a power-of-two divisor), else the division itself
                tries = [(np.float32(1.0) / np.float32(divisor), False), (divisor, True)] if divisor else []
                tries += [(inner.scale, False)] if getattr(inner, "scale", None) else []
                for a, divide in tries:
                    a32, off32 = np.float32(a), np.float32(offset)
                    got = (q / a32 if divide else q * a32) + off32
                    if float(a32) != 0.0 and np.array_equal(got.view(np.uint32), want):
                        args = (float(a32), divide, float(off32))
                        break
            self._affine[dtype] = args
        return self._affine[dtype]

    def _stacks_shape(self, b: int) -> tuple[int, ...]:
        shape = [b, *self.pool.frame_shape]
        shape.insert(self._k_axis, self.pool.k)
        return tuple(shape)

    def decode(self, stored: torch.Tensor, dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
        """Stacks for the stored ids ``stored``, on ``device`` (default: where ``stored`` is; pass
        host ids and a GPU ``device`` to spare the ids a round trip over the link)."""
        device = stored.device if device is None else torch.device(device)
        ids = np.ascontiguousarray(stored.cpu().numpy().reshape(-1), dtype=np.int64)
        inner = self.codec.inner
        on_host = device.type == "cpu"
        if self._native:
            table = self._table(dtype) if on_host else None
            if table is not None or inner.is_identity or not on_host:
                out = torch.from_numpy(aligned_empty(self._stacks_shape(ids.shape[0]),
                                                     np.float32 if table is not None else np.uint8))
                _c_gather_stacks(self.pool.frames, ids, self.pool.k, self._k_last,
                                 None if table is None else table.numpy(), out.numpy(),
                                 None if table is None or not self.vectorise else self._affine_args(dtype, table))
                if not on_host:   # uint8 over the link, decoded on the device
                    out = out.to(device)
                    out = inner.decode(out, dtype) if not inner.is_identity else out
                return out.view(*stored.shape, *out.shape[1:])
        stacks = self.pool.gather(ids)                            # [B, k, *frame], stored dtype
        view = np.moveaxis(stacks, 1, self._k_axis)               # the field's layout (a view)
        if on_host and isinstance(inner, AffineCodec):
            # cast + re-layout in one copy, then the affine ops in place (bit-identical)
            x = inner.decode_into(torch.empty(view.shape, dtype=dtype), torch.from_numpy(view))
        else:
            x = torch.from_numpy(np.ascontiguousarray(view)).to(device)
            x = inner.decode(x, dtype) if not inner.is_identity else x
        return x.view(*stored.shape, *x.shape[1:])


def frames_of(codec: FrameStackCodec, x: Any) -> np.ndarray:
    """[n, k, *frame] view of encoded stacks (the stacking axis moved next to the batch axis)."""
    arr = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    nd = arr.ndim - 1
    return np.moveaxis(arr, 1 + (codec.axis % nd), 1)


def klast_columns(pool: FramePool, codecs: list[FrameStackCodec], encoded: list[Any]) -> tuple[np.ndarray, ...] | None:
    """The pool's encoded fields as C-contiguous uint8 numpy arrays when every one stacks its
    k frames on the last axis (``FramePool.plan_klast`` reads them in place), else None."""
    if _c_stack_links_klast is None or pool.frames.dtype != np.uint8 or len(encoded) > 8:
        return None
    out = []
    for codec, x in zip(codecs, encoded):
        arr = x.numpy() if isinstance(x, torch.Tensor) and x.device.type == "cpu" else x
        if type(arr) is not np.ndarray or arr.dtype != np.uint8 or not arr.flags.c_contiguous \
                or arr.ndim < 2 or codec.axis % (arr.ndim - 1) != arr.ndim - 2 or arr.shape[-1] != pool.k:
            return None
        out.append(arr)
    if any(a.shape != out[0].shape for a in out):
        return None
    return tuple(out)


def pool_frames(capacity: int, codec: FrameStackCodec, fields_in_pool: int) -> int:
    return int(math.ceil(capacity * codec.frame_budget)) + codec.k * 4 * max(1, fields_in_pool)


def first_surviving_seq(pending: list, frame_ids: np.ndarray, lo: int, hi: int, capacity: int) -> int:
    """The first seq in ``[lo, hi)`` whose frames the pending pool writes (``plan_frames``)
    leave intact: rows before it must be evicted before the frames are written.
    ``frame_ids(field)``: the stored last-frame ids of a pooled field, by slot."""
    new_floor = lo
    for pool, _stacks, _sel, count, last in pending:
        keep_from = pool.cursor + count - pool.capacity  # smallest frame id that survives
        if last.size and int(last.min()) - pool.k + 1 < keep_from:
            raise CapacityError(f"rollout: its {count} new frames exceed the frame pool ({pool.capacity} "
                                "frames). Fix: ingest shorter rollouts or raise FrameStackCodec.frame_budget.")
        ids = frame_ids(pool.fields[0])
        a, b = lo, hi   # binary search: frame ids grow with seq
        while a < b:
            mid = (a + b) // 2
            if int(ids[mid % capacity]) - pool.k + 1 >= keep_from:
                b = mid
            else:
                a = mid + 1
        new_floor = max(new_floor, a)
    return new_floor
