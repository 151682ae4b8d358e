"""The verl adapter's conformance harness (``conduit conformance verl``).

The suite drives the adapter's on-policy data path: synthetic rollouts become verl
``DataProto`` batches (the layout GRPO's ingestion produces) pushed through
``UpdateBatchDelivery.ingest`` with their policy version, and deliveries are the per-rank
update batches it hands ``update_actor`` (DP size 1). GRPO ingestion's exact equality
with verl's sequential path is tested separately (tests/verl).

Capability 'async': the fully-async trainer's queue (``async_queue.ConduitMessageQueue``), the suite's
samples put as the rollouter puts its own (pickled ``RolloutSample``s whose rows carry the weight
versions), started when the queue ``admits`` their feed index."""

from __future__ import annotations

import numpy as np
import torch

import conduit_core
from conduit_conformance import AsyncQueue, Delivered, Harness, Session, SyntheticRollout


# the suite's columns -> the DataProto tensors update_actor reads (one token per response here)
VERL_NAMES = {"obs": "input_ids", "action": "responses", "reward": "token_level_scores"}


def to_dataproto(columns: dict, source: int):
    from verl import DataProto
    n = columns["obs"].shape[0]
    tensors = {"input_ids": torch.from_numpy(np.ascontiguousarray(columns["obs"])),
               "responses": torch.from_numpy(columns["action"]).view(n, 1),
               "token_level_scores": torch.from_numpy(columns["reward"]).view(n, 1)}
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.array([f"s{source}"] * n, dtype=object)})


class OnPolicySession(Session):
    def __init__(self):
        from .delivery import UpdateBatchDelivery
        self.delivery = UpdateBatchDelivery(dp_size=1)

    def ingest(self, rollout: SyntheticRollout) -> None:
        self.delivery.ingest(to_dataproto(rollout.columns(), rollout.source), version=rollout.policy_version,
                             source=rollout.source)

    def ingest_raw(self, columns, *, source: int = 0) -> None:
        self.delivery.ingest(to_dataproto(columns, source), version=0, source=source)

    def flush(self) -> None:
        if self.delivery.edp is not None:
            self.delivery.edp.flush()

    def deliver(self, batch_size, *, policy_version=None) -> Delivered:
        if self.delivery.edp is None:
            return Delivered(ids=np.zeros(0, np.int64))
        shards, pad = self.delivery.deliver(policy_version or 0)
        if not (shards and len(shards[0])):
            return Delivered(ids=np.zeros(0, np.int64))
        keep = lambda t: t[: len(t) - pad] if pad else t     # verl drops the padding after the update
        cols = {k: keep(torch.cat([s.batch[k] for s in shards])).numpy() for k in VERL_NAMES.values()}
        n = cols["input_ids"].shape[0]
        return Delivered(ids=cols["input_ids"][:, 0].astype(np.int64),
                         rows={key: cols[name].reshape(n, -1) if key == "obs" else cols[name].reshape(n)
                               for key, name in VERL_NAMES.items()})

    def stored_ids(self):
        from conduit_conformance.edp_session import stored_ids
        return np.zeros(0, np.int64) if self.delivery.edp is None else stored_ids(self.delivery.edp, "input_ids")

    def close(self) -> None:
        self.delivery.close()


class FullyAsyncQueue(AsyncQueue):
    """The suite's view of the fully-async trainer's queue: its samples as the rollouter's."""

    def __init__(self, *, per_version: int, staleness: int):
        from omegaconf import OmegaConf

        from .async_queue import ConduitMessageQueue
        config = OmegaConf.create({
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": per_version}},
            "async_training": {"require_batches": 1, "trigger_parameter_sync_step": 1,
                               "staleness_threshold": staleness},
            "trainer": {"resume_mode": "disable"}})
        self.config = config
        self.queue = ConduitMessageQueue(config, first_index=1)
        self.next_index = 1

    def try_admit(self):
        if not self.queue.admits(self.next_index):
            return None
        self.next_index += 1
        return self.next_index - 1

    def put(self, ticket, item, *, versions):
        import ray
        from verl import DataProto
        from verl.experimental.fully_async_policy.detach_utils import RolloutSample

        rows = DataProto.from_dict(
            tensors={"responses": torch.full((2, int(item["length"])), int(item["id"]))},
            non_tensors={"suite_id": np.array([item["id"]] * 2, dtype=object),
                         "min_global_steps": np.array([versions[0]] * 2, dtype=object),
                         "max_global_steps": np.array([versions[-1]] * 2, dtype=object)})
        sample = RolloutSample(full_batch=rows, sample_id=f"sample_0_{ticket}", epoch=0, rollout_status={})
        self.queue.put_sample(ray.cloudpickle.dumps(sample))

    def try_take(self, n):
        batch = self.queue.try_get_batch(n)
        return None if batch is None else [self._item(x) for x in batch]

    def publish_version(self, version):
        pass   # the queue counts verl's trainer's versions itself: one per per_version samples taken

    def pending(self):
        return [self._item(x) for x in self.queue.pending_samples()]

    def close(self):
        self.queue.clear_queue()

    @staticmethod
    def _item(data) -> dict:
        import ray
        rs = ray.cloudpickle.loads(data)
        return {"id": int(rs.full_batch.non_tensor_batch["suite_id"][0]),
                "length": int(rs.full_batch.batch["responses"].shape[1])}


class VerlHarness(Harness):
    name = "conduit_verl"
    version = conduit_core.__version__   # adapters are released at the core's version
    framework = "verl"
    capabilities = frozenset({"onpolicy", "async"})

    def async_queue(self, *, per_version, staleness):
        return FullyAsyncQueue(per_version=per_version, staleness=staleness)

    def __init__(self):
        import verl
        self.framework_version = verl.__version__

    def session(self, *, seed, capacity=10_000, prioritized=False, alpha=None, onpolicy=False,
                mode="sequential", staleness=0) -> Session:
        return OnPolicySession()


def harness() -> VerlHarness:
    return VerlHarness()
