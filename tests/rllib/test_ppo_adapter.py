"""PPO through Conduit with the real RLlib: trains, minibatches follow RLlib's order."""

import numpy as np
import pytest

import conduit_rllib
from conduit_rllib import workloads
from conduit_rllib.ppo import ConduitPPOTorchLearner, minibatch_order


def small_ppo(num_env_runners=0, **kw):
    cfg = workloads.ppo_cartpole(seed=2, num_env_runners=num_env_runners)
    cfg.training(train_batch_size_per_learner=400, minibatch_size=64, num_epochs=2)
    return conduit_rllib.enable(cfg, **kw)


@pytest.mark.parametrize("num_env_runners", [0, 1])
def test_ppo_trains_through_conduit(ray_session, num_env_runners):
    algo = small_ppo(num_env_runners).build_algo()
    try:
        learner = algo.learner_group._learner
        assert isinstance(learner, ConduitPPOTorchLearner)
        for _ in range(2):
            res = algo.train()
        m = learner._conduit_path.edp.metrics()
        assert m.ingest.calls == 2 and m.deliver.calls == 2  # one train batch in, once out, per update
        assert m.dropped_stale == 0 and len(learner._conduit_path.edp.buffer) == 0  # all consumed
        assert res["learners"]["default_policy"]["num_module_steps_trained"] > 0
    finally:
        algo.stop()


def test_minibatch_order_matches_rllibs_cyclic_iterator():
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator
    n, mb, epochs = 10, 4, 3
    batch = MultiAgentBatch({"p": SampleBatch({"i": np.arange(n)})}, n)
    theirs = [m.policy_batches["p"]["i"].tolist() for m in
              MiniBatchCyclicIterator(batch, num_epochs=epochs, minibatch_size=mb, shuffle_batch_per_epoch=False)]
    ours = minibatch_order(n, num_epochs=epochs, minibatch_size=mb, shuffle=False,
                           rng=np.random.default_rng(0)).tolist()
    assert ours == theirs
    shuffled = minibatch_order(n, num_epochs=epochs, minibatch_size=mb, shuffle=True, rng=np.random.default_rng(0))
    assert shuffled.shape == (len(theirs), mb)
    flat = shuffled.reshape(-1)
    assert flat[:n].tolist() == list(range(n))  # RLlib's first pass is in batch order
    for e in range(1, epochs):  # each later epoch is a full permutation (32 slots = 3 epochs + 2 rows)
        assert sorted(flat[e * n:(e + 1) * n].tolist()) == list(range(n))
    assert flat[:n].tolist() != flat[n:2 * n].tolist()


def test_ppo_unknown_option_is_rejected():
    from conduit_core import ConfigError
    with pytest.raises(ConfigError, match="staleness_"):
        small_ppo(staleness_=1)
