"""The learner's train batch for a delivered batch is what RLlib's own
``Learner._make_batch_if_necessary`` builds from the same connector output: the same
``MultiAgentBatch`` of ``SampleBatch`` es, field for field, value for value, key order too,
with containers never shared between two batches."""

import numpy as np
import pytest
import torch

pytest.importorskip("ray.rllib")

from ray.rllib.core.learner.learner import Learner  # noqa: E402
from ray.rllib.core.learner.training_data import TrainingData  # noqa: E402
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch  # noqa: E402

from conduit_core import Batch  # noqa: E402
from conduit_rllib.learner import ConduitDQNTorchLearner, ConduitLearnerConnector  # noqa: E402
from conduit_rllib.learner_batch import SampleBatchMaker  # noqa: E402
from conduit_rllib.replay_buffer import DeliveredBatch  # noqa: E402


def same_sample_batch(ours, theirs):
    assert type(ours) is type(theirs) is SampleBatch
    assert list(ours.keys()) == list(theirs.keys())
    for k in theirs:
        a, b = dict.__getitem__(ours, k), dict.__getitem__(theirs, k)
        assert a is b or (a.dtype == b.dtype and torch.equal(a, b)), k   # (unit weights: made per call)
    assert list(vars(ours)) == list(vars(theirs))
    for k, v in vars(theirs).items():
        w = vars(ours)[k]
        assert type(w) is type(v) and w == v, k
        if isinstance(v, (set, dict, list)):
            assert w is not v, k


def columns(rows=4, first_rows=None):
    cols = {"obs": torch.zeros(rows if first_rows is None else first_rows, 3), "actions": torch.arange(rows),
            "rewards": torch.ones(rows), "weights": torch.full((rows,), 0.5)}
    return cols


@pytest.mark.parametrize("cols", [
    columns(), columns(32), columns(4, first_rows=0),
    {**columns(), "q": {"a": torch.zeros(4)}},                  # nested extras: the constructor
    {**columns(), "infos": [{}, {}, {}, {}]},                   # a key it treats specially
    {**columns(), "seq_lens": torch.tensor([2, 2])},
    {**columns(), "is_training": True},
    {"scalar": torch.tensor(1.0), **columns()},                 # no rows to count on first
    {**columns(), "np": np.zeros(4)},
])
def test_the_maker_builds_what_the_constructor_builds(cols):
    maker = SampleBatchMaker(SampleBatch)
    for _ in range(3):   # the first builds the layout; the next ones copy
        same_sample_batch(maker.build(dict(cols)), SampleBatch(dict(cols)))


def test_plain_tensor_columns_take_the_copy_and_a_nested_tensor_the_constructor():
    maker = SampleBatchMaker(SampleBatch)
    cols = columns()
    maker.build(cols)
    assert maker._layouts[tuple(cols)] is not None   # (an RLlib whose constructor cannot be copied: slower, not wrong)
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    for odd in ({**cols, "obs": nested}, {"a": torch.zeros(0), "b": nested}):
        same_sample_batch(maker.build(dict(odd)), SampleBatch(dict(odd)))


def test_two_built_batches_share_no_container():
    maker = SampleBatchMaker(SampleBatch)
    a, b = maker.build(columns()), maker.build(columns())
    a.accessed_keys.add("obs")
    a["obs"]   # SampleBatch tracks accessed keys: b's set must not see a's
    a.intercepted_values["x"] = 1
    assert b.accessed_keys == set() and b.intercepted_values == {}
    assert a.count == b.count == 4 and maker.build(columns(7)).count == 7


def test_a_value_of_another_type_under_known_keys_goes_to_the_constructor():
    maker = SampleBatchMaker(SampleBatch)
    maker.build(columns())
    odd = {**columns(), "rewards": [1.0, 1.0, 1.0, 1.0]}   # same keys, a list: converted by RLlib
    out = maker.build(odd)
    assert isinstance(out["rewards"], np.ndarray) and out.count == 4


def delivered(rows=4, weights=True):
    data = {"obs": torch.arange(rows * 2.0).reshape(rows, 2), "action": torch.arange(rows) % 2,
            "reward": torch.ones(rows), "terminated": torch.zeros(rows, dtype=torch.bool)}
    return Batch(data, slots=np.arange(rows), seqs=np.arange(rows), versions=np.zeros(rows, np.int64),
                 weights=torch.full((rows,), 0.5) if weights else None, inserted_at_selection=rows)


def learner_with(connector):
    learner = object.__new__(ConduitDQNTorchLearner)   # (no module or device needed by this path)
    learner._learner_connector = connector
    learner._module = None
    learner.metrics = None
    learner._conduit_sample_batches = SampleBatchMaker(SampleBatch)
    return learner


@pytest.mark.parametrize("weights", [True, False])
@pytest.mark.parametrize("rows", [1, 32])
def test_the_train_batch_is_rllibs_for_the_same_delivery(rows, weights):
    learner = learner_with(ConduitLearnerConnector(inner=None, device="cpu", log_provenance=False))
    batch = delivered(rows, weights)
    for _ in range(3):
        ours = learner._make_batch_if_necessary(TrainingData(episodes=[DeliveredBatch(batch)]))
        theirs = Learner._make_batch_if_necessary(learner, TrainingData(episodes=[DeliveredBatch(batch)]))
        assert type(ours) is type(theirs) is MultiAgentBatch
        assert ours.count == theirs.count == rows and list(vars(ours)) == list(vars(theirs))
        assert list(ours.policy_batches) == list(theirs.policy_batches)
        for mid in theirs.policy_batches:
            same_sample_batch(ours.policy_batches[mid], theirs.policy_batches[mid])


def test_anything_but_one_delivered_batch_takes_rllibs_path():
    seen = []

    class Inner:
        def __call__(self, **kw):
            seen.append(kw["episodes"])
            return {"default_policy": columns()}

    learner = learner_with(ConduitLearnerConnector(inner=Inner(), device="cpu", log_provenance=False))
    episodes = [[0, 1], [2]]   # (anything with a len: RLlib counts env steps as the episodes' lengths)
    out = learner._make_batch_if_necessary(TrainingData(episodes=episodes))
    assert seen == [episodes] and out.count == 3 and out.policy_batches["default_policy"].count == 4
    with pytest.raises(ValueError, match="one DeliveredBatch per learner"):
        learner._make_batch_if_necessary(TrainingData(episodes=[DeliveredBatch(delivered())] * 2))
