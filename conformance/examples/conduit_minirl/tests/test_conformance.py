"""The adapter's conformance tests: every registered check, one test each."""

from conduit_conformance import ConformanceTests

from ..conformance import harness


class TestAdapterConformance(ConformanceTests):
    def make_harness(self):
        return harness()
