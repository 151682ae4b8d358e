"""SRL samples <-> Conduit's flat columns.

An SRL sample is a (nested) ``NamedArray`` of time-major ``[T, ...]`` arrays (``obs.obs``,
``analyzed_result.ret``, ``policy_state.hx``...), with ``None`` for fields an algorithm leaves out.
It is flattened on ``put`` into dotted names in the sample's own order (what SRL's
``namedarray.flatten`` gives) and rebuilt on ``get`` as SRL's buffers rebuild a batch: plain
``NamedArray`` nodes with the same nesting, names and ``None`` leaves (SRL's
``namedarray.from_flattened`` / ``recursive_aggregate``), handed back in SRL's ``ReplayEntry``
(:func:`replay_entry`).

:class:`SampleCodec` learns the nesting from the first sample and then walks it without
recursion or per-call string work (SRL's generic functions cost ~20 us to flatten and ~57 us to
rebuild a MAPPO sample, which the buffer would pay per put and per get); a sample with another
nesting falls back to the generic path (and the buffer refuses what does not fit).

``None`` is SRL's "left out", anywhere in a sample (SRL's actor leaves ``info`` ``None`` for steps
without episode info). A leaf or sub-structure the first sample had and a later one leaves ``None``
flattens to ``None`` leaves. With ``grow=True`` (the queue kinds, which batch as SRL's
``recursive_aggregate`` does) a position ``None`` in every sample so far that a later sample fills
with a sub-structure joins the nesting (its leaves are appended to ``names``; the old leaf name
stays, always ``None``), and each sample records which sub-structures it has (one hidden integer field,
:data:`PRESENT`; a sample put before a sub-structure was learned has its bit 0, as it left it out),
so a rebuilt batch has ``None`` exactly where SRL's aggregation has it: a sub-structure every
sample left out. The replay kinds keep the first sample's nesting (SRL's
replay buffers allocate from it).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def is_node(v: Any) -> bool:
    from rlsrl.base.namedarray import NamedArray
    return isinstance(v, NamedArray)


def flatten(sample: Any) -> dict[str, Any]:
    from rlsrl.base import namedarray
    return dict(namedarray.flatten(sample))


def rebuild(columns: dict[str, Any]) -> Any:
    from rlsrl.base import namedarray
    return namedarray.from_flattened(list(columns.items()))


def replay_entry(**kw) -> Any:
    """SRL's ``ReplayEntry`` (what every buffer kind's ``get`` hands back), imported on first use
    like SRL's other types here, so the package imports nothing of SRL's until a buffer is used."""
    from rlsrl.base.buffer import ReplayEntry
    return ReplayEntry(**kw)


PRESENT = "(present sub-structures)"   # hidden field: bit i set = the sample has node i (no SRL name has a space)
_MASK_BITS = 62                      # nodes per hidden int64 field


class SampleCodec:
    """Flatten/rebuild for samples of one nesting (learned from the first sample; with ``grow``,
    extended by later samples that fill a position ``None`` so far)."""

    def __init__(self, sample: Any, *, grow: bool = False):
        from rlsrl.base.namedarray import NamedArray
        self._NamedArray = NamedArray
        self.grow = bool(grow)
        self._nodes: dict[tuple[str, ...], tuple[str, ...]] = {}   # every NamedArray node: path -> keys
        self.names: list[str] = []           # flat names, in order of first appearance (hidden ones included)
        self._retired: set[str] = set()      # leaves that became sub-structures (always None)
        self._none_so_far: set[str] = set()  # leaves None in every sample so far (the ones that may grow)
        self._learn(sample, ())
        self._none_so_far = {name for name in self.names if _leaf(sample, name) is None}
        self._masks: dict[int, Any] = {}
        self._refresh()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "_order" not in state:   # pickled before the nesting could grow: (path, keys) list, 2-tuple tree
            self.grow, self._nodes = False, dict(state["_nodes"])
            self._retired, self._none_so_far, self._masks = set(), set(), {}
            self._refresh()

    # ------------------------------------------------------------ nesting
    def _learn(self, node: Any, path: tuple[str, ...]) -> list[str]:
        """Register ``node`` (a NamedArray at ``path``) and everything under it; returns new leaf names."""
        keys = tuple(node.keys())
        self._nodes[path] = keys
        new = []
        for k in keys:
            v = getattr(node, k)
            if is_node(v):
                new += self._learn(v, path + (k,))
            else:
                new.append(".".join(path + (k,)))
        for name in new:
            if name not in self.names:
                self.names.append(name)
        return new

    def _refresh(self) -> None:
        """Derived tables after the nesting changed: the walk's node order, node bit numbers, the tree."""
        self._node_paths = set(self._nodes)
        self._order = list(self._nodes)                     # parents before children (insertion order)
        self._bit = {path: i for i, path in enumerate(p for p in self._order if p)}
        n_masks = -(-len(self._bit) // _MASK_BITS) if self.grow else 0
        self._mask_names = [PRESENT if i == 0 else f"{PRESENT} {i}" for i in range(n_masks)]
        missing = [name for name in self._mask_names if name not in self.names]
        if missing:
            self.names = self.names + missing   # (a new list: a snapshot holds the old one)
        self._tree = self._subtree(())
        # the walk's plan: per node (parents first) its keys, its bit, and per key (key, dotted name,
        # child node path or None for a leaf, whether the leaf is None so far and watched)
        self._plan = []
        for path in self._order:
            prefix = ".".join(path) + "." if path else ""
            entries = tuple((k, prefix + k, path + (k,) if path + (k,) in self._node_paths else None,
                             prefix + k in self._none_so_far) for k in self._nodes[path])
            self._plan.append((path, self._nodes[path], 1 << self._bit[path] if path else 0, entries))

    def _subtree(self, path: tuple[str, ...]) -> list:
        out = []
        for k in self._nodes[path]:
            p = path + (k,)
            out.append((k, self._subtree(p), self._bit[p]) if p in self._node_paths else (k, ".".join(p), None))
        return out

    # ------------------------------------------------------------ flatten
    def flatten(self, sample: Any) -> dict[str, Any]:
        """The sample's leaves by dotted name (``self.names``; with ``grow``, the nesting may grow
        first: compare ``len(self.names)``). A sub-structure the sample leaves ``None`` gives
        ``None`` for each of its leaves; the buffers store those as SRL batches them."""
        out = self._walk(sample)
        if out is None and self.grow and self._grow(sample):
            out = self._walk(sample)
        return flatten(sample) if out is None else out

    def _walk(self, sample: Any) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        nodes: dict[tuple[str, ...], Any] = {(): sample}
        present, NamedArray, grow = 0, self._NamedArray, self.grow
        for path, keys, bit, entries in self._plan:
            node = nodes.get(path)
            if node is _ABSENT:
                for k, name, child, watch in entries:
                    if child is None:
                        out[name] = None
                    else:
                        nodes[child] = _ABSENT
                continue
            if node is None or not isinstance(node, NamedArray) or tuple(node.keys()) != keys:
                return None   # another nesting
            present |= bit
            for k, name, child, watch in entries:
                v = getattr(node, k)
                if child is not None:           # a sub-structure: None leaves it out
                    if v is None:
                        nodes[child] = _ABSENT
                    elif isinstance(v, NamedArray):
                        nodes[child] = v
                    else:
                        return None   # another nesting
                    continue
                if watch and v is not None:     # a leaf None so far
                    if isinstance(v, NamedArray):
                        if grow:
                            return None   # a sub-structure where the nesting has a leaf: it may grow
                        # (without grow the object goes to the leaf's name: the replay kinds drop it, as SRL)
                    else:
                        self._given(name)
                out[name] = v
        for name in self._retired:
            out[name] = None
        if self._mask_names:
            for i, name in enumerate(self._mask_names):
                m = (present >> (i * _MASK_BITS)) & ((1 << _MASK_BITS) - 1)
                arr = self._masks.get(m)
                if arr is None:
                    arr = self._masks[m] = np.array(m, dtype=np.int64)
                out[name] = arr
        if len(out) != len(self.names):
            return None
        return out

    def _given(self, name: str) -> None:
        """A leaf ``None`` so far got a value: it can no longer become a sub-structure (rare: once per
        leaf). Copy on write, so a ``snapshot`` taken before stays intact."""
        self._none_so_far = self._none_so_far - {name}
        self._refresh()

    def _grow(self, sample: Any) -> bool:
        """Learn the sub-structures ``sample`` has where every sample so far had ``None`` (copy on
        write: a ``snapshot`` taken before stays intact). False (nothing learned) when it differs
        otherwise: the generic path, which the buffer refuses."""
        grew, stack = False, [((), sample)]
        while stack:
            path, node = stack.pop()
            if not isinstance(node, self._NamedArray) or tuple(node.keys()) != self._nodes.get(path):
                break
            for k in node.keys():
                v, p = getattr(node, k), path + (k,)
                if not isinstance(v, self._NamedArray):
                    continue
                name = ".".join(p)
                if p in self._node_paths:
                    stack.append((p, v))
                elif name in self._none_so_far:            # None in every sample so far: it may become one
                    if not grew:
                        self.names, self._nodes = list(self.names), dict(self._nodes)
                        self._retired, self._none_so_far = set(self._retired), set(self._none_so_far)
                    self._none_so_far.discard(name)
                    self._retired.add(name)
                    new = self._learn(v, p)
                    self._none_so_far.update(n for n in new if _leaf(v, n[len(name) + 1:]) is None)
                    grew = True
                else:
                    stack = []
                    break
        if grew:
            self._refresh()
        return grew

    def snapshot(self) -> tuple:
        """What the codec has learned, to ``restore`` when the samples that taught it are refused
        (a refused put must change nothing). Cheap: the learning copies what it changes."""
        return self.names, self._nodes, self._retired, self._none_so_far

    def restore(self, snapshot: tuple) -> None:
        if any(a is not b for a, b in zip(snapshot, self.snapshot())):
            self.names, self._nodes, self._retired, self._none_so_far = snapshot
            self._refresh()

    # ------------------------------------------------------------ rebuild
    def rebuild(self, columns: dict[str, Any]) -> Any:
        """SRL's ``NamedArray`` of ``columns`` (one sample's or a batch's): with ``grow``, a sub-structure
        no sample behind the columns has is ``None`` (a mask column ``None``: no sample gave it)."""
        if not self._mask_names:
            return _build(self._tree, columns, self._NamedArray, -1)
        present_any = 0
        for i, name in enumerate(self._mask_names):
            col = columns.get(name)
            if col is not None:
                present_any |= int(np.bitwise_or.reduce(np.asarray(col).reshape(-1))) << (i * _MASK_BITS)
        return _build(self._tree, columns, self._NamedArray, present_any)


_ABSENT = object()   # a sub-structure this sample leaves None


def _leaf(node: Any, dotted: str) -> Any:
    for k in dotted.split("."):
        node = getattr(node, k, None) if node is not None else None
    return node


def _build(tree: list, columns: dict[str, Any], NamedArray, present_any: int) -> Any:
    """``present_any``: bit i set where some sample has node i (-1: every node, when none is tracked)."""
    return NamedArray(**{k: (columns[v] if bit is None else
                             _build(v, columns, NamedArray, present_any) if present_any >> bit & 1 else None)
                         for k, v, bit in tree})
