"""The pytest base class adapter authors subclass::

    from conduit_conformance import ConformanceTests

    class TestMyAdapter(ConformanceTests):
        def make_harness(self):
            return MyHarness()

Every registered semantic check becomes one test, ``test_check[ingest/exactly_once]``,
selectable with ``pytest -k``; a check the harness lacks the capability for is skipped
with the reason. Set ``level = "convergence"`` to include the convergence checks and
``xfails = {"check/id": "reason"}`` for known failures (an xfail that passes fails).
"""

from __future__ import annotations

import pytest

# every check module, before the ids are read below (catalog.py, the one list): a module imported
# later would never run from pytest (the n-step, sequence, row and async checks were not, in turn)
from . import catalog as _catalog  # noqa: F401  (fills the registry)
from .registry import REGISTRY
from .runner import expand, run_one


def _ids(level: str) -> list[str]:
    return [cid for cid, c in REGISTRY.items() if c.level == "semantic" or level == "convergence"]


class ConformanceTests:
    level = "semantic"
    seed = 0
    xfails: dict[str, str] = {}

    def make_harness(self):  # pragma: no cover - must be overridden
        raise NotImplementedError("override make_harness() to return your adapter's conformance.Harness")

    @pytest.fixture(scope="class")
    @classmethod
    def conduit_harness(cls):
        return cls().make_harness()

    @pytest.mark.parametrize("check_id", _ids("convergence"))
    def test_check(self, conduit_harness, check_id):
        if REGISTRY[check_id].level == "convergence" and self.level != "convergence":
            pytest.skip("convergence level not selected (set level = 'convergence')")
        ran = False
        for rid, chk, args in expand(conduit_harness, self.level):
            if chk.id != check_id:
                continue
            ran = True
            status, detail = run_one(conduit_harness, chk, args, seed=self.seed)
            reason = {**getattr(conduit_harness, "known_departures", {}), **self.xfails}.get(rid)
            if reason is not None:
                if status == "pass":
                    pytest.fail(f"{rid} is listed as an expected failure ({reason}) but passed")
                if status == "fail":
                    pytest.xfail(f"{reason}: {detail}")
            if status == "skip":
                pytest.skip(detail)
            if status == "fail":
                pytest.fail(f"{rid}: {detail}", pytrace=False)
        if not ran:
            pytest.skip("not applicable at this level")
