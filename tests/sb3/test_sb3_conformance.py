"""The conformance suite over the worked third-party example, the Stable-Baselines3 adapter:
semantic level (SB3's own ReplayBuffer as the oracle, the exact check on SB3's random stream)
and convergence (SB3's DQN on CartPole, native vs Conduit, the spread measured on 20 native seeds)."""

from conduit_conformance import ConformanceTests


class TestSB3Conformance(ConformanceTests):
    level = "convergence"

    def make_harness(self):
        from conduit_sb3.conformance import harness
        return harness()
