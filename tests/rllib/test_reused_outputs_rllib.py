"""The RLlib adapter's reused outputs (``reuse_outputs``, 2 by default) in its overlapped mode:
once the buffer is full every ``add()`` evicts whole episodes, which discards the batches the
data plane prepared and draws new ones. The batch the last ``sample()`` returned must stay as it
was until the learner's next samples, however many adds come in meanwhile (it was overwritten
after two before session 29's fix, with no sample in between)."""

import time

import pytest
import torch

from .rllib_episodes import make_chunks


@pytest.mark.parametrize("keep", ["batch", "tensors"])
@pytest.mark.parametrize("mode", ["overlapped", "sequential"])
def test_the_last_sample_survives_evicting_adds(mode, keep):
    from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer
    chunks, _ = make_chunks(0, episodes=200, lengths=(4, 10), open_last=0)
    buf = ConduitEpisodeReplayBuffer(capacity=120, prioritized=True, conduit={"mode": mode})
    assert buf.options.reuse_outputs >= 1
    it = iter(chunks)
    try:
        for _ in range(30):
            buf.add([next(it)])
        [delivered] = buf.sample(16, n_step=1, beta=0.4)
        held = dict(delivered.batch)
        want = {k: v.clone() for k, v in held.items()}
        if keep == "tensors":   # the learner keeps the tensors, not the Batch
            del delivered
        evicted = buf.get_num_episodes_evicted()
        for _ in range(6):   # env runners' results come in; no sample() meanwhile
            time.sleep(0.05)   # (the worker prepares ahead)
            buf.add([next(it)])
            time.sleep(0.05)
            assert all(torch.equal(held[k], want[k]) for k in want)
        assert buf.get_num_episodes_evicted() > evicted   # (the adds evicted: the case under test)
    finally:
        buf.close()
