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
nesting falls back to the generic path. A sub-structure present in the first sample and ``None`` in a
later one is stored as zeros (SRL's batching zero-fills it). (One thing SRL accepts is refused: a
field or sub-structure that is ``None`` in the first sample and present later, which SRL zero-fills
per batch; the buffers' layout comes from the first sample.)
"""

from __future__ import annotations

from typing import Any


def _is_node(v: Any) -> bool:
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


class SampleCodec:
    """Flatten/rebuild for samples of one nesting (learned from the first sample)."""

    def __init__(self, sample: Any):
        from rlsrl.base.namedarray import NamedArray
        self._NamedArray = NamedArray
        self.names = list(flatten(sample))
        self._nodes: list[tuple[tuple[str, ...], tuple[str, ...]]] = []  # (path, keys) of every NamedArray node
        self._walk(sample, ())
        self._node_paths = {path for path, _ in self._nodes}
        self._tree = _tree(self.names)

    def _walk(self, node: Any, path: tuple[str, ...]) -> None:
        keys = tuple(node.keys())
        self._nodes.append((path, keys))
        for k in keys:
            v = getattr(node, k)
            if _is_node(v):
                self._walk(v, path + (k,))

    def flatten(self, sample: Any) -> dict[str, Any]:
        """The sample's leaves by dotted name. A sub-structure the first sample had and this one
        leaves ``None`` (SRL's actor sends ``info=None`` for steps without episode info) gives
        ``None`` for each of its leaves: the buffers store those as zeros, as SRL's batching
        (``recursive_aggregate``) fills them."""
        out: dict[str, Any] = {}
        nodes: dict[tuple[str, ...], Any] = {(): sample}
        for path, keys in self._nodes:
            node = nodes.get(path)
            prefix = ".".join(path) + "." if path else ""
            if node is _ABSENT:
                for k in keys:
                    if path + (k,) in self._node_paths:
                        nodes[path + (k,)] = _ABSENT
                    else:
                        out[prefix + k] = None
                continue
            if node is None or not isinstance(node, self._NamedArray) or tuple(node.keys()) != keys:
                return flatten(sample)  # another nesting: the generic path (the buffer checks the fields)
            for k in keys:
                v = getattr(node, k)
                if isinstance(v, self._NamedArray):
                    nodes[path + (k,)] = v
                elif v is None and path + (k,) in self._node_paths:
                    nodes[path + (k,)] = _ABSENT
                else:
                    out[prefix + k] = v
        if len(out) != len(self.names):
            return flatten(sample)
        return out

    def rebuild(self, columns: dict[str, Any]) -> Any:
        return _build(self._tree, columns, self._NamedArray)


_ABSENT = object()   # a sub-structure this sample leaves None


def _tree(names: list[str]) -> list:
    """[(key, flat name | subtree)] in the order SRL's from_flattened groups them."""
    root: dict = {}
    for name in names:
        node = root
        parts = name.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = name

    def conv(d):
        return [(k, conv(v) if isinstance(v, dict) else v) for k, v in d.items()]
    return conv(root)


def _build(tree: list, columns: dict[str, Any], NamedArray) -> Any:
    return NamedArray(**{k: (_build(v, columns, NamedArray) if isinstance(v, list) else columns[v]) for k, v in tree})
