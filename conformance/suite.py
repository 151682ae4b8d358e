"""The suite as a pytest module, for ``pytest --conduit-adapter=NAME --pyargs conduit_conformance.suite``."""

from __future__ import annotations

import pytest

# absolute: pytest's --pyargs may import this file as ``conformance.suite``, and relative imports
# would then make a second copy of the suite's classes (a harness would not be a Harness)
from conduit_conformance.runner import load_harness, load_xfails
from conduit_conformance.testing import ConformanceTests


class TestConformance(ConformanceTests):
    @pytest.fixture(scope="class")
    @classmethod
    def conduit_harness(cls, request):
        name = request.config.getoption("--conduit-adapter", default=None)
        if not name:
            pytest.skip("pass --conduit-adapter=NAME to run the conformance suite")
        cls.level = request.config.getoption("--conduit-level")
        cls.xfails = load_xfails(request.config.getoption("--conduit-xfails"))
        return load_harness(name)
