"""Algorithm subclasses that add buffer checkpointing and build-time checks, nothing else.

They are set as the config's ``algo_class`` by ``conduit_rllib.enable``; the training
step, sampling, learner updates and weight syncs are RLlib's own.
"""

from __future__ import annotations

from ray.rllib.algorithms.dqn import DQN
from ray.rllib.algorithms.ppo import PPO

from conduit_core.errors import ConfigError

from .checkpointing import BufferCheckpointMixin, check_capacity


def check_learner_shards(algo) -> None:
    """The buffer delivers one part per learner: refuse a learner count changed after enable()."""
    buf = getattr(algo, "local_replay_buffer", None)
    want = max(1, algo.config.num_learners)
    if buf is not None and getattr(buf, "learner_shards", want) != want:
        raise ConfigError("num_learners", f"a value giving {buf.learner_shards} learner(s), as when "
                          "conduit_rllib.enable() ran", algo.config.num_learners,
                          "call conduit_rllib.enable(config) again after changing num_learners")


class ConduitDQN(BufferCheckpointMixin, DQN):
    def setup(self, config):
        super().setup(config)
        check_capacity(self)
        check_learner_shards(self)

    def cleanup(self):
        buf = getattr(self, "local_replay_buffer", None)
        super().cleanup()
        if buf is not None and hasattr(buf, "close"):
            buf.close()


class ConduitPPO(BufferCheckpointMixin, PPO):
    pass
