"""Giving a put back: a TransferQueue put spread over several storage units is all or nothing,
so a unit that took its part returns it when another unit refused (``tq_backend``)."""

from __future__ import annotations

import numpy as np

from conduit_core.errors import ConfigError
from conduit_core.kv.ragged import Column, RaggedStore


def put_undo(store: RaggedStore, keys: np.ndarray, columns: dict[str, Column]) -> dict:
    """What a put of ``columns`` at ``keys`` changes, to give it back: the rows it creates, the
    fields it creates, per field the stored rows that lacked it, and the values it replaces (only
    real overwrites copy)."""
    keys = np.asarray(keys, dtype=np.int64).reshape(-1)   # the put itself checks everything before writing
    held = store.held(keys)
    old = keys[held]
    fields = {}
    for name in columns:
        had = store.held(old, name)
        fields[name] = (old[~had], old[had], store.get(old[had], [name])[name] if had.any() else None)
    return {"new": keys[~held], "fields": fields, "created": [n for n in columns if n not in store.fields]}


def restore_put(store: RaggedStore, undo: dict) -> None:
    """Give a put back. Only what it wrote is undone: a row it created loses this put's fields and
    leaves only if nothing else (a concurrent put) gave it another field since."""
    new = undo["new"]
    store.unset(new, list(undo["fields"]))
    if new.size and store.fields:
        holds_any = np.any([store.held(new, f) for f in store.fields], axis=0)
        store.clear(new[~holds_any])
    else:
        store.clear(new)
    for name, (lacked, replaced, values) in undo["fields"].items():
        store.unset(lacked, [name])
        if values is not None:
            store.put(replaced, {name: values})
    for name in undo.get("created", []):   # a field this put made: gone, so another dtype may come
        try:
            store.drop_field(name)
        except ConfigError:                   # a concurrent put's rows hold it now: it stays theirs
            pass
