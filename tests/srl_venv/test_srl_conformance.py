"""The conformance suite over the SRL adapter, SRL's own replay buffers as the native oracle."""

from conduit_conformance import ConformanceTests


class TestSRLConformance(ConformanceTests):
    def make_harness(self):   # its known departures from SRL come with it (expected failures, with why)
        from conduit_srl.conformance import harness
        return harness()
