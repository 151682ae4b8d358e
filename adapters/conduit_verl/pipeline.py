"""The GRPO ingestion pipeline and its sequential reference (verl's own order, whole batch).

Chunking never splits a prompt's group. The per-row stages (reward, old and reference
log-probs: the expensive ones) run per chunk; their results do not depend on which rows share
a chunk. The batch-level stages run once on the whole batch in verl's balanced order, with
verl's own functions: apply_kl_penalty (its adaptive controller sees the whole batch's KL)
and compute_advantage (group statistics over the members in batch order). So the result is
identical to verl's sequential path, bit for bit.

    chunks of whole groups --> [reward -> old log-prob -> ref log-prob]   (thread pool, overlapped)
    balance permutation    --> computed on the caller's thread meanwhile (attention masks only)
    reassemble in balanced order -> apply_kl_penalty -> compute_advantage -> delivery

Model forward passes release the GIL, so with ``overlap=True`` chunks' log-prob passes run
concurrently with each other and with the (Python) reward manager and balancing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import torch

if TYPE_CHECKING:
    from verl import DataProto


@dataclass
class GRPOStages:
    """The framework-side work of one GRPO iteration, as callables on ``DataProto`` chunks.

    ``reward_fn(data) -> token_level_scores [B, R]``; ``old_log_prob_fn(data) -> [B, R]``;
    ``ref_log_prob_fn(data) -> [B, R]`` (None without a reference policy). KL in reward uses
    verl's controller ``kl_ctrl`` (Fixed/AdaptiveKLController) and ``kl_penalty`` type."""

    reward_fn: Callable
    old_log_prob_fn: Callable
    ref_log_prob_fn: Callable | None = None
    use_kl_in_reward: bool = True
    kl_ctrl: Any = None
    kl_penalty: str = "kl"
    norm_adv_by_std_in_grpo: bool = True
    dp_size: int = 1


def _balance(data, dp_size: int):
    """verl's balancing (RayPPOTrainer._balance_batch, default branch): equal-size partitions by
    workload, each ordered small/large alternating, then the batch reordered."""
    data.reorder(_balance_order(data, dp_size))
    return data


def _row_stages(chunk, st: GRPOStages):
    """The per-row stages (reward, old and reference log-probs): their results do not depend on
    which rows share a chunk, so chunks can run in any order and concurrently."""
    chunk.batch["token_level_scores"] = st.reward_fn(chunk)
    chunk.batch["old_log_probs"] = st.old_log_prob_fn(chunk)
    if st.ref_log_prob_fn is not None:
        chunk.batch["ref_log_prob"] = st.ref_log_prob_fn(chunk)
    return chunk


def _batch_stages(batch, st: GRPOStages):
    """The batch-level stages, with verl's own functions on the whole (balanced) batch:
    apply_kl_penalty (whose controller update uses the whole batch's KL) and
    compute_advantage (group statistics over the members in batch order)."""
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage
    if st.use_kl_in_reward:
        batch, _ = apply_kl_penalty(batch, kl_ctrl=st.kl_ctrl, kl_penalty=st.kl_penalty)
    else:
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    return compute_advantage(batch, adv_estimator=AdvantageEstimator.GRPO,
                             norm_adv_by_std_in_grpo=st.norm_adv_by_std_in_grpo)


def _balance_order(data, dp_size: int) -> torch.Tensor:
    """verl's balancing permutation (computed from attention masks only)."""
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions
    bsz = data.batch["attention_mask"].shape[0]
    seqlen = data.batch["attention_mask"].view(bsz, -1).sum(-1)
    workload = calculate_workload(seqlen)
    parts = get_seqlen_balanced_partitions(workload, k_partitions=dp_size, equal_size=True)
    for i, part in enumerate(parts):
        part.sort(key=lambda x: (workload[x], x))
        parts[i] = part[::2] + part[1::2][::-1]
    return torch.tensor([j for part in parts for j in part])


def sequential_grpo_path(batch: DataProto, st: GRPOStages) -> DataProto:
    """verl's order on the whole batch (the reference the adapter must equal):
    response mask -> balance -> reward -> old/ref log-prob -> apply_kl_penalty -> compute_advantage."""
    from verl.trainer.ppo.ray_trainer import compute_response_mask
    if "response_mask" not in batch.batch.keys():
        batch.batch["response_mask"] = compute_response_mask(batch)
    batch = _balance(batch, st.dp_size)
    batch = _row_stages(batch, st)
    return _batch_stages(batch, st)


def group_chunks(uids: np.ndarray, groups_per_chunk: int) -> list[np.ndarray]:
    """Row indices of each chunk: whole groups (in order of first appearance), rows in batch
    order within a chunk. Vectorized: no Python loop over rows."""
    _, first, inverse = np.unique(np.asarray(uids), return_index=True, return_inverse=True)
    rank = np.empty_like(first)
    rank[np.argsort(first, kind="stable")] = np.arange(first.shape[0])  # group order of appearance
    chunk_of_row = rank[inverse.reshape(-1)] // groups_per_chunk
    return [np.flatnonzero(chunk_of_row == c).astype(np.int64) for c in range(int(chunk_of_row.max(initial=-1)) + 1)]


class GRPOIngestion:
    """Runs the post-generation stages in chunks of whole groups, sequentially or overlapped,
    and hands back the batch in verl's balanced order (identical to ``sequential_grpo_path``)."""

    def __init__(self, stages: GRPOStages, *, groups_per_chunk: int = 2, overlap: bool = False, workers: int = 2):
        if groups_per_chunk < 1:
            from conduit_core import ConfigError
            raise ConfigError("groups_per_chunk", ">= 1", groups_per_chunk, "use e.g. 2 prompt groups per chunk")
        self.stages, self.groups_per_chunk, self.overlap = stages, groups_per_chunk, overlap
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="conduit-verl") if overlap else None
        self.timings: dict[str, float] = {}

    def __call__(self, batch):
        from verl import DataProto
        from verl.trainer.ppo.ray_trainer import compute_response_mask
        import time
        t0 = time.perf_counter()
        if "response_mask" not in batch.batch.keys():
            batch.batch["response_mask"] = compute_response_mask(batch)
        chunks_idx = group_chunks(batch.non_tensor_batch["uid"], self.groups_per_chunk)
        chunks = [batch.select_idxs(idx) for idx in chunks_idx]
        if self._pool is None:
            order = _balance_order(batch, self.stages.dp_size)
            done = [_row_stages(c, self.stages) for c in chunks]
        else:
            futures = [self._pool.submit(_row_stages, c, self.stages) for c in chunks]
            try:
                order = _balance_order(batch, self.stages.dp_size)  # meanwhile, on the caller's thread
                done = [f.result() for f in futures]
            except BaseException:   # no chunk is still running when the failure reaches the caller
                for f in futures:
                    f.cancel()
                wait(futures)
                raise
        merged = DataProto.concat(done)
        # position p of the concat holds rollout row concat_rows[p]; verl's balanced order wants
        # rollout row order[q] at position q
        concat_rows = np.concatenate(chunks_idx)
        where = np.empty_like(concat_rows)
        where[concat_rows] = np.arange(concat_rows.shape[0])
        merged.reorder(torch.from_numpy(where[order.numpy()]))
        merged = _batch_stages(merged, self.stages)
        self.timings["ingest_s"] = time.perf_counter() - t0
        return merged

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "GRPOIngestion":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
