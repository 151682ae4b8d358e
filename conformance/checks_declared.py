"""The harness declares what its adapter offers.

Why this exists: a check whose capability is not declared is skipped, so a path the adapter
implements but the harness does not declare is never certified, and nothing says so but a line
in the report's "not certified" list. An adapter that delivered n-step windows without declaring
``nstep`` passed with the time-limit flag dropped and the configured n used where the window was
shorter. The suite reads what the harness and its sessions implement beyond the base classes
(``Harness``, ``Session``) and fails where the capability that would certify it is not declared.
A path the adapter offers but cannot pass is declared and listed as a known departure, with why.
"""

from __future__ import annotations

from .checks_semantic import _closing
from .harness import Harness, Session
from .registry import check, ensure

# what a session or harness implements -> the capability whose checks certify it
SESSION_OFFERS = {"deliver_rows": "nstep", "deliver_sequences": "sequences", "deliver_time_major": "time_major",
                  "update_priorities": "prioritized", "state": "state"}
HARNESS_OFFERS = {"shared_rng_sessions": "shared_rng", "time_major_sessions": "time_major", "async_queue": "async",
                  "native_session": "native", "convergence_workloads": "convergence"}


def offered(obj, base: type, offers: dict[str, str]) -> dict[str, str]:
    """method -> capability, for each of ``offers`` that ``obj``'s class implements beyond ``base``."""
    return {name: cap for name, cap in offers.items() if getattr(type(obj), name, None) is not getattr(base, name)}


@check("harness/declares_what_it_offers")
def declares_what_it_offers(ctx) -> str:
    """Every path the harness and its sessions implement is declared, so its checks run: a session
    with ``deliver_rows`` declares ``nstep``, a harness with ``async_queue`` declares ``async``, ..."""
    caps = set(ctx.harness.capabilities)
    found = {f"Harness.{m}": c for m, c in offered(ctx.harness, Harness, HARNESS_OFFERS).items()}
    # every kind of session the suite asks for (a harness may build another class for each)
    for need, kw in (("replay", {}), ("prioritized", {"prioritized": True}), ("onpolicy", {"onpolicy": True})):
        if need in caps:
            with _closing(ctx.session(**kw)) as s:
                found |= {f"{type(s).__name__}.{m}": c for m, c in offered(s, Session, SESSION_OFFERS).items()}
    missing = {where: cap for where, cap in found.items() if cap not in caps}
    ensure(not missing, "the adapter offers " + "; ".join(f"{w} but does not declare {c!r}" for w, c in
                                                          sorted(missing.items()))
           + ": those checks never run. Fix: declare the capability (and list a check it cannot pass in "
             "known_departures, with why), or remove the method")
    return f"declared: {', '.join(sorted(caps))}" if found else "no optional path implemented"
