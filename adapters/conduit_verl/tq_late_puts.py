"""A put whose storage units answered late, or not before the caller's cancel gave up on them:
what each unit stored of it is given back without waiting (the caller already has its error).

A unit is a sync Ray actor and runs one caller's calls in the order they were sent, so a
``revoke`` sent after a put it did not answer in time runs after that put, whenever the unit
gets to it (``StorageUnit.revoke`` keeps rows a later write touched). Outcomes are logged: no
caller waits for them any more.
"""

from __future__ import annotations

import logging

import ray

from . import tq_shared_path as shared_path


def revoke_late(units: list, late: list[int], call: str, rows: int) -> shared_path.UnitTimeout:
    """Queue a ``revoke`` of put ``call`` on each unit in ``late`` (they did not answer it in time).
    A unit runs one caller's calls in order, so each revoke runs after the put, whenever the unit gets
    to it; its outcome is logged then (a unit that stored rows a later write made its own keeps them).
    Returns the error for the caller."""
    log = logging.getLogger(__name__)
    for u in late:
        def outcome(future, u=u):
            try:
                said = future.result()
            except Exception as exc:   # noqa: BLE001 - logged: nothing waits for this call any more
                log.error("conduit_verl: unit %d could not revoke put %s (%r): it may hold rows TQ does not know of; "
                          "clear its keys or restart TransferQueue", u, call, exc)
                return
            if said == "forgotten":
                log.error("conduit_verl: unit %d stored put %s late and no longer knows how to undo it: it holds "
                          "rows TQ does not know of; clear its keys or restart TransferQueue", u, call)
            else:
                (log.warning if said == "kept" else log.info)(
                    "conduit_verl: unit %d answered put %s late; revoke: %s%s", u, call, said,
                    " (a later write holds those rows)" if said == "kept" else "")
        units[u].revoke.remote(call).future().add_done_callback(outcome)
    return shared_path.UnitTimeout(
        f"put of {rows} rows: storage unit(s) {late} did not answer within {shared_path.UNIT_CALL_TIMEOUT_S:.0f} s "
        "(a stuck or overloaded actor?). A revoke is queued behind the put on each: whatever it stores late is "
        "given back when the unit gets to it (logged; rows a later write touched stay that write's). Fix: check "
        "the unit; CONDUIT_TQ_UNIT_TIMEOUT_S sets the limit")


def give_back_unsettled(units: list, routes: list, refs: list, call: str, rows: int) -> None:
    """A put cancelled while a unit had not answered, past the cancel's grace: each unit that answered
    gives its part back and each that did not gets a revoke queued behind the put (``revoke_late``);
    neither is waited for (the caller's cancel is already late), their failures are logged."""
    log = logging.getLogger(__name__)
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    ready = set(ready)
    late = []
    for (u, _, _), ref in zip(routes, refs):
        if ref not in ready:
            late.append(u)
            continue
        try:
            undo = ray.get(ref, timeout=0)
        except Exception:   # noqa: BLE001 - this unit stored nothing of the put
            continue
        def restored(future, u=u):
            if future.exception() is not None:
                log.error("conduit_verl: unit %d could not give back its part of cancelled put %s (%r): it holds "
                          "rows TQ does not know of; clear its keys or restart TransferQueue", u, call,
                          future.exception())
        units[u].restore.remote(undo).future().add_done_callback(restored)
    if late:
        revoke_late(units, late, call, rows)
