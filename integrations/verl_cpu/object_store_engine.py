"""A checkpoint engine that runs on CPU: backend "ray_object_store" for verl's disaggregated trainers.

Why this exists (verl 0.9.1, paths under verl/): the one-step-off and fully-async trainers keep the
trainer and the rollout replicas in separate resource pools and move weights between them with a
`CheckpointEngine` (checkpoint_engine/base.py:116). Their configs ask for "nccl"
(experimental/*/config/*_trainer.yaml); the registered engines are NCCL, HCCL, NIXL, Mooncake, Kimi and
"naive", which only works colocated (`ColocatedCheckpointEngine.prepare` raises). None runs on CPU.

This one hands the trained weights over through Ray's object store: the sender (actor rank 0) puts
the full tensors once and posts the reference to a small mailbox actor; each receiver (a rollout
replica's `CheckpointEngineWorker`) awaits the post of its next sync and reads the tensors. The other
actor ranks walk the weight generator without sending (producing each weight is collective over the
actor group). Syncs are counted on both sides, so a receiver never takes a sync twice or skips one.
Selected with `actor_rollout_ref.rollout.checkpoint_engine.backend=ray_object_store`; registered by
the plugin in every process (and named by `checkpoint_engine.custom_backend_module` for the workers
that import it themselves).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import ray
import torch

BACKEND = "ray_object_store"
MAILBOX = "conduit_cpu_checkpoint_mailbox"


class _Mailbox:
    """The newest posted weights (one reference) and its sync number; receivers wait for theirs."""

    def __init__(self) -> None:
        self.sync, self.ref, self.cond = 0, None, asyncio.Condition()

    async def post(self, sync: int, refs: list) -> None:
        async with self.cond:
            self.sync, self.ref = sync, refs[0]
            self.cond.notify_all()

    async def take(self, sync: int, timeout_s: float) -> list:
        async with self.cond:
            await asyncio.wait_for(self.cond.wait_for(lambda: self.sync >= sync), timeout_s)
            if self.sync != sync:
                raise RuntimeError(f"checkpoint engine '{BACKEND}': receiver waited for sync {sync}, the mailbox "
                                   f"holds {self.sync}; a receiver missed a sync (every replica must take each one)")
            return [self.ref]


def _mailbox():
    """The run's mailbox, made by whichever engine asks first. Detached: a named actor that is not would
    die with the references of the process that made it (measured: "The actor is dead because all
    references to the actor were removed" at the first sync), and the engines that use it live in
    several processes. One per Ray job (its name carries the job id); it goes with the run's cluster."""
    name = f"{MAILBOX}_{ray.get_runtime_context().get_job_id()}"
    return ray.remote(_Mailbox).options(name=name, get_if_exists=True, lifetime="detached", num_cpus=0,
                                        max_concurrency=64).remote()


def register() -> None:
    """Make `checkpoint_engine.backend=ray_object_store` resolvable in this process. Idempotent."""
    from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

    try:
        CheckpointEngineRegistry.get(BACKEND)
        return                                  # registered in this process already
    except ValueError:
        pass

    @CheckpointEngineRegistry.register(BACKEND)
    class RayObjectStoreCheckpointEngine(CheckpointEngine):
        wire_format = "named_tensors"

        def __init__(self, bucket_size: int, timeout_s: float = 600.0, **_: Any) -> None:
            self.bucket_size, self.timeout_s = bucket_size, timeout_s
            self.rank, self.syncs = None, 0

        def prepare(self) -> dict[str, Any]:
            return {"pid": os.getpid()}

        @classmethod
        def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
            actor = {"rank": list(range(actor_wg_world_size))}
            rollout = {"rank": [-1] * rollout_world_size}     # receivers
            return actor, rollout

        def init_process_group(self, *, rank: int, **_: Any) -> None:
            self.rank = rank
            self.mailbox = _mailbox()

        def finalize(self) -> None:
            return None

        async def send_weights(self, weights, global_steps: int | None = None):
            state = {}
            from verl.workers.rollout.utils import ensure_async_iterator
            async for name, tensor in ensure_async_iterator(weights):    # every actor rank: collectives
                if self.rank == 0:
                    if hasattr(tensor, "full_tensor"):
                        tensor = tensor.full_tensor()
                    state[name] = tensor.detach().to("cpu", copy=True)
            if self.rank != 0:
                return {}
            self.syncs += 1
            await self.mailbox.post.remote(self.syncs, [ray.put(state)])
            return {}

        async def receive_weights(self, global_steps: int | None = None):
            self.syncs += 1
            (ref,) = await self.mailbox.take.remote(self.syncs, self.timeout_s)
            state: dict[str, torch.Tensor] = await ref
            for name, tensor in state.items():
                yield name, tensor

    return None
