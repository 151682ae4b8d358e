"""The conformance suite over the RLlib adapter, semantic and convergence levels
(convergence: RLlib's reference PPO and DQN CartPole workloads, native vs Conduit,
fixed seeds, the same env-step budget)."""

from conduit_conformance import ConformanceTests


class TestRLlibConformance(ConformanceTests):
    level = "convergence"

    def make_harness(self):
        # the CartPole workloads at CI's 2 seeds (~5 min); SAC Pendulum (~10 min a run) is measured in
        # the lab: docs/benchmarks.md §20
        from conduit_rllib.conformance import RLlibHarness
        return RLlibHarness(convergence=("dqn_cartpole", "ppo_cartpole"))


def test_the_registered_harness_runs_every_workload_and_a_subset_is_checked_by_name():
    import pytest

    from conduit_core import ConfigError
    from conduit_rllib.conformance import WORKLOADS, RLlibHarness, harness
    assert set(harness().convergence_workloads()) == set(WORKLOADS) >= {"dqn_cartpole", "sac_pendulum"}
    with pytest.raises(ConfigError, match="sac_pendullum"):
        RLlibHarness(convergence=("sac_pendullum",))
