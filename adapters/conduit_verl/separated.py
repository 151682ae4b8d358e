"""verl's separated (legacy-structured) trainer with Conduit's ingestion schedule.

verl 0.9.1's non-V1 trainer (``trainer.use_v1=False``) runs ``RayPPOTrainer.fit``, one
monolithic (and deprecated) loop with no per-stage hook. Its template-method form is
``SeparateRayPPOTrainer.fit_step`` (``verl/experimental/separation/ray_trainer.py``): one
``_fit_*`` method per stage, the base of verl's one-step-off-policy and fully-async trainers.
That is the extension point this module uses, without changing verl:

    AdvantageStageMixin     put it before any SeparateRayPPOTrainer subclass in the bases
                            (``class T(AdvantageStageMixin, OneStepOffRayTrainer)``)
    ConduitSeparateTrainer  AdvantageStageMixin + SeparateRayPPOTrainer, ready to build

The mixin runs ``_fit_compute_advantage`` (token-level scores, KL penalty, GRPO advantage:
the last ingestion stages, on the driver) over chunks of whole prompt groups, ``depth`` at a
time. Each chunk goes through verl's own ``SeparateRayPPOTrainer._fit_compute_advantage``
(its ``apply_kl_penalty`` and ``compute_advantage``), seeing the chunk's rows of the reward
tensor and extra infos, so the batch that reaches ``_fit_update_actor`` is the one verl's
whole-batch call builds, bit for bit (tested): in this trainer every row is padded to the
batch's response length, so a chunk sums over the same width as the whole batch. Metrics of
the chunks are merged row-weighted.

As in the V1 mode (``conduit_verl.v1_trainer``) chunking is only taken where the stage is
per group (GRPO; a fixed KL coefficient; no rollout correction) and falls back to verl's
call otherwise, saying why once in the log. Delivery stays verl's: ``_update_actor`` hands
the batch to the worker group, whose dispatch splits it per data-parallel rank.

Options (Hydra, under ``trainer.conduit``; all optional):

    +trainer.conduit.groups_per_chunk=8    prompt groups per chunk (default: none, i.e. verl's
                                           whole-batch stage)
    +trainer.conduit.depth=2               chunks in flight (1 = one after another)
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from .pipeline import group_chunks
from .v1_trainer import V1Options, chunkable, merge_metrics, run_in_flight

log = logging.getLogger(__name__)

OPTIONS_PATH = "trainer.conduit"


def options(config) -> V1Options:
    return V1Options.from_section(config.trainer.get("conduit", None) or {}, OPTIONS_PATH, __name__)


def legacy_chunkable(config, batch) -> str | None:
    """None when this batch's advantage stage is per prompt group, else the reason it is not
    (``v1_trainer.chunkable``, plus rollout correction switched on by rollout log-probs)."""
    reason = chunkable(config)
    if reason is not None:
        return reason
    rc = config.algorithm.get("rollout_correction", None)
    if rc is not None and not rc.get("bypass_mode", False) and "rollout_log_probs" in batch.batch.keys():
        return "rollout log-probs present: rollout_correction computes batch-level weights"
    return None


class _ChunkView:
    """What verl's ``_fit_compute_advantage`` reads and writes on ``self``, for one chunk: the
    chunk's rows of the reward tensor and extra infos, metrics and timings of its own; every
    other attribute (config, KL controller) is the trainer's."""

    def __init__(self, trainer, rows: np.ndarray):
        self._trainer = trainer
        self.reward_tensor = trainer.reward_tensor[torch.from_numpy(rows)]
        self.reward_extra_infos_dict = {k: [v[i] for i in rows] for k, v in
                                        (trainer.reward_extra_infos_dict or {}).items()}
        self.metrics: dict = {}
        self.timing_raw: dict = {}

    def __getattr__(self, name):
        return getattr(self._trainer, name)


# What verl's GRPO advantage stage reads of the batch (apply_kl_penalty, compute_advantage):
# a chunk carries only these columns, and only the stage's outputs are scattered back.
STAGE_INPUTS = ("response_mask", "old_log_probs", "ref_log_prob")


def chunked_advantage(trainer, batch, stage, opts: V1Options):
    """Run ``stage(view, chunk) -> chunk`` (verl's advantage stage bound to a ``_ChunkView``)
    over chunks of whole groups, ``opts.depth`` at a time, each chunk holding the stage's
    input columns of its rows; scatter the columns the stage adds back into ``batch`` (in
    place, as verl's stage does) and merge the chunks' metrics into ``trainer.metrics``. A
    failing chunk's exception is raised here, after the others finished."""
    from verl import DataProto
    idx = group_chunks(batch.non_tensor_batch["uid"], opts.groups_per_chunk)
    views = [_ChunkView(trainer, rows) for rows in idx]
    inputs = [k for k in STAGE_INPUTS if k in batch.batch.keys()]
    uid = batch.non_tensor_batch["uid"]

    def chunk_of(rows: np.ndarray):
        t = torch.from_numpy(rows)
        return DataProto.from_dict(tensors={k: batch.batch[k][t] for k in inputs}, non_tensors={"uid": uid[rows]},
                                   meta_info=dict(batch.meta_info))

    done = run_in_flight([lambda v=v, rows=rows: stage(v, chunk_of(rows)) for v, rows in zip(views, idx)],
                         opts.depth, "conduit-adv")
    n = len(batch)
    for key in done[0].batch.keys():
        if key in inputs:
            continue
        first = done[0].batch[key]
        col = torch.empty((n, *first.shape[1:]), dtype=first.dtype)
        for rows, c in zip(idx, done):
            col[torch.from_numpy(rows)] = c.batch[key]
        batch.batch[key] = col
    extra = trainer.reward_extra_infos_dict or {}
    order = np.concatenate(idx)
    for key in done[0].non_tensor_batch:
        if key == "uid":
            continue
        if key in extra:   # verl's own np.array(v) over the whole batch: a chunk's dtype (<U1, int64) is its rows'
            batch.non_tensor_batch[key] = np.array(extra[key])
            continue
        cat = np.concatenate([c.non_tensor_batch[key] for c in done])   # (numpy's promotion over every chunk)
        col = np.empty_like(cat)
        col[order] = cat
        batch.non_tensor_batch[key] = col
    trainer.metrics.update(merge_metrics([(len(rows), v.metrics) for rows, v in zip(idx, views)]))
    return batch


class AdvantageStageMixin:
    """``_fit_compute_advantage`` over chunks of whole prompt groups (see the module docstring)."""

    _conduit_fallback_logged = False
    _conduit_mode_logged = False

    def _fit_compute_advantage(self, batch):
        from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
        from verl.utils.debug import marked_timer
        verl_stage = SeparateRayPPOTrainer._fit_compute_advantage
        opts = options(self.config)
        if opts.groups_per_chunk is None:
            return super()._fit_compute_advantage(batch)
        reason = legacy_chunkable(self.config, batch)
        if reason is not None:
            if not type(self)._conduit_fallback_logged:
                log.warning("conduit: advantage stage runs whole-batch (verl's path): %s", reason)
                type(self)._conduit_fallback_logged = True
            return super()._fit_compute_advantage(batch)
        if not type(self)._conduit_mode_logged:
            type(self)._conduit_mode_logged = True
            log.info("conduit_verl: %s's advantage stage over chunks of %d prompt groups, %d in flight",
                     type(self).__name__, opts.groups_per_chunk, opts.depth)
        with marked_timer("adv", self.timing_raw, color="brown"):
            return chunked_advantage(self, batch, verl_stage, opts)


def _make_trainer_class():
    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer

    class ConduitSeparateTrainer(AdvantageStageMixin, SeparateRayPPOTrainer):
        """verl's SeparateRayPPOTrainer with the advantage stage over prompt-group chunks."""

    ConduitSeparateTrainer.__module__, ConduitSeparateTrainer.__qualname__ = __name__, "ConduitSeparateTrainer"
    return ConduitSeparateTrainer


def _make_one_step_off_class():
    from verl.experimental.one_step_off_policy import ray_trainer

    base = ray_trainer.OneStepOffRayTrainer
    if getattr(base, "_conduit_made", False):   # the plugin has put this very class there already
        return base

    class ConduitOneStepOffTrainer(AdvantageStageMixin, base):
        """verl's one-step-off-policy trainer with the advantage stage over prompt-group chunks: what the
        plugin puts in its ``ray_trainer`` with ``CONDUIT_VERL_ONE_STEP_OFF=conduit``."""
        _conduit_made = True

    ConduitOneStepOffTrainer.__module__, ConduitOneStepOffTrainer.__qualname__ = __name__, "ConduitOneStepOffTrainer"
    return ConduitOneStepOffTrainer


_MADE = {"ConduitSeparateTrainer": _make_trainer_class, "ConduitOneStepOffTrainer": _make_one_step_off_class}


def __getattr__(name: str):
    # the classes subclass verl's, so each is made on first use (pickle finds them here too)
    if name in _MADE:
        cls = globals()[name] = _MADE[name]()
        return cls
    raise AttributeError(name)


def advantage_stage_trainer(config, cls=None, *, reward_tensor=None, reward_extra_infos=None):
    """A trainer (``ConduitSeparateTrainer`` by default, or ``cls``) holding only what the
    advantage stage reads, as ``SeparateRayPPOTrainer.__init__`` sets it (config, KL
    controller, per-step metrics, timings, the step's reward): for tests and benchmarks on
    CPU, where the GPU worker groups of ``init_workers`` cannot be built."""
    from verl.trainer.ppo import core_algos
    trainer = object.__new__(cls or __getattr__("ConduitSeparateTrainer"))
    trainer.config = config
    if config.algorithm.use_kl_in_reward:
        trainer.kl_ctrl_in_reward = core_algos.get_kl_controller(config.algorithm.kl_ctrl)
    trainer.metrics, trainer.timing_raw = {}, {}
    trainer.reward_tensor, trainer.reward_extra_infos_dict = reward_tensor, dict(reward_extra_infos or {})
    return trainer


def grpo_batch(prompts: int, n: int, response_len: int, seed: int = 0, *, shuffle: bool = True):
    """A GRPO batch as it reaches verl's advantage stage: ``n`` responses per prompt padded to
    ``response_len`` (verl's DataProto layout), old and reference log-probs, a uid per prompt,
    rows in a balanced (shuffled) order; and the step's reward tensor (outcome score on each
    response's last token)."""
    from verl import DataProto
    g = torch.Generator().manual_seed(seed)
    rows = prompts * n
    lengths = torch.randint(max(1, response_len // 4), response_len + 1, (rows,), generator=g)
    mask = (torch.arange(response_len)[None, :] < lengths[:, None]).long()
    prompt_len = 8
    reward = torch.zeros(rows, response_len)
    reward[torch.arange(rows), lengths - 1] = torch.randint(0, 2, (rows,), generator=g).float()
    data = DataProto.from_dict(
        tensors={"responses": torch.randint(0, 1000, (rows, response_len), generator=g),
                 "attention_mask": torch.cat([torch.ones(rows, prompt_len, dtype=torch.long), mask], 1),
                 "response_mask": mask,
                 "old_log_probs": -torch.rand(rows, response_len, generator=g),
                 "ref_log_prob": -torch.rand(rows, response_len, generator=g)},
        non_tensors={"uid": np.array([f"p{seed}-{i // n}" for i in range(rows)], dtype=object)})
    if shuffle:
        order = torch.randperm(rows, generator=g)
        data.reorder(order)
        reward = reward[order]
    return data, reward
