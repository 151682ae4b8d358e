"""Reused outputs (reuse_outputs=k): each batch gets tensors of its own, and a wrapper a caller changed in place is repaired.
Each test failed before its fix."""

import numpy as np


from conduit_core import (ExperienceBuffer, ExperienceSpec)




def test_reused_outputs_hand_each_batch_tensors_of_its_own():
    """Found in review: with reused outputs every delivery returned the same tensor objects, so an
    in-place shape change (unsqueeze_, resize_) leaked into later batches."""
    import torch

    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(4,)), capacity=64, reuse_outputs=2)
    n = 32
    buf.add({"obs": np.ones((n, 4), np.float32), "next_obs": np.ones((n, 4), np.float32),
             "action": np.zeros(n, np.int64), "reward": np.zeros(n, np.float32),
             "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)})
    first = buf.sample(8)
    first["obs"].unsqueeze_(0)
    buf.sample(8)
    third = buf.sample(8)
    assert third["obs"].shape == (8, 4) and third["obs"] is not first["obs"]
    assert isinstance(third["obs"], torch.Tensor)
    buf.close()


def test_reused_outputs_repair_a_wrapper_changed_in_place_by_requires_grad():

    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(4,)), capacity=64, reuse_outputs=1)
    n = 16
    buf.add({"obs": np.ones((n, 4), np.float32), "next_obs": np.ones((n, 4), np.float32),
             "action": np.zeros(n, np.int64), "reward": np.zeros(n, np.float32),
             "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)})
    buf.sample(8)["reward"].requires_grad_()
    assert not buf.sample(8)["reward"].requires_grad
    buf.close()
