"""The Conduit conformance suite: how an adapter proves it preserves semantics and convergence.

One registry of named checks (stable ids such as ``ingest/exactly_once``), three ways in:

- ``check_adapter(harness) -> Report``: runs every applicable check, collects every failure
- ``class TestMine(ConformanceTests)``: a pytest base class an adapter author subclasses
- ``conduit conformance NAME|module:factory``: the CLI (also ``pytest --conduit-adapter=...``)

An adapter takes part through a :class:`Harness` (see ``harness.py``): it builds sessions
that push synthetic rollouts through the adapter's real ingestion path and read what the
real delivery path hands the learner, plus, where it has one, the framework's native path
as the oracle.
"""

from .harness import (AsyncQueue, ConvergenceResult, Delivered, DeliveredRows, DeliveredSequence,
                      DeliveredTimeMajor, Harness, Session, SyntheticRollout)
from .registry import REGISTRY, Check, CheckFailed, CheckSkipped, NotApplicable
from .report import Report
from .runner import check_adapter, load_harness
from .testing import ConformanceTests

# Importing the check modules fills the registry (one list: catalog.py).
from . import catalog as _catalog  # noqa: E402,F401

__all__ = ["AsyncQueue", "Check", "CheckFailed", "CheckSkipped", "NotApplicable", "ConformanceTests", "ConvergenceResult", "Delivered", "DeliveredRows", "DeliveredSequence",
           "DeliveredTimeMajor", "Harness",
           "REGISTRY", "Report", "Session", "SyntheticRollout", "check_adapter", "load_harness"]
