"""The GRPO ingestion pipeline and its sequential reference (verl's own order, whole batch).

Chunking never splits a prompt's group: a chunk is a set of uids, with their rows taken in
the order they have in the (balanced) batch, so every per-group computation sees its
members in the same order as verl's sequential path. Per-row stages (reward, log-probs,
KL) do not depend on which rows share a chunk; the adaptive KL controller is updated once
per iteration from the whole batch's per-row KL, exactly as ``apply_kl_penalty`` does.

    balance (whole batch, needs only attention masks)
      -> chunk by groups -> [reward -> old log-prob -> ref log-prob -> KL -> advantage] per chunk
      -> reassemble in balanced order -> delivery: pad to the DP size, split per rank

With ``overlap=True`` the chunks' stages run as a pipeline on a small thread pool (model
forward passes release the GIL), so chunk k's reference log-prob runs while chunk k+1's
old log-prob does.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch


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


class _FrozenKL:
    """Hands apply_kl_penalty the iteration's beta and records instead of updating: the real
    controller is updated once per iteration, from the whole batch."""

    def __init__(self, value: float):
        self.value = value

    def update(self, current_kl, n_steps):
        pass


def _balance(data, dp_size: int):
    """verl's balancing (RayPPOTrainer._balance_batch, default branch): equal-size partitions by
    workload, each ordered small/large alternating, then the batch reordered."""
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions
    bsz = data.batch["attention_mask"].shape[0]
    seqlen = data.batch["attention_mask"].view(bsz, -1).sum(-1)
    workload = calculate_workload(seqlen)
    parts = get_seqlen_balanced_partitions(workload, k_partitions=dp_size, equal_size=True)
    for i, part in enumerate(parts):
        part.sort(key=lambda x: (workload[x], x))
        parts[i] = part[::2] + part[1::2][::-1]
    data.reorder(torch.tensor([j for part in parts for j in part]))
    return data


def _stages_on(chunk, st: GRPOStages, beta: float):
    """reward -> old log-prob -> ref log-prob -> KL penalty -> advantage, with verl's functions."""
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage
    from verl.utils.torch_functional import masked_mean
    chunk.batch["token_level_scores"] = st.reward_fn(chunk)
    chunk.batch["old_log_probs"] = st.old_log_prob_fn(chunk)
    if st.ref_log_prob_fn is not None:
        chunk.batch["ref_log_prob"] = st.ref_log_prob_fn(chunk)
    row_kl = None
    if st.use_kl_in_reward:
        chunk, _ = apply_kl_penalty(chunk, kl_ctrl=_FrozenKL(beta), kl_penalty=st.kl_penalty)
        kld = core_algos.kl_penalty(chunk.batch["old_log_probs"], chunk.batch["ref_log_prob"],
                                    kl_penalty=st.kl_penalty) * chunk.batch["response_mask"]
        row_kl = masked_mean(kld, mask=chunk.batch["response_mask"], axis=-1)
    else:
        chunk.batch["token_level_rewards"] = chunk.batch["token_level_scores"]
    chunk = compute_advantage(chunk, adv_estimator=AdvantageEstimator.GRPO,
                              norm_adv_by_std_in_grpo=st.norm_adv_by_std_in_grpo)
    return chunk, row_kl


def _update_kl(st: GRPOStages, row_kl: torch.Tensor | None, bsz: int) -> None:
    if st.use_kl_in_reward and st.kl_ctrl is not None and row_kl is not None:
        st.kl_ctrl.update(current_kl=torch.mean(row_kl, dim=0).item(), n_steps=bsz)


def sequential_grpo_path(batch, st: GRPOStages):
    """verl's order on the whole batch (the reference the adapter must equal):
    response mask -> balance -> reward -> old/ref log-prob -> apply_kl_penalty -> compute_advantage."""
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage, compute_response_mask
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    if "response_mask" not in batch.batch.keys():
        batch.batch["response_mask"] = compute_response_mask(batch)
    batch = _balance(batch, st.dp_size)
    batch.batch["token_level_scores"] = st.reward_fn(batch)
    batch.batch["old_log_probs"] = st.old_log_prob_fn(batch)
    if st.ref_log_prob_fn is not None:
        batch.batch["ref_log_prob"] = st.ref_log_prob_fn(batch)
    if st.use_kl_in_reward:
        batch, _ = apply_kl_penalty(batch, kl_ctrl=st.kl_ctrl, kl_penalty=st.kl_penalty)
    else:
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    return compute_advantage(batch, adv_estimator=AdvantageEstimator.GRPO,
                             norm_adv_by_std_in_grpo=st.norm_adv_by_std_in_grpo)


def group_chunks(uids: np.ndarray, groups_per_chunk: int) -> list[np.ndarray]:
    """Row indices of each chunk: whole groups, rows in batch order within a chunk."""
    order: dict[Any, list[int]] = {}
    for i, u in enumerate(uids):
        order.setdefault(u, []).append(i)
    groups = list(order.values())
    out = []
    for s in range(0, len(groups), groups_per_chunk):
        rows = sorted(i for g in groups[s:s + groups_per_chunk] for i in g)
        out.append(np.asarray(rows, dtype=np.int64))
    return out


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
        batch = _balance(batch, self.stages.dp_size)
        beta = float(self.stages.kl_ctrl.value) if self.stages.kl_ctrl is not None else 0.0
        chunks_idx = group_chunks(batch.non_tensor_batch["uid"], self.groups_per_chunk)
        chunks = [batch.select_idxs(idx) for idx in chunks_idx]
        if self._pool is None:
            results = [_stages_on(c, self.stages, beta) for c in chunks]
        else:
            futures = [self._pool.submit(_stages_on, c, self.stages, beta) for c in chunks]
            results = [f.result() for f in futures]
        merged = DataProto.concat([r[0] for r in results])
        # back to the balanced order: position p of the concat holds row concat_rows[p]
        concat_rows = np.concatenate(chunks_idx)
        inverse = np.empty_like(concat_rows)
        inverse[concat_rows] = np.arange(concat_rows.shape[0])
        merged.reorder(torch.from_numpy(inverse))
        row_kl = None
        if results and results[0][1] is not None:
            row_kl = torch.cat([r[1] for r in results])[torch.from_numpy(inverse)]
        _update_kl(self.stages, row_kl, len(merged))
        self.timings["ingest_s"] = time.perf_counter() - t0
        return merged

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
