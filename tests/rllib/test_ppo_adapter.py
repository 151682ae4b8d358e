"""PPO through Conduit with the real RLlib: trains, minibatches follow RLlib's order."""

import numpy as np
import pytest

import conduit_rllib
from conduit_rllib import workloads
from conduit_rllib.ppo import ConduitMinibatches, ConduitPPOTorchLearner, minibatch_count, minibatch_order


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
        m = learner.conduit_paths['default_policy'].edp.metrics()
        assert m.ingest.calls == 2 and m.deliver.calls == 2  # one train batch in, once out, per update
        assert m.dropped_stale == 0 and len(learner.conduit_paths['default_policy'].edp.buffer) == 0  # all consumed
        assert res["learners"]["default_policy"]["num_module_steps_trained"] > 0
        conduit = res["learners"]["default_policy"]["conduit"]   # the plane's counters, in RLlib's result
        assert conduit["ingest_calls"] == 2 and conduit["deliver_calls"] == 2 and conduit["buffer_size"] == 0
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


@pytest.mark.parametrize("n, mb, total", [(10, 4, 7), (10, 4, 2), (8, 4, 5), (12, 5, 9)])
def test_minibatch_order_with_a_total_count_matches_rllibs(n, mb, total):
    """With several learners RLlib passes num_total_minibatches so every learner makes the
    same number of updates; the cyclic order runs on through the batch until that count."""
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator
    batch = MultiAgentBatch({"p": SampleBatch({"i": np.arange(n)})}, n)
    theirs = [m.policy_batches["p"]["i"].tolist() for m in
              MiniBatchCyclicIterator(batch, num_epochs=1, minibatch_size=mb, shuffle_batch_per_epoch=False,
                                      num_total_minibatches=total)]
    ours = minibatch_order(n, num_epochs=1, minibatch_size=mb, shuffle=False, rng=np.random.default_rng(0),
                           num_total_minibatches=total).tolist()
    assert ours == theirs and len(ours) == total


def test_ppo_trains_through_conduit_with_two_learners(ray_session):
    """num_learners=2 (data-parallel, DDP over gloo on CPU): each learner ingests its own shard
    of the episodes into its own FIFO plane and is delivered exactly that shard, once; both make
    the same number of updates (RLlib's num_total_minibatches)."""
    cfg = workloads.ppo_cartpole(seed=2, num_env_runners=0)
    cfg.training(train_batch_size_per_learner=200, minibatch_size=64, num_epochs=2)
    cfg.learners(num_learners=2, num_cpus_per_learner=1)
    algo = conduit_rllib.enable(cfg).build_algo()
    try:
        for _ in range(2):
            res = algo.train()

        def conduit_counts(learner):
            m = learner.conduit_paths['default_policy'].edp.metrics()
            from conduit_rllib.ppo import ConduitPPOTorchLearner
            return (isinstance(learner, ConduitPPOTorchLearner), m.ingest.calls, m.deliver.calls, m.ingest.items_in,
                    m.deliver.items_out, m.dropped_stale, len(learner.conduit_paths['default_policy'].edp.buffer),
                    learner.conduit_minibatches)
        counts = [r.get() for r in algo.learner_group.foreach_learner(conduit_counts)]
        assert len(counts) == 2
        for is_conduit, ingests, delivers, rows_in, rows_out, stale, left, _ in counts:
            assert is_conduit
            assert ingests == delivers == 2               # one shard in, once out, per update
            assert rows_in == rows_out > 0 and stale == 0 and left == 0
        (rows_a, mbs_a), (rows_b, mbs_b) = counts[0][-1], counts[1][-1]
        rows_a, rows_b = rows_a["default_policy"], rows_b["default_policy"]
        env_steps = res["env_runners"]["num_env_steps_sampled"]
        assert rows_a + rows_b >= env_steps >= 400          # the two shards of the train batch
        # both learners make RLlib's count: int(num_epochs * env steps / (learners * minibatch_size))
        assert mbs_a == mbs_b == int(2 * env_steps / (2 * 64))
        steps = res["learners"]["default_policy"]["num_module_steps_trained"]
        assert steps > 0
    finally:
        algo.stop()


def test_ppo_unknown_option_is_rejected():
    from conduit_core import ConfigError
    with pytest.raises(ConfigError, match="staleness_"):
        small_ppo(staleness_=1)


@pytest.mark.parametrize("rows, mb, epochs, total", [({"a": 10, "b": 23}, 4, 3, 0), ({"a": 7, "b": 7, "c": 30}, 5, 2, 0),
                                                     ({"a": 10, "b": 23}, 4, 1, 9), ({"a": 64, "b": 3}, 16, 2, 0)])
def test_multi_agent_minibatches_match_rllibs_cyclic_iterator(rows, mb, epochs, total):
    """Modules of different sizes: RLlib's iterator yields minibatches until every module has
    cycled through its rows num_epochs times (or num_total_minibatches), a smaller module cycling
    on meanwhile; Conduit's minibatches hold, module by module, the same rows in the same order."""
    import torch
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator
    batch = MultiAgentBatch({m: SampleBatch({"i": np.arange(n)}) for m, n in rows.items()}, max(rows.values()))
    theirs = [{m: b.policy_batches[m]["i"].tolist() for m in rows} for b in
              MiniBatchCyclicIterator(batch, num_epochs=epochs, minibatch_size=mb, shuffle_batch_per_epoch=False,
                                      num_total_minibatches=total)]
    count = minibatch_count(list(rows.values()), num_epochs=epochs, minibatch_size=mb, num_total_minibatches=total)
    parts = {m: ({"i": torch.arange(n)}, minibatch_order(n, num_epochs=epochs, minibatch_size=mb, shuffle=False,
                                                         rng=np.random.default_rng(0), count=count))
             for m, n in rows.items()}
    ours = [{m: b.policy_batches[m]["i"].tolist() for m in rows} for b in ConduitMinibatches(parts, env_steps=1)]
    assert ours == theirs and len(ours) == count


@pytest.mark.parametrize("shared", [False, True])
def test_multi_agent_ppo_trains_through_conduit(ray_session, shared):
    """RLlib's multi-agent CartPole, two agents on a policy each (two modules, each its own
    plane) or on one shared policy (one module, both agents' rows): every trained module's rows go
    in once and come out once per update, and each module trains."""
    cfg = workloads.ppo_multi_agent_cartpole(seed=2, shared=shared)
    cfg.training(train_batch_size_per_learner=400, minibatch_size=64, num_epochs=2)
    algo = conduit_rllib.enable(cfg).build_algo()
    try:
        learner = algo.learner_group._learner
        assert isinstance(learner, ConduitPPOTorchLearner)
        for _ in range(2):
            res = algo.train()
        modules = ["shared"] if shared else ["p0", "p1"]
        assert sorted(learner.conduit_paths) == modules
        rows, count = learner.conduit_minibatches
        for mid in modules:
            m = learner.conduit_paths[mid].edp.metrics()
            assert m.ingest.calls == m.deliver.calls == 2
            assert m.ingest.items_in == m.deliver.items_out > 0 and m.dropped_stale == 0
            assert len(learner.conduit_paths[mid].edp.buffer) == 0
            assert res["learners"][mid]["num_module_steps_trained"] > 0
        assert count == minibatch_count(list(rows.values()), num_epochs=2, minibatch_size=64)
    finally:
        algo.stop()


def test_multi_agent_ppo_path_is_closed_with_the_algorithm(ray_session):
    """The learner's planes (one per module) are closed when the algorithm stops."""
    cfg = workloads.ppo_multi_agent_cartpole(seed=3)
    cfg.training(train_batch_size_per_learner=200, minibatch_size=64, num_epochs=1)
    algo = conduit_rllib.enable(cfg).build_algo()
    learner = algo.learner_group._learner
    algo.train()
    planes = [p.edp for p in learner.conduit_paths.values()]
    algo.stop()
    assert len(planes) == 2 and all(p.closed for p in planes)
