"""The conformance suite over the SRL adapter, SRL's own replay buffers as the native oracle."""

from conduit_conformance import ConformanceTests


class TestSRLConformance(ConformanceTests):
    def make_harness(self):   # its known departures from SRL come with it (expected failures, with why)
        from conduit_srl.conformance import harness
        return harness()


def test_the_native_sentinel_is_never_drawn_stored_or_in_the_weights_normalisation():
    """SRL's native prioritized session puts a sentinel chunk where SRL's off-by-one cannot draw
    it; it must not normalise the weights either (suite priorities all above its initial 1.0)."""
    import numpy as np
    import pytest

    from conduit_conformance import SyntheticRollout
    from conduit_conformance.checks_semantic import _give_priorities
    from conduit_srl.conformance import SENTINEL_ID, SRLHarness

    nat = SRLHarness().native_session(seed=0, prioritized=True, alpha=0.6)
    nat.ingest(SyntheticRollout(np.arange(40)))
    _give_priorities(nat, 40, lambda ids: 2.0 + (np.asarray(ids).astype(np.int64) % 3), batch=8)
    assert nat.buffer._min_tree.min() == pytest.approx(2.0 ** 0.6)
    ids = np.concatenate([nat.deliver(64).ids for _ in range(50)])
    assert set(ids.tolist()) <= set(range(40))
    assert SENTINEL_ID not in nat.stored_ids() and len(nat.stored_ids()) == 40
    with pytest.raises(RuntimeError, match="sentinel"):
        nat.ingest(SyntheticRollout(np.arange(40, 42)))
