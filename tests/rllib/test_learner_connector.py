"""ConduitLearnerConnector: a DeliveredBatch becomes the learner's columns under RLlib's names,
moved to the learner's device only where it is not there already."""

import numpy as np
import pytest
import torch

pytest.importorskip("ray.rllib")

from conduit_core import Batch  # noqa: E402
from conduit_rllib.learner import ConduitLearnerConnector  # noqa: E402
from conduit_rllib.replay_buffer import DeliveredBatch  # noqa: E402


def delivered(weights=True):
    data = {"obs": torch.arange(8.0).reshape(4, 2), "action": torch.tensor([0, 1, 1, 0]),
            "reward": torch.ones(4), "extra_model_outputs.q.a": torch.zeros(4),
            "extra_model_outputs.obs": torch.full((4,), 7.0)}   # a name clash: the stored column wins
    return Batch(data, slots=np.arange(4), seqs=np.arange(4), versions=np.zeros(4, np.int64),
                 weights=torch.full((4,), 0.5) if weights else None, inserted_at_selection=4)


def run(device, batch):
    conn = ConduitLearnerConnector(inner=None, device=device, log_provenance=False)
    return conn(rl_module=None, batch={}, episodes=[DeliveredBatch(batch)])["default_policy"]


def test_a_host_batch_for_a_cpu_learner_is_handed_over_as_is():
    b = delivered()
    cols = run("cpu", b)
    assert set(cols) == {"obs", "actions", "rewards", "q", "weights"}
    assert cols["obs"] is b["obs"] and cols["weights"] is b.weights   # nothing copied, the clash's loser dropped
    assert set(cols["q"]) == {"a"} and cols["q"]["a"] is b["extra_model_outputs.q.a"]


@pytest.mark.parametrize("weights", [True, False])
def test_a_batch_for_another_device_is_moved_column_by_column(weights):
    b = delivered(weights=weights)
    b["reward"] = b["reward"].to("meta")   # already there: handed over as is
    cols = run("meta", b)
    assert {k: v.device.type for k, v in cols.items() if k != "q"} == dict.fromkeys(
        ("obs", "actions", "rewards", "weights"), "meta")
    assert cols["q"]["a"].device.type == "meta" and cols["obs"].shape == (4, 2) and cols["weights"].shape == (4,)
    assert cols["rewards"] is b["reward"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: a batch partly on it, for a CPU learner")
@pytest.mark.parametrize("off_host", ["column", "weights"])
def test_a_cpu_learner_given_a_batch_partly_elsewhere_gets_it_all_on_the_host(off_host):
    b = delivered()
    if off_host == "column":
        b["obs"] = b["obs"].to("cuda")
    else:
        b.weights = b.weights.to("cuda")
    cols = run("cpu", b)
    for k, v in cols.items():
        assert all(x.device.type == "cpu" for x in (v.values() if k == "q" else (v,))), k


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_floating_columns_reach_the_learner_as_rllibs_connector_hands_them_over(device):
    """RLlib's NumpyToTensor makes every floating tensor but float16 a float32 one (Meta-World's
    float64 observations reach SAC's float32 networks that way); integers, bools and float16 stay."""
    from ray.rllib.utils.torch_utils import convert_to_torch_tensor
    b = delivered()
    b["obs"] = b["obs"].double()
    b["extra_model_outputs.q.a"] = b["extra_model_outputs.q.a"].to(torch.bfloat16)
    b["reward"] = b["reward"].half()
    cols = run(device, b)
    assert cols["obs"].dtype == convert_to_torch_tensor(np.zeros(2, np.float64)).dtype == torch.float32
    assert cols["q"]["a"].dtype == torch.float32 and cols["rewards"].dtype == torch.float16
    assert cols["actions"].dtype == torch.int64
    b2 = delivered()
    b2["terminated"] = torch.tensor([True, False, False, True])
    assert run(device, b2)["terminateds"].dtype == torch.bool
    if device == "cpu":
        assert torch.equal(cols["obs"], b["obs"].float())
