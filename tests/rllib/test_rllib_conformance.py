"""The conformance suite over the RLlib adapter, semantic and convergence levels
(convergence: RLlib's reference PPO and DQN CartPole workloads, native vs Conduit,
fixed seeds, the same env-step budget)."""

from conduit_conformance import ConformanceTests


class TestRLlibConformance(ConformanceTests):
    level = "convergence"

    def make_harness(self):
        from conduit_rllib.conformance import harness
        return harness()
