"""Nested fields as dotted names: ``{"obs": {"pixels": a}}`` <-> ``{"obs.pixels": a}``.

Frameworks nest their samples (SRL's ``NamedArray``: ``obs.obs``, ``analyzed_result.ret``; RLlib's
dict observations). The core stores flat columns; these two functions are the one place where
a nesting becomes names and back, so an adapter rebuilds exactly the structure it was given:
the order of the fields and every ``None`` leaf are kept.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from ..errors import SpecError


def flatten(tree: Mapping[str, Any], *, is_node: Callable[[Any], bool] | None = None,
            prefix: str = "") -> list[tuple[str, Any]]:
    """Leaves of ``tree`` as ``(dotted name, value)`` in the tree's own order.

    ``is_node`` says which values are inner nodes (default: any mapping); their ``items()``
    are walked. A key containing '.' would be ambiguous once flattened and is refused."""
    is_node = is_node or (lambda v: isinstance(v, Mapping))
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if not isinstance(key, str) or not key or "." in key:
            raise SpecError(f"{prefix}{key}" if isinstance(key, str) else "field name",
                            "a non-empty string without '.' at every level of a nested sample", repr(key),
                            "rename the key ('.' joins the levels of a nested name)")
        name = prefix + key
        if is_node(value):
            out.extend(flatten(value, is_node=is_node, prefix=name + "."))
        else:
            out.append((name, value))
    return out


def unflatten(entries: Iterable[tuple[str, Any]], *, make_node: Callable[[dict], Any] = dict) -> Any:
    """Inverse of :func:`flatten`: nodes built by ``make_node(dict of children)``, children in
    the order their first leaf appears. ``flatten(unflatten(e)) == e`` for any flattened ``e``."""
    root: dict = {}
    for name, value in entries:
        parts = name.split(".")
        node = root
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SpecError(name, f"'{part}' to be a nested node", "a leaf of the same name",
                                "do not use one name both as a field and as a prefix of others")
            node = child
        if parts[-1] in node:
            raise SpecError(name, "each name once", "a repeated name", "drop the duplicate field")
        node[parts[-1]] = value
    return _build(root, make_node)


def _build(node: dict, make_node: Callable[[dict], Any]) -> Any:
    return make_node({k: (_build(v, make_node) if isinstance(v, dict) else v) for k, v in node.items()})
