"""The suite as a pytest module, for ``pytest --conduit-adapter=NAME --pyargs conduit_conformance.suite``."""

from __future__ import annotations

import pytest

from .runner import load_harness, load_xfails
from .testing import ConformanceTests


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
