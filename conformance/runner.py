"""``check_adapter``: run the registry against a harness and collect every result."""

from __future__ import annotations

import fnmatch
import importlib
import time
from typing import TYPE_CHECKING, Iterable

from .harness import CAPABILITIES, Harness
from .registry import REGISTRY, CheckFailed, CheckSkipped, NotApplicable
from .report import CheckResult, Report

if TYPE_CHECKING:
    from .registry import Check

KNOWN_ADAPTERS = {
    "rllib": "conduit_rllib.conformance:harness",
    "example": "conduit_conformance.examples.conduit_minirl.conformance:harness",
    "verl": "conduit_verl.conformance:harness",
    "srl": "conduit_srl.conformance:harness",     # in a venv with real SRL (scripts/srl/)
}


HARNESS_GROUP = "conduit.harnesses"   # entry points: name -> "module:factory" (an installed adapter's harness)


def known_adapters() -> dict[str, str]:
    """Harnesses by name: the project's own, and those installed adapters register (``conduit.harnesses``)."""
    from importlib.metadata import entry_points
    return {**KNOWN_ADAPTERS, **{ep.name: ep.value for ep in entry_points(group=HARNESS_GROUP)}}


def load_harness(spec: str) -> Harness:
    """A name (the project's adapters, 'example', or one an installed adapter registers through the
    ``conduit.harnesses`` entry points), or 'package.module:factory' (a Harness instance or a
    callable returning one)."""
    known = known_adapters()
    target = known.get(spec, spec)
    if ":" not in target:
        raise ValueError(f"adapter: expected one of {sorted(known)} or 'module:factory', got {spec!r}. "
                         "Fix: pass e.g. conduit_myfw.conformance:harness, or install the adapter's package "
                         "(its pyproject registers the name under [project.entry-points.\"conduit.harnesses\"])")
    mod_name, attr = target.split(":", 1)
    obj = getattr(_import_adapter_module(mod_name), attr)
    if isinstance(obj, type) and not issubclass(obj, Harness):
        raise TypeError(f"adapter: {target} is the class {obj.__name__}, expected a conformance.Harness (a subclass, "
                        "an instance, or a function returning one). Fix: point at your Harness, e.g. "
                        f"{mod_name}:harness")
    harness = obj() if callable(obj) and not isinstance(obj, Harness) else obj
    if not isinstance(harness, Harness):
        raise TypeError(f"adapter: {target} gave {type(harness).__name__}, expected a conformance.Harness")
    check_capabilities(harness)   # (at load too: the CLI reports load errors cleanly)
    return harness


def _import_adapter_module(mod_name: str):
    """Import an adapter's module; an adapter package in the current folder (what
    ``conduit new-adapter`` creates) is found without PYTHONPATH, as pytest finds it."""
    import os
    import sys
    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        top = mod_name.split(".")[0]
        if exc.name != top or not os.path.isdir(os.path.join(os.getcwd(), top)):
            if exc.name == top:
                raise ModuleNotFoundError(
                    f"adapter package {top!r} is neither installed nor a folder in {os.getcwd()}. Fix: run from "
                    f"the folder that holds {top}/, or pip install -e it", name=exc.name) from None
            raise
    sys.path.insert(0, os.getcwd())
    return importlib.import_module(mod_name)


def load_xfails(path: str | None) -> dict[str, str]:
    """An xfails file: one 'check/id: reason' per line ('#' comments). A reason is required."""
    if not path:
        return {}
    out = {}
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            cid, sep, reason = line.partition(":")
            if not sep or not reason.strip():
                raise ValueError(f"{path}:{n}: expected 'check/id: reason', got {line!r}. Fix: give every "
                                 "expected failure a reason")
            out[cid.strip()] = reason.strip()
    return out


def check_capabilities(harness: Harness) -> None:
    """A misspelt capability would only skip the checks it names, silently: refused here."""
    unknown = sorted(set(harness.capabilities) - CAPABILITIES)
    if unknown:
        raise ValueError(f"{type(harness).__name__}.capabilities: expected names among {sorted(CAPABILITIES)}, got "
                         f"{unknown}. Fix: spell them as listed (docs/writing-an-adapter.md, capabilities), or "
                         "remove them")


def expand(harness: Harness, level: str) -> list[tuple[str, object, tuple]]:
    """(result id, check, extra args) for every check at or below ``level``."""
    check_capabilities(harness)
    levels = ("semantic",) if level == "semantic" else ("semantic", "convergence")
    out = []
    for cid, chk in REGISTRY.items():
        if chk.level not in levels:
            continue
        if cid.endswith("/*"):
            for name, run in sorted(harness.convergence_workloads().items()):
                out.append((cid[:-1] + name, chk, (name, run)))
            if not harness.convergence_workloads():
                out.append((cid[:-1] + "none", chk, ("none", None)))
        else:
            out.append((cid, chk, ()))
    return out


def run_one(harness: Harness, chk: Check, args: tuple, *, seed: int) -> tuple[str, str]:
    from .checks_semantic import Ctx
    missing = sorted(chk.needs - set(harness.capabilities))
    if missing:
        return "skip", f"needs capability {', '.join(missing)}"
    declared = ", ".join(sorted(chk.needs)) or "what it needs"
    if args and args[1] is None:
        return "fail", (f"the harness declares {declared} but offers no convergence workload. Fix: return one "
                        "from convergence_workloads(), or do not declare the capability")
    try:
        measured = chk.fn(Ctx(harness, seed), *args)  # a check may return what it measured, for the report
    except NotApplicable as exc:
        return "skip", str(exc)
    except CheckSkipped as exc:   # what the check needs is declared: a missing piece is a failure, not a skip
        return "fail", (f"the harness declares {declared} but: {exc}. Fix: provide it, or do not declare "
                        "the capability")
    except (CheckFailed, AssertionError) as exc:
        return "fail", str(exc) or type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - an adapter crash is a failure of that check
        return "fail", f"{type(exc).__name__}: {exc}"
    return "pass", measured if isinstance(measured, str) else ""


def check_adapter(harness: Harness, *, level: str = "semantic", seed: int = 0, xfails: dict[str, str] | None = None,
                  select: Iterable[str] | None = None, require: Iterable[str] = ()) -> Report:
    """Run every applicable check; every failure is collected, not only the first. Nothing passes
    silently: a check skipped for an undeclared capability is listed as not certified in the report,
    a skip of a capability in ``require`` is a failure, and a ``select`` pattern that matches no
    check is an error."""
    require = sorted(set(require))
    unknown = sorted(set(require) - CAPABILITIES)
    if unknown:
        raise ValueError(f"require: expected capabilities among {sorted(CAPABILITIES)}, got {unknown}. Fix: spell "
                         "them as listed (docs/writing-an-adapter.md, capabilities)")
    import conduit_core
    xfails = dict(xfails or {})
    departures = dict(getattr(harness, "known_departures", {}))   # the adapter's own, with why
    header = {"conduit": conduit_core.__version__, "adapter": harness.name, "adapter_version": harness.version,
              "framework": harness.framework, "framework_version": harness.framework_version, "level": level,
              "seed": seed, "capabilities": sorted(harness.capabilities), "required": require}
    report = Report(header)
    patterns = list(select or [])
    expanded = expand(harness, level)
    matched = {p: False for p in patterns}
    for rid, chk, args in expanded:
        hits = [p for p in patterns if fnmatch.fnmatch(rid, p) or p in rid]
        if patterns and not hits:
            continue
        for p in hits:
            matched[p] = True
        t0 = time.perf_counter()
        status, detail = run_one(harness, chk, args, seed=seed)
        undeclared = sorted(chk.needs - set(harness.capabilities))
        if status == "skip" and undeclared:
            report.not_certified.setdefault(", ".join(undeclared), []).append(rid)
            if set(undeclared) & set(require):
                status, detail = "fail", (f"capability {', '.join(sorted(set(undeclared) & set(require)))} is "
                                          "required (--require) but the harness does not declare it. Fix: declare "
                                          "and implement it, or do not require it")
        if rid in xfails or rid in departures:
            reason = xfails.pop(rid) if rid in xfails else departures[rid]
            if status == "fail":
                status, detail = "xfail", f"expected: {reason} ({detail})"
            elif status == "pass":
                status, detail = "xpass", f"expected to fail ({reason}) but passed: remove it from the xfails file"
        report.results.append(CheckResult(rid, status, detail, time.perf_counter() - t0))
    for rid, reason in xfails.items():
        report.results.append(CheckResult(rid, "error", f"xfails names an unknown or unselected check ({reason})"))
    for p, hit in matched.items():
        if not hit:
            report.results.append(CheckResult(f"select:{p}", "error", (
                f"-k {p!r} selects no check at level {level!r}; known ids: "
                f"{', '.join(rid for rid, _, _ in expanded)}. Fix: match an id (a substring or a glob)")))
    return report
