"""Found by a review of the RLlib adapter (session 23), each failing on the code before:
``enable()`` replaced a user's own learner and algorithm classes, told prioritized from
uniform by a substring of the buffer type's name, and let PPO ignore options; the buffer
ignored ``add(weight=...)`` and one-step ``min_batch_length_T``, took the uniform buffer's
defaults from the prioritized one, ignored ``to_numpy``, accepted n-step forms and argument
names RLlib refuses, and applied a second ``update_priorities`` for one sample; string
"false" options were truthy. No Ray session: configs are built, not algorithms."""

import numpy as np
import pytest
from ray.rllib.algorithms.dqn import DQN, DQNConfig
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer

import conduit_rllib
from conduit_core import ConfigError
from conduit_rllib import workloads
from conduit_rllib.algorithms import ConduitDQN
from conduit_rllib.learner import ConduitDQNTorchLearner
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer

from .rllib_episodes import make_chunks


class UsersDQNLearner(DQNTorchLearner):
    pass


class UsersPPOLearner(PPOTorchLearner):
    pass


class UsersDQN(DQN):
    pass


class UsersConduitLearner(ConduitDQNTorchLearner):
    pass


class LoggingPER(PrioritizedEpisodeReplayBuffer):
    pass


class NotPrioritizedEpisodeBuffer(EpisodeReplayBuffer):
    pass


def test_a_users_learner_or_algorithm_class_is_refused_not_replaced():
    with pytest.raises(ConfigError, match="UsersDQNLearner.*ConduitDQNTorchLearner"):
        conduit_rllib.enable(workloads.dqn_cartpole().learners(learner_class=UsersDQNLearner))
    with pytest.raises(ConfigError, match="UsersPPOLearner.*ConduitPPOTorchLearner"):
        conduit_rllib.enable(workloads.ppo_cartpole().learners(learner_class=UsersPPOLearner))
    with pytest.raises(ConfigError, match="UsersDQN.*ConduitDQN"):
        conduit_rllib.enable(DQNConfig(algo_class=UsersDQN).environment("CartPole-v1"))
    # one built on Conduit's is kept, and enable() called twice keeps what the first set
    cfg = conduit_rllib.enable(workloads.dqn_cartpole().learners(learner_class=UsersConduitLearner))
    assert cfg.learner_class is UsersConduitLearner and cfg.algo_class is ConduitDQN
    assert conduit_rllib.enable(cfg).learner_class is UsersConduitLearner


@pytest.mark.parametrize("rb_type, prioritized", [
    (PrioritizedEpisodeReplayBuffer, True), (EpisodeReplayBuffer, False), ("PrioritizedEpisodeReplayBuffer", True),
    ("EpisodeReplayBuffer", False),
    ("ray.rllib.utils.replay_buffers.prioritized_episode_buffer.PrioritizedEpisodeReplayBuffer", True),
    (LoggingPER, None), (NotPrioritizedEpisodeBuffer, None), ("my_pkg.buffers.LoggingPER", None),
    ("MultiAgentPrioritizedEpisodeReplayBuffer", None)])
def test_the_buffer_kind_comes_from_the_class_not_a_substring_of_its_name(rb_type, prioritized):
    cfg = workloads.dqn_cartpole()
    cfg.training(replay_buffer_config={"type": rb_type, "capacity": 1000, "alpha": 0.6, "beta": 0.4})
    if prioritized is None:
        with pytest.raises(ConfigError, match=r"replay_buffer_config\['type'\]"):
            conduit_rllib.enable(cfg)
    else:
        assert conduit_rllib.enable(cfg).replay_buffer_config["prioritized"] is prioritized


@pytest.mark.parametrize("option", [dict(mode="overlapped"), dict(mode="auto"), dict(staleness=2),
                                    dict(delivery="columns"), dict(obs_codec=None), dict(reuse_outputs=0),
                                    dict(restore_missing_buffer=True)])
def test_ppo_refuses_the_options_it_would_ignore(option):
    with pytest.raises(ConfigError, match=next(iter(option))):
        conduit_rllib.enable(workloads.ppo_cartpole(), **option)
    conduit_rllib.enable(workloads.ppo_cartpole(), tier="pageable", seed=3)   # the two it reads


@pytest.mark.parametrize("option", [dict(restore_missing_buffer="false"), dict(store_infos="no"),
                                    dict(seed="abc"), dict(seed=1.5), dict(seed=-3), dict(seed=True),
                                    dict(tier="pagable")])
def test_options_of_the_wrong_type_are_refused_at_enable(option):
    with pytest.raises(ConfigError, match=next(iter(option))):
        conduit_rllib.enable(workloads.dqn_cartpole(), **option)


def test_conduits_buffer_takes_the_algorithm_configs_seed():
    cfg = conduit_rllib.enable(workloads.dqn_cartpole(seed=7))

    class Host:   # what RLlib's Algorithm.setup hands the buffer build (its frozen config)
        config = cfg
    buf = ConduitDQN._create_local_replay_buffer_if_necessary(Host(), cfg)
    assert buf.seed == 7
    cfg = conduit_rllib.enable(workloads.dqn_cartpole(seed=7), seed=11)   # the option wins
    Host.config = cfg
    assert ConduitDQN._create_local_replay_buffer_if_necessary(Host(), cfg).seed == 11


def filled(prioritized: bool) -> ConduitEpisodeReplayBuffer:
    buf = ConduitEpisodeReplayBuffer(capacity=10_000, prioritized=prioritized, alpha=0.6, seed=3)
    for chunk in make_chunks(5, with_extras=True)[0]:
        buf.add([chunk])
    return buf


def test_add_refuses_a_starting_priority_it_would_not_apply():
    buf = ConduitEpisodeReplayBuffer(capacity=100, prioritized=True)
    chunk = make_chunks(5)[0][0]
    with pytest.raises(ConfigError, match="weight"):
        buf.add([chunk], weight=0.01)
    assert len(buf) == 0   # refused before anything was stored
    buf.add([chunk])
    assert len(buf) == len(chunk)
    buf.close()


@pytest.mark.parametrize("prioritized", [True, False])
def test_sampling_arguments_rllib_refuses_are_refused(prioritized):
    buf = filled(prioritized)
    for bad in [(3, 3), (4, 2), [2, 4], (0, 2), (2.0, 4)]:
        with pytest.raises(ConfigError, match="n_step"):
            buf.sample(num_items=4, n_step=bad, sample_episodes=True)
    with pytest.raises(ConfigError, match="nstep"):
        buf.sample(num_items=4, nstep=3, sample_episodes=True)   # a misspelt name RLlib swallows
    got = buf.sample(num_items=4, n_step=(np.int64(2), np.int64(4)), sample_episodes=True)   # numpy ints are fine
    assert got
    buf.close()


def test_the_uniform_buffer_has_rllibs_uniform_defaults_and_refuses_what_it_does_not_draw():
    buf, native = filled(False), EpisodeReplayBuffer(capacity=10_000)
    for chunk in make_chunks(5, with_extras=True)[0]:
        native.add([chunk])
    ours, theirs = buf.sample(batch_size_B=2), native.sample(batch_size_B=2)   # both: the [B, T] batch form
    assert isinstance(ours, dict) and ours["obs"].shape == theirs["obs"].shape   # T = 64
    with pytest.raises(ConfigError, match="n_step"):
        buf.sample(num_items=4, sample_episodes=True)   # RLlib asserts n_step is given for episodes
    with pytest.raises(ConfigError, match="min_batch_length_T"):
        buf.sample(num_items=4, n_step=1, sample_episodes=True, min_batch_length_T=5)
    buf.close()


def test_to_numpy_gives_numpy_episodes_where_rllibs_prioritized_buffer_does():
    buf = filled(True)
    episodes = buf.sample(num_items=4, n_step=1, include_infos=True, to_numpy=True)
    assert all(ep.is_numpy for ep in episodes)
    buf.close()


def test_a_second_priority_update_for_one_sample_is_refused():
    buf = filled(True)
    buf.sample(num_items=4, n_step=1)
    buf.update_priorities(np.ones(4))
    with pytest.raises(ConfigError, match="update_priorities"):
        buf.update_priorities(np.full(4, 5.0))
    buf.sample(num_items=4, n_step=1)
    buf.update_priorities(np.ones(4))   # the next sample's update goes through
    buf.close()
