"""verl's own V1 replay buffer, with the rows of each sampled batch in an order that does not depend on timing.

Why (verl 0.9.1): the V1 replay buffer returns a batch's rows in the order their trajectories reached
TransferQueue (`ReplayBuffer._materialize_batch`, trainer/ppo/v1/replay_buffer.py:394-406, iterates
the partition's keys in insertion order), i.e. in the order concurrent agent-loop tasks finished. The
keys themselves are `{uuid4}_{session}_{i}` (trainer_base.py:1476), and which of a group's n identical
prompts reaches the rollout server first is a race. Two same-seed runs then cut micro-batches from the
same rows in different orders, and float sums differ in the last bit (seen: grad_norm 0.8533840179 vs
0.8533839583 at step 1). Sorting the rows by their token content (prompt + response) makes the batch
order a function of the data alone; group rows stay adjacent because they share the prompt prefix.

Selected with `trainer.v1.sampler.custom_sampler.{path,name}` (trainer_base.py:140-153); the trainer
passes the custom class only the base constructor arguments, which is what this class needs. It also
polls TransferQueue every 0.2 s instead of verl's 2 s (`poll_interval`, replay_buffer.py:144), which
was most of the "gen" stage time of a tiny CPU step. `content_ordered_replay_buffer` picks the base
the way verl does (trainer_base.py:153): `ReplayBuffer` for trainer_mode "sync", else `ReplayBufferAsync`.
"""

from __future__ import annotations

import transfer_queue as tq

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

POLL_INTERVAL_S = 0.2


class _ContentOrder:
    def _materialize_batch(self, partition_id, selected_prompt_uids, partition_snapshot):
        batch = super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)
        if len(batch.keys) < 2:
            return batch
        data = tq.kv_batch_get(keys=batch.keys, partition_id=partition_id, select_fields=["input_ids"])
        rows = [tuple(row.tolist()) for row in data["input_ids"].unbind()]
        order = sorted(range(len(rows)), key=lambda i: (rows[i], batch.keys[i]))
        batch.reorder(order)
        return batch


class ContentOrderedReplayBuffer(_ContentOrder, ReplayBuffer):
    pass


class ContentOrderedReplayBufferAsync(_ContentOrder, ReplayBufferAsync):
    pass


def content_ordered_replay_buffer(*, trainer_mode: str, **kwargs):
    """What `trainer.v1.sampler.custom_sampler.name` names: called with the trainer's sampler kwargs."""
    kwargs.setdefault("poll_interval", POLL_INTERVAL_S)
    cls = ContentOrderedReplayBuffer if trainer_mode == "sync" else ContentOrderedReplayBufferAsync
    return cls(trainer_mode=trainer_mode, **kwargs)
