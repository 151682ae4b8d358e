"""Conduit for verl 0.9.1: GRPO's post-generation path as ingestion, the update hand-off as delivery.

Stage map (per GRPO iteration):

    rollout (generate_sequences)                  -> upstream actor
    balance, reward, old log-prob, ref log-prob,
    KL penalty (apply_kl_penalty), compute_advantage -> ingestion (chunks of whole prompt groups)
    dispatching the update batch to the workers   -> delivery (padded, split per data-parallel rank)
    update_actor                                  -> learner

Every stage calls verl's own functions (``DataProto``, ``compute_response_mask``,
``apply_kl_penalty``, ``core_algos.kl_penalty``, ``compute_advantage``, the seqlen balancing
helpers, ``pad_dataproto_to_divisor``); the adapter only decides chunking, overlap and
placement. verl is imported lazily.
"""

from .pipeline import GRPOIngestion, GRPOStages, sequential_grpo_path

__all__ = ["GRPOIngestion", "GRPOStages", "sequential_grpo_path"]
