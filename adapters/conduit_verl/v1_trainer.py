"""verl's V1 trainer with Conduit's ingestion schedule, registered as ``trainer.v1.trainer_mode=conduit``.

In V1 the stages pass keys (``KVBatchMeta``) and every stage fetches its columns from
TransferQueue, computes, and writes back. verl's advantage stage does that for the whole
batch in one go: get 7 fields of every row, KL penalty, GRPO advantage, put the results.
Conduit can run the same stage over chunks of whole prompt groups, pipelined: while one
chunk computes, the next is being fetched and the previous one written back. Each chunk
goes through verl's own ``_compute_advantage`` (its ``apply_kl_penalty`` and
``compute_advantage_for_multi_trajectories``), so what lands in TransferQueue is what the
whole-batch call writes, row for row. Token-level rewards are bit-identical; advantages and
returns are bit-identical when every chunk pads to the batch's width (tested), and otherwise
agree to float rounding: GRPO's outcome score is a sum over each row padded to its chunk's
widest response, and a sum at another width may round differently in the last bit, which the
group normalisation amplifies where a group's scores nearly tie (verl's own result for a row
moves the same way whenever the batch's composition changes).

That holds only where the stage is per group: the GRPO estimator (statistics within a
prompt's group) and a KL penalty with a fixed coefficient. An adaptive KL controller (its
update sees the whole batch's KL), other estimators (GAE whitens over the batch) and rollout
correction (batch-level weights) fall back to verl's whole-batch call, and the run says so
once in its log.

Options (Hydra, under ``trainer.v1.conduit``; all optional):

    +trainer.v1.conduit.groups_per_chunk=8     prompt groups per chunk (default: none, the whole
                                               batch in one call, i.e. verl's own stage)
    +trainer.v1.conduit.depth=2                chunks in flight (1 = no overlap)

Chunking is opt-in because it did not pay where it was measured (``python -m
benchmarks.verl.grpo``, docs/benchmarks.md section 7b): on a 2-core machine the TransferQueue
round trips (its controller and storage actors are processes of their own) and the stage's
compute compete for the same cores, and 8 chunks cost 8 round trips' fixed overhead; the
pipelined stage took 1.10x (2 chunks) to 1.39x (8 chunks) of verl's whole-batch time. Overlap
needs cores to spare for TransferQueue's actors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from conduit_core.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class V1Options:
    groups_per_chunk: int | None = None  # None: the whole batch in one call (verl's stage)
    depth: int = 2

    @classmethod
    def from_config(cls, config: DictConfig) -> "V1Options":
        return cls.from_section(config.trainer.v1.get("conduit", None) or {}, "trainer.v1.conduit",
                                "conduit_verl.v1_trainer")

    @classmethod
    def from_section(cls, section: Mapping[str, Any], prefix: str, where: str) -> "V1Options":
        """Options from a Hydra section (``prefix`` names it in errors; ``where`` documents it)."""
        known = {"groups_per_chunk", "depth"}
        for k in section:
            if k not in known:
                raise ConfigError(f"{prefix}.{k}", f"one of {sorted(known)}", repr(k),
                                  f"check the spelling of the Hydra override (see {where})")
        opts = cls(**{k: section[k] for k in section})
        for name in ("groups_per_chunk", "depth"):
            v = getattr(opts, name)
            if name == "groups_per_chunk" and v is None:
                continue
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{prefix}.{name}", "an int >= 1", repr(v), f"set {name} to 1 or more")
        return opts


def prompt_group(key: str) -> str:
    """The prompt a V1 row belongs to: keys are ``{uid}_{session_id}_{index}``."""
    parts = key.rsplit("_", 2)
    if len(parts) != 3:
        raise ConfigError("KVBatchMeta.keys", "'{uid}_{session_id}_{index}' (verl's agent loop format)", repr(key),
                          "use verl's AgentLoopManagerTQ, or trainer.v1.trainer_mode=sync for other key formats")
    return parts[0]


def split_by_groups(batch, groups_per_chunk: int) -> list:
    """Chunks of ``batch`` (a KVBatchMeta) holding whole prompt groups, ``groups_per_chunk``
    each, in order of first appearance; rows keep their relative order within a chunk."""
    from transfer_queue import KVBatchMeta
    order: dict[str, list[int]] = {}
    for i, k in enumerate(batch.keys):
        order.setdefault(prompt_group(k), []).append(i)
    groups = list(order.values())
    chunks = []
    for g in range(0, len(groups), groups_per_chunk):
        rows = sorted(i for grp in groups[g:g + groups_per_chunk] for i in grp)
        chunks.append(KVBatchMeta(keys=[batch.keys[i] for i in rows], tags=[batch.tags[i] for i in rows],
                                  partition_id=batch.partition_id, fields=batch.fields,
                                  extra_info=batch.extra_info))
    return chunks


def chunkable(config, batch=None) -> str | None:
    """None when the advantage stage is per prompt group (chunks give verl's result; see the
    module docstring on rounding); otherwise the reason it is not. ``batch`` (a KVBatchMeta)
    tells whether rollout log-probs are present, which switches verl's rollout correction on."""
    from verl.trainer.ppo import core_algos
    alg = config.algorithm
    if alg.adv_estimator not in (core_algos.AdvantageEstimator.GRPO, "grpo"):
        return f"adv_estimator={alg.adv_estimator} normalises over the whole batch"
    if alg.use_kl_in_reward and alg.kl_ctrl.type != "fixed":
        return f"kl_ctrl.type={alg.kl_ctrl.type}: the controller's update sees the whole batch's KL"
    rc = alg.get("rollout_correction", None)
    if rc is not None and not rc.get("bypass_mode", False):
        if rc.get("rollout_is") or rc.get("rollout_rs"):
            return "rollout_correction computes batch-level weights"
        if batch is not None and (batch.fields is None or "rollout_log_probs" in batch.fields):
            return "rollout log-probs present: rollout_correction reports batch-level metrics"
    return None


def merge_metrics(parts: list[tuple[int, dict]]) -> dict:
    """Row-weighted means of the chunks' metrics (apply_kl_penalty reports the batch mean of
    per-sequence KL, and the coefficient, which is the same in every chunk)."""
    total = sum(n for n, _ in parts)
    out: dict = {}
    for n, m in parts:
        for k, v in m.items():
            out[k] = out.get(k, 0.0) + float(v) * n / total
    return out


def register() -> None:
    """Register the ``conduit`` trainer mode with verl's V1 registry (idempotent)."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    if "conduit" in TRAINER_REGISTRY:
        globals()["ConduitV1Trainer"] = TRAINER_REGISTRY["conduit"]
        return

    @register_trainer("conduit")
    class ConduitV1Trainer(PPOTrainerSync):
        """verl's synchronous V1 trainer; the advantage stage optionally pipelined over
        prompt-group chunks (``+trainer.v1.conduit.groups_per_chunk``)."""

        _conduit_fallback_logged = False
        _conduit_mode_logged = False

        def _compute_advantage(self, batch, metrics):
            opts = V1Options.from_config(self.config)
            if not type(self)._conduit_mode_logged:
                type(self)._conduit_mode_logged = True
                log.info("conduit_verl: verl's V1 trainer in Conduit's mode (trainer.v1.trainer_mode=conduit): the "
                         "advantage stage %s", "whole-batch, verl's own (+trainer.v1.conduit.groups_per_chunk=N "
                         "pipelines it)" if opts.groups_per_chunk is None else
                         f"over chunks of {opts.groups_per_chunk} prompt groups, {opts.depth} in flight")
            if opts.groups_per_chunk is None:
                return super()._compute_advantage(batch, metrics)
            reason = chunkable(self.config, batch)
            if reason is not None:
                if not type(self)._conduit_fallback_logged:
                    log.warning("conduit: advantage stage runs whole-batch (verl's path): %s", reason)
                    type(self)._conduit_fallback_logged = True
                return super()._compute_advantage(batch, metrics)
            return pipelined_advantage(lambda chunk, m: PPOTrainerSync._compute_advantage(self, chunk, m),
                                       batch, metrics, opts)

        def _compute_metrics(self, batch, metrics, *args, **kwargs):
            # verl's step metrics, then what Conduit's storage units hold at the step's end (before verl
            # clears the step's rows), into the same dict verl's tracker logs: conduit/storage/*
            super()._compute_metrics(batch, metrics, *args, **kwargs)
            from .tq_backend import storage_metrics
            metrics.update(storage_metrics())

    ConduitV1Trainer.__module__, ConduitV1Trainer.__qualname__ = __name__, "ConduitV1Trainer"
    globals()["ConduitV1Trainer"] = ConduitV1Trainer


def __getattr__(name: str):
    # the class subclasses verl's, so it exists once registered (pickle finds it here too)
    if name == "ConduitV1Trainer":
        register()
        return globals()["ConduitV1Trainer"]
    raise AttributeError(name)


def run_in_flight(calls: list, depth: int, name: str) -> list:
    """Results of the zero-argument ``calls``, in order, ``depth`` running at a time (one after
    another for 1). A failing call's exception is raised here, after the others finished:
    nothing is left running."""
    if depth == 1 or len(calls) <= 1:
        return [c() for c in calls]
    with ThreadPoolExecutor(max_workers=depth, thread_name_prefix=name) as pool:
        futures = [pool.submit(c) for c in calls]
        return [f.result() for f in futures]


def pipelined_advantage(stage, batch, metrics: dict, opts: V1Options):
    """Run ``stage(chunk, metrics) -> KVBatchMeta`` over group chunks, ``opts.depth`` in flight,
    and return one KVBatchMeta in the input's row order. A failing chunk's exception is
    raised here (after the others finished: nothing is left running)."""
    from transfer_queue import KVBatchMeta
    chunks = split_by_groups(batch, opts.groups_per_chunk)
    parts: list[tuple[int, dict]] = [(len(c), {}) for c in chunks]
    results = run_in_flight([lambda c=c, m=m: stage(c, m) for c, (_, m) in zip(chunks, parts)], opts.depth,
                            "conduit-v1-adv")
    metrics.update(merge_metrics(parts))
    row = {k: (r, j) for r in results for j, k in enumerate(r.keys)}
    keys = list(batch.keys)
    fields = None
    for r in results:
        if r.fields is not None:
            fields = list(dict.fromkeys((fields or []) + list(r.fields)))
    return KVBatchMeta(keys=keys, tags=[row[k][0].tags[row[k][1]] for k in keys], partition_id=batch.partition_id,
                       fields=fields, extra_info=results[0].extra_info if results else {})


def advantage_stage_trainer(config):
    """A ``trainer_mode=conduit`` trainer holding only what the advantage stage reads (the
    config and verl's KL controller), for tests and benchmarks on CPU: V1's ``__init__``
    also builds the replay buffer and, in ``init()``, the GPU worker groups."""
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1 import get_trainer_cls
    trainer = object.__new__(get_trainer_cls("conduit"))
    trainer.config = config
    if config.algorithm.use_kl_in_reward:
        trainer.kl_ctrl_in_reward = core_algos.get_kl_controller(config.algorithm.kl_ctrl)
    return trainer


def verl_config(overrides: list[str]):
    """verl's own ``ppo_trainer`` Hydra config with ``overrides`` (as on verl's command line)."""
    import os

    import verl
    from hydra import compose, initialize_config_dir
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def grpo_rows(prompts: int, n: int, max_len: int, seed: int = 0, *,
              widest_in_every_group: bool = False) -> tuple[list[str], list[dict]]:
    """A V1-shaped GRPO batch as verl's agent loop puts it: keys ``{uid}_{session}_0``, ragged
    responses, an outcome score on each response's last token, old and reference log-probs.
    ``widest_in_every_group``: each group's first response has the longest length, so every
    chunk pads to the batch's width and sums round exactly as in the whole batch."""
    import torch
    g = torch.Generator().manual_seed(seed)
    keys, rows = [], []
    for p in range(prompts):
        for s in range(n):
            length = int(torch.randint(max(1, max_len // 2), max_len + 1, (1,), generator=g))
            if widest_in_every_group and s == 0:
                length = max_len
            score = torch.zeros(length)
            score[-1] = float(torch.randint(0, 2, (1,), generator=g))
            keys.append(f"p{seed}x{p}_{s}_0")
            rows.append({"uid": f"p{seed}x{p}", "response_mask": torch.ones(length, dtype=torch.int64),
                         "rm_scores": score, "old_log_probs": -torch.rand(length, generator=g),
                         "ref_log_prob": -torch.rand(length, generator=g)})
    return keys, rows
