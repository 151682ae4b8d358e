"""What a buffer's saved state must be before anything of it is loaded.

``ExperienceBuffer.load_state_dict`` is all or nothing: it first runs ``check_state``, a
pure function of the state and the buffer's configuration, which validates and converts
every part (spec, capacity, selector, counters against the data, metadata, frame pools,
RNG); only then does the buffer write. A damaged or foreign state raises ``StateError``
naming the part, and the buffer is as it was.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from ..errors import StateError
from ..schema.spec import ExperienceSpec
from ..source.source_commit import CommitLedger
from .ring import META_FIELDS

SCHEMA_VERSION = 1


def as_int(v: Any) -> int | None:
    """``v`` as an int if it is one (numpy ints too; bools and floats are not)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        return None
    return int(v)


def check_state(state: Mapping[str, Any], *, spec: ExperienceSpec, capacity: int, selector, pools: Mapping,
                rng_kind: str) -> dict:
    """Everything ``ExperienceBuffer.load_state_dict`` will write, validated and converted;
    raises StateError (naming the part, what was expected and what was found) on the first
    inconsistency. Pure: reads ``state`` and the buffer's configuration (its spec, capacity,
    selector, frame pools and RNG kind) only."""
    def bad(part: str, expected: str, got: Any) -> StateError:
        return StateError(f"{part}: expected {expected}, got {got}. Fix: the state is damaged or from another "
                          "buffer; nothing was loaded")
    if not isinstance(state, Mapping):
        raise bad("state", "a dict from ExperienceBuffer.state_dict()", type(state).__name__)
    if state.get("schema_version") != SCHEMA_VERSION:
        raise StateError(f"schema_version: expected {SCHEMA_VERSION}, got {state.get('schema_version')!r}. "
                         "Fix: load with the Conduit version that wrote the state.")
    for key in ("spec", "capacity", "selector", "selector_state", "counters", "open_tail", "rng", "data", "meta"):
        if key not in state:
            raise bad(key, "a part of the state", "nothing")
    try:
        saved_spec = ExperienceSpec.from_config(state["spec"])
    except Exception as exc:  # noqa: BLE001 - any unreadable spec is a damaged state
        raise bad("spec", "a spec config", f"an unreadable one ({exc})") from None
    if saved_spec != spec:
        raise StateError(f"spec: expected {spec}, got {saved_spec}. "
                         "Fix: build the buffer with the spec the state was saved with.")
    if as_int(state["capacity"]) != capacity:
        raise StateError(f"capacity: expected {capacity}, got {state['capacity']}. "
                         "Fix: build the buffer with the capacity the state was saved with.")
    if not isinstance(state["selector"], Mapping) or state["selector"].get("name") != selector.name:
        got = state["selector"].get("name") if isinstance(state["selector"], Mapping) else state["selector"]
        raise StateError(f"selector: expected {selector.name}, got {got}. "
                         "Fix: build the buffer with the same selector.")
    for key, value in selector.to_config().items():   # (beta: only the weights' default, passed per sample)
        if key not in ("name", "beta") and key in state["selector"] and state["selector"][key] != value:
            raise StateError(f"selector.{key}: expected {value!r} (this buffer's), got {state['selector'][key]!r}. "
                             "Fix: build the buffer with the selector settings the state was saved with (stored "
                             "priorities and draws depend on them); nothing was loaded")
    raw = state["counters"]
    if not isinstance(raw, Mapping):
        raise bad("counters", "a dict of ints", type(raw).__name__)
    c = {}
    for k in ("inserted", "sampled", "head", "dropped_stale", "floor", "evicted_early", "holes", "lost"):
        v = as_int(raw.get(k, 0) if k in ("floor", "evicted_early", "holes", "lost") else raw.get(k))
        if v is None or v < 0:
            raise bad(f"counters.{k}", "an int >= 0", raw.get(k))
        c[k] = v
    if c["head"] > c["inserted"] or c["floor"] > c["inserted"]:
        raise bad("counters", "head and floor <= inserted", f"head={c['head']}, floor={c['floor']}, "
                  f"inserted={c['inserted']}")
    stored = min(c["inserted"], capacity)
    enc = {}
    for f in spec:
        arr = state["data"].get(f.name) if isinstance(state["data"], Mapping) else None
        if arr is None:
            raise bad(f"data.{f.name}", "a stored column", "nothing")
        arr = np.asarray(arr)
        if arr.shape != (stored, *f.stored_shape):
            raise StateError(f"data.{f.name}: expected shape {(stored, *f.stored_shape)}, got "
                             f"{arr.shape}. Fix: the state is corrupt or from another buffer.")
        t = torch.from_numpy(np.ascontiguousarray(arr))
        want = torch.int16 if f.stored_dtype == torch.bfloat16 else f.stored_dtype
        if t.dtype != want:
            raise bad(f"data.{f.name}", f"dtype {want}", t.dtype)
        enc[f.name] = t.view(torch.bfloat16) if f.stored_dtype == torch.bfloat16 else t
    meta = {}
    for k in META_FIELDS:
        m = state["meta"].get(k) if isinstance(state["meta"], Mapping) else None
        m = None if m is None else np.asarray(m)
        if m is None or m.shape != (stored,) or m.dtype.kind not in "iu":
            raise bad(f"meta.{k}", f"{stored} integers", "nothing" if m is None else f"{m.dtype} {m.shape}")
        meta[k] = m
    live = meta["seq"][meta["seq"] >= 0]
    if live.size and (live.max() >= c["inserted"] or not np.array_equal(live % capacity,
                                                                         np.flatnonzero(meta["seq"] >= 0))):
        raise bad("meta.seq", f"each row's seq < inserted={c['inserted']} and stored at seq % capacity",
                  "seqs that do not fit their slots")
    lo = max(c["inserted"] - capacity, c["floor"], 0)   # the ring's live window: Ring.lo()
    if live.size and live.min() < lo:
        raise bad("counters", f"counters that place every stored row in the live window [{lo}, {c['inserted']})",
                  f"a row of seq {int(live.min())} outside it (inserted={c['inserted']}, floor={c['floor']})")
    if c["holes"] != (c["inserted"] - lo) - live.size:
        raise bad("counters.holes", f"{(c['inserted'] - lo) - live.size} (the window's {c['inserted'] - lo} seqs "
                  f"less its {live.size} stored rows)", c["holes"])
    try:
        probe = np.random.default_rng()
        probe.bit_generator.state = state["rng"]
    except Exception as exc:  # noqa: BLE001
        raise bad("rng", f"a {rng_kind} state", f"an unusable one ({exc})") from None
    selector.check_state(state["selector_state"])
    saved_pools = state.get("pools", {}) or {}
    if not isinstance(saved_pools, Mapping):
        raise bad("pools", "a dict of frame pool states", type(saved_pools).__name__)
    if set(saved_pools) != set(pools):
        raise bad("pools", f"frame pools {sorted(pools)}", sorted(saved_pools))
    for name, pstate in saved_pools.items():
        pool = pools[name]
        fr = np.asarray(pstate.get("frames")) if isinstance(pstate, Mapping) else None
        cur, last = (as_int(pstate.get("cursor")), as_int(pstate.get("last_id"))) if fr is not None else (None, None)
        if fr is None or fr.dtype != pool.frames.dtype or fr.shape[1:] != tuple(pool.frame_shape) \
                or fr.shape[0] > pool.capacity or cur is None or last is None or cur < fr.shape[0]:
            raise bad(f"pools.{name}", f"up to {pool.capacity} frames of {tuple(pool.frame_shape)} "
                      f"{pool.frames.dtype} and a cursor >= their number",
                      "nothing" if fr is None else f"{fr.dtype} {fr.shape}, cursor {pstate.get('cursor')!r}")
    try:
        open_tail = {int(k): int(v) for k, v in state["open_tail"]}
    except (TypeError, ValueError):
        raise bad("open_tail", "[source, seq] pairs", state["open_tail"]) from None
    # the commit ledger of writers at the source (absent in states written before it was saved)
    ingest = CommitLedger.check_state(state["ingest"]) if "ingest" in state else None
    return {"data": enc, "meta": meta, "counters": c, "stored": stored, "pools": saved_pools, "open_tail": open_tail,
            "rng": state["rng"], "selector_state": state["selector_state"], "ingest": ingest}


def state_layout(buf) -> tuple:
    """What ``check_state`` checks a state against besides the spec: (capacity, selector, frame
    pools). A migration replaces them; ``same_layout`` tells whether one finished in between."""
    return buf.capacity, buf.selector, buf.storage.pools


def same_layout(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[1] is b[1] and a[2] is b[2]


def check_state_for(buf, state: Mapping[str, Any], layout: tuple) -> dict:
    """``check_state`` against ``buf``'s spec and RNG kind and the ``layout`` given."""
    return check_state(state, spec=buf.spec, capacity=layout[0], selector=layout[1], pools=layout[2],
                       rng_kind=type(buf.rng.bit_generator).__name__)


def capture_state(buf) -> dict:
    """``ExperienceBuffer.state_dict`` (lock held): the buffer's parts, as plain values."""
    stored = min(buf.ring.inserted, buf.capacity)
    rows = buf.run_storage(lambda: buf.storage.read_rows(0, stored))  # what survives
    data = {k: v.cpu().numpy() if v.dtype != torch.bfloat16 else v.view(torch.int16).numpy()
            for k, v in rows.items()}
    return {
        "schema_version": SCHEMA_VERSION,
        "spec": buf.spec.to_config(),
        "capacity": buf.capacity,
        "selector": buf.selector.to_config(),
        "selector_state": buf.selector.state_dict(),
        "counters": {"inserted": buf.ring.inserted, "sampled": buf.counts.sampled, "head": buf.ring.head,
                     "dropped_stale": buf.counts.dropped_stale, "floor": buf.ring.floor, "lost": buf.counts.lost,
                     "evicted_early": buf.ring.evicted_early, "holes": buf.ring.holes},
        "pools": {name: pool.state() for name, pool in buf.storage.pools.items()},
        "open_tail": [[int(k), int(v)] for k, v in buf.ring.open_tail.items()],
        "rng": buf.rng.bit_generator.state,
        "data": data,
        "meta": {k: v[:stored].copy() for k, v in buf.meta.items()},
        "ingest": buf.ingest_ledger.state(),
    }


def restore_state(buf, checked: dict) -> None:
    """Write a state ``check_state`` has validated into the buffer's parts (lock held)."""
    enc, meta, c, stored = checked["data"], checked["meta"], checked["counters"], checked["stored"]
    if stored:
        buf.storage.write(0, enc, stored)
    written = min(buf.ring.inserted, buf.capacity)  # slots this buffer wrote before: cleared past `stored`
    for k in META_FIELDS:
        buf.meta[k][:stored] = meta[k]
        if written > stored:
            buf.meta[k][stored:written] = 0
    buf.ring.inserted, buf.counts.sampled = c["inserted"], c["sampled"]
    buf.ring.head, buf.counts.dropped_stale, buf.counts.lost = c["head"], c["dropped_stale"], c["lost"]
    buf.ring.floor, buf.ring.evicted_early = c["floor"], c["evicted_early"]
    buf.ring.holes = c["holes"]
    for name, pstate in checked["pools"].items():
        buf.storage.pools[name].load(pstate)
    buf.ring.open_tail = checked["open_tail"]
    buf.rng.bit_generator.state = checked["rng"]
    buf.selector.load_state_dict(checked["selector_state"])
    if checked["ingest"] is not None:   # receipts committed before the checkpoint stay committed
        buf.ingest_ledger = checked["ingest"]
