"""Delivery for GRPO: the update batch through Conduit, prepared ahead of ``update_actor``.

The ingested iteration batch is written once into a FIFO data plane tagged with the
iteration (policy version); delivery takes exactly that version's rows once, rebuilds the
``DataProto`` (tensors from the buffer, non-tensor columns from a side table keyed by row),
pads it to the data-parallel size with verl's ``pad_dataproto_to_divisor`` and splits it
per rank (``DataProto.chunk``), moved to the update workers' device. ``prepare()`` does all
of that in a background thread so the learner's request finds it ready.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from conduit_core import ConfigError, ExperienceBuffer, ExperienceDataPlane, ExperienceSpec, FieldSpec, Fifo

ROW_ID = "conduit_row"


def _spec_of(batch) -> ExperienceSpec:
    fields = [FieldSpec(k, tuple(v.shape[1:]), v.dtype) for k, v in batch.batch.items()]
    return ExperienceSpec(fields + [FieldSpec(ROW_ID, (), torch.int64)])


class UpdateBatchDelivery:
    def __init__(self, *, dp_size: int = 1, device: str | torch.device = "cpu", tier: str = "pageable"):
        if dp_size < 1:
            raise ConfigError("dp_size", ">= 1", dp_size, "pass the actor's data-parallel size")
        self.dp_size, self.device, self.tier = dp_size, torch.device(device), tier
        self.edp: ExperienceDataPlane | None = None
        self._side: dict[int, dict[str, np.ndarray]] = {}
        self._meta: dict[int, dict] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conduit-verl-delivery")
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()

    def ingest(self, batch, *, version: int) -> None:
        """Write the iteration's batch once (its rows tagged with ``version``)."""
        spec = _spec_of(batch)
        n = len(batch)
        with self._lock:
            if self.edp is None or self.edp.buffer.spec != spec or self.edp.buffer.capacity < 2 * n:
                if self.edp is not None:
                    self.edp.close()
                buf = ExperienceBuffer(spec=spec, capacity=max(2 * n, 64), selector=Fifo(), tier=self.tier)
                self.edp = ExperienceDataPlane(buffer=buf)
            cols = {k: v for k, v in batch.batch.items()}
            cols[ROW_ID] = torch.arange(n, dtype=torch.int64)
            self.edp.ingest(cols, policy_version=version)
            self._side[version] = {k: v for k, v in batch.non_tensor_batch.items()}
            self._meta[version] = dict(batch.meta_info)

    def _build(self, version: int):
        from verl import DataProto
        from verl.protocol import pad_dataproto_to_divisor
        with self._lock:
            b = self.edp.deliver(None, policy_version=version)
            side = self._side.pop(version)
            meta = self._meta.pop(version)
        rows = b[ROW_ID].numpy()
        tensors = {k: v for k, v in b.items() if k != ROW_ID}
        data = DataProto.from_dict(tensors=tensors, non_tensors={k: v[rows] for k, v in side.items()}, meta_info=meta)
        padded, pad = pad_dataproto_to_divisor(data, self.dp_size)
        shards = padded.chunk(self.dp_size)
        if self.device.type != "cpu":
            shards = [s.to(self.device) for s in shards]
        return shards, pad

    def prepare(self, version: int) -> None:
        """Build the version's per-rank batches in the background (overlapping the caller)."""
        self._pending[version] = self._pool.submit(self._build, version)

    def deliver(self, version: int, timeout: float = 60.0):
        """The per-rank update batches and the padding added (verl drops it after the update)."""
        fut = self._pending.pop(version, None)
        return fut.result(timeout=timeout) if fut is not None else self._build(version)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self.edp is not None:
            self.edp.close()
