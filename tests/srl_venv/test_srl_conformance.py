"""The conformance suite over the SRL adapter, SRL's own replay buffers as the native oracle."""

from conduit_conformance import ConformanceTests


class TestSRLConformance(ConformanceTests):
    from conduit_srl.conformance import KNOWN_DEPARTURES as xfails

    def make_harness(self):
        from conduit_srl.conformance import harness
        return harness()
