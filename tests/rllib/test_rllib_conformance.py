"""The conformance suite over the RLlib adapter, semantic and convergence levels
(convergence: RLlib's reference PPO and DQN CartPole workloads, native vs Conduit,
fixed seeds, the same env-step budget)."""

from conduit_conformance import ConformanceTests


class TestRLlibConformance(ConformanceTests):
    level = "convergence"

    def make_harness(self):
        from conduit_rllib.conformance import harness
        # the CartPole workloads at CI's 2 seeds (~5 min); SAC Pendulum (~10 min a run) is measured in
        # the lab: docs/benchmarks.md, the RLlib SAC row
        from conduit_rllib.conformance import RLlibHarness
        return RLlibHarness(convergence=("dqn_cartpole", "ppo_cartpole"))
