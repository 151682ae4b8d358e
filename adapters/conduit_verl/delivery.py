"""Delivery for GRPO: the update batch through Conduit, prepared ahead of ``update_actor``.

The ingested iteration batch is written once into a FIFO data plane tagged with the
iteration (policy version); delivery takes exactly that version's rows once, rebuilds the
``DataProto`` (tensors from the buffer, non-tensor columns from a side table keyed by row),
pads it to the data-parallel size with verl's ``pad_dataproto_to_divisor`` and splits it
per rank (``DataProto.chunk``), moved to the update workers' device. ``prepare()`` does all
of that in a background thread so the learner's request finds it ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np
import torch

from conduit_core import (ConfigError, ExperienceBuffer, ExperienceDataPlane, ExperienceSpec, FieldSpec, Fifo,
                          ShardSpec, Tier)

if TYPE_CHECKING:
    from verl import DataProto

ROW_ID = "conduit_row"


def _spec_of(batch) -> ExperienceSpec:
    fields = [FieldSpec(k, tuple(v.shape[1:]), v.dtype) for k, v in batch.batch.items()]
    return ExperienceSpec(fields + [FieldSpec(ROW_ID, (), torch.int64)])


class UpdateBatchDelivery:
    """The update batch's hand-off. ``tier`` places the pending batches (pageable, pinned or
    device memory); ``device`` is where the update workers want them (the rows are delivered
    onto it by the data plane, then padded and split there)."""

    def __init__(self, *, dp_size: int = 1, device: str | torch.device = "cpu", tier: str = "pageable"):
        if dp_size < 1:
            raise ConfigError("dp_size", ">= 1", dp_size, "pass the actor's data-parallel size")
        self.dp_size, self.device, self.tier = dp_size, torch.device(device), tier
        self.edp: ExperienceDataPlane | None = None
        self._side: dict[int, dict[str, np.ndarray]] = {}
        self._rows: dict[int, int] = {}
        self._meta: dict[int, dict] = {}
        self._keys: dict[int, set] = {}   # a version's non-tensor keys, from its first part
        self._taken: dict[int, tuple] = {}   # a version's rows whose build failed after taking them
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conduit-verl-delivery")
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()

    def ingest(self, batch: DataProto, *, version: int, source: int = 0) -> None:
        """Write (part of) an iteration's batch once, its rows tagged with ``version``. Several
        calls may add to one version; a batch with other columns than the pending data is
        refused (nothing already accepted is dropped)."""
        from conduit_core import SpecError
        spec = _spec_of(batch)
        n = len(batch)
        with self._lock:
            if version in self._taken:   # its parts so far left the data plane with a failed delivery
                raise ConfigError(f"version {version}", "a version not being delivered", "one whose delivery failed "
                                  "and holds its rows", "deliver(version) again (it builds from those rows), then "
                                  "ingest the next version; a part added now would be delivered apart from them")
            plane = self.edp
            pending = plane is not None and len(plane.buffer) > 0
            if plane is not None and plane.buffer.spec != spec and pending:
                raise SpecError("batch", f"the columns of the pending batches {plane.buffer.spec}", spec,
                                "deliver the pending versions before changing the batch layout")
            if plane is None or plane.buffer.spec != spec or (not pending and plane.buffer.capacity < 2 * n):
                if plane is not None:
                    plane.close()
                buf = ExperienceBuffer(spec=spec, capacity=max(4 * n, 64), selector=Fifo(), tier=self.tier)
                # a GPU target: the data plane delivers onto it (host tiers through page-locked
                # staging and an asynchronous copy; a device tier without leaving the GPU)
                self.edp = ExperienceDataPlane(buffer=buf, device=None if self.device.type == "cpu" else self.device)
            elif len(plane.buffer) + n > plane.buffer.capacity:
                # pending rows (a version ingested in several parts) that would outgrow the plane: it
                # grows, keeping them. The FIFO would otherwise hold this insert until a delivery
                # that comes only after it (RateLimitTimeout after 60 s; onpolicy/rows_intact found it)
                grown = 2 * (len(plane.buffer) + n)
                plane.migrate(shards=[ShardSpec(Tier.parse(self.tier), grown)], capacity=grown, background=False)
            side = self._side.setdefault(version, {})
            keys = self._keys.setdefault(version, set(batch.non_tensor_batch))
            if keys != set(batch.non_tensor_batch):   # (checked before anything is written)
                raise SpecError(f"batch.non_tensor_batch of version {version}", f"the keys of its earlier parts "
                                f"{sorted(keys)}", sorted(batch.non_tensor_batch), "give every part of one "
                                "version the same non-tensor columns")
            offset = len(next(iter(side.values()))) if side else self._rows.get(version, 0)
            cols = {k: v for k, v in batch.batch.items()}
            cols[ROW_ID] = torch.arange(offset, offset + n, dtype=torch.int64)
            self.edp.ingest(cols, policy_version=version, source=source)
            for k, v in batch.non_tensor_batch.items():
                side[k] = np.concatenate([side[k], v]) if k in side else v
            self._rows[version] = offset + n
            self._meta.setdefault(version, dict(batch.meta_info))

    def _build(self, version: int):
        from verl import DataProto
        from verl.protocol import pad_dataproto_to_divisor
        with self._lock:
            taken = self._taken.pop(version, None)   # rows an earlier build took, then failed on
            if taken is None:
                taken = (self.edp.deliver(None, policy_version=version), self._side.pop(version, {}),
                         self._meta.pop(version, {}))
                self._rows.pop(version, None)
                self._keys.pop(version, None)
        b, side, meta = taken
        if b.size == 0:
            return [], 0  # nothing of this version (already consumed, or never produced)
        try:
            rows = b[ROW_ID].cpu().numpy()
            tensors = {k: v for k, v in b.items() if k != ROW_ID}
            data = DataProto.from_dict(tensors=tensors, non_tensors={k: v[rows] for k, v in side.items()},
                                       meta_info=meta)
            padded, pad = pad_dataproto_to_divisor(data, self.dp_size)
            return padded.chunk(self.dp_size), pad
        except BaseException:
            # The rows left the data plane: kept here, so the version's next delivery builds
            # from them again (the error reaches this caller; nothing is lost)
            with self._lock:
                self._taken[version] = taken
            raise

    def prepare(self, version: int) -> None:
        """Build the version's per-rank batches in the background (overlapping the caller). A
        version already being prepared is left to that build (a second one would find its rows
        taken and hand out an empty batch)."""
        with self._lock:
            if version not in self._pending:
                self._pending[version] = self._pool.submit(self._build, version)

    def deliver(self, version: int, timeout: float = 60.0) -> tuple[list[DataProto], int]:
        """The per-rank update batches and the padding added (verl drops it after the update).
        A prepared build that is not done within ``timeout`` raises ``TimeoutError`` and stays
        pending: the next ``deliver`` of the version gets its batches (its rows are taken)."""
        with self._lock:
            fut = self._pending.get(version)
        if fut is None:
            return self._build(version)
        try:
            result = fut.result(timeout=timeout)
        except FutureTimeout:   # the build goes on, and stays the version's
            raise
        except BaseException:
            with self._lock:
                self._pending.pop(version, None)
            raise
        with self._lock:
            self._pending.pop(version, None)
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self.edp is not None:
            self.edp.close()
