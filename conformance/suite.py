"""The suite as a pytest module, for ``pytest --conduit-adapter=NAME --pyargs conformance.suite``."""

from __future__ import annotations

import pytest

from .runner import load_harness, load_xfails
from .testing import ConformanceTests


@pytest.fixture(scope="module")
def _options(request):
    name = request.config.getoption("--conduit-adapter", default=None)
    if not name:
        pytest.skip("pass --conduit-adapter=NAME to run the conformance suite")
    return name, request.config.getoption("--conduit-level"), request.config.getoption("--conduit-xfails")


class TestConformance(ConformanceTests):
    @pytest.fixture(scope="class")
    def conduit_harness(self, request):
        name = request.config.getoption("--conduit-adapter", default=None)
        if not name:
            pytest.skip("pass --conduit-adapter=NAME to run the conformance suite")
        type(self).level = request.config.getoption("--conduit-level")
        type(self).xfails = load_xfails(request.config.getoption("--conduit-xfails"))
        return load_harness(name)
