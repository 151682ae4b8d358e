"""Algorithm subclasses that add buffer checkpointing and build-time checks, nothing else.

They are set as the config's ``algo_class`` by ``conduit_rllib.enable``; the training
step, sampling, learner updates and weight syncs are RLlib's own.
"""

from __future__ import annotations

from ray.rllib.algorithms.dqn import DQN
from ray.rllib.algorithms.ppo import PPO

from .checkpointing import BufferCheckpointMixin, check_capacity


class ConduitDQN(BufferCheckpointMixin, DQN):
    def setup(self, config):
        super().setup(config)
        check_capacity(self)

    def cleanup(self):
        buf = getattr(self, "local_replay_buffer", None)
        super().cleanup()
        if buf is not None and hasattr(buf, "close"):
            buf.close()


class ConduitPPO(BufferCheckpointMixin, PPO):
    pass
