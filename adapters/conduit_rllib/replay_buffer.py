"""The replay buffer RLlib builds from ``replay_buffer_config={"type": "conduit_rllib...."}``.

It subclasses RLlib's ``PrioritizedEpisodeReplayBuffer`` only so that DQN's
``update_priorities_in_episode_replay_buffer`` (an ``isinstance`` check) hands it the
TD errors; none of the parent's storage is built or used. ``sample()`` returns one
``DeliveredBatch`` (a columnar batch, already selected and gathered) instead of B
one-step episodes; ``ConduitDQNTorchLearner``'s connector turns it into the learner's
tensors directly, skipping the episode re-batching.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer

from conduit_core import Batch, ConfigError, ExperienceBuffer, ExperienceDataPlane, Prioritized, Rollout, Uniform

from .columns import episode_columns, spec_for
from .episode_ledger import EpisodeLedger
from .options import ConduitOptions


RLLIB_MIN_PRIORITY = 1e-12  # PrioritizedEpisodeReplayBuffer.update_priorities: max(priority, 1e-12)


class DeliveredBatch:
    """What ``sample()`` returns in place of episodes: a columnar batch and its size.

    ``len()`` is the number of transitions, so RLlib's step accounting
    (``sum(len(e) for e in episodes)``) counts the same as with B one-step episodes."""

    __slots__ = ("batch",)

    def __init__(self, batch: Batch):
        self.batch = batch

    def __len__(self) -> int:
        return self.batch.size


class ConduitEpisodeReplayBuffer(PrioritizedEpisodeReplayBuffer):
    """Uniform or prioritized replay on the Conduit data plane (RLlib's semantics)."""

    columns_of = staticmethod(episode_columns)  # the ingestion transform: an episode chunk -> columns

    def __init__(self, capacity: int = 10000, *, prioritized: bool = False, alpha: float = 0.6,
                 beta: float = 0.4, conduit: dict | None = None, batch_size_B: int = 16,
                 batch_length_T: int = 1, metrics_num_episodes_for_smoothing: int = 100, seed: int | None = None,
                 learner_shards: int = 1, **unused):
        # RLlib passes its own buffer kwargs; those that would change semantics are refused.
        for key in unused:
            if key not in ("type", "storage_unit", "replay_sequence_length", "replay_mode", "worker_side_prioritization"):
                raise ConfigError(f"replay_buffer_config[{key!r}]", "a key Conduit's buffer understands",
                                  repr(key), "remove it or add support in conduit_rllib.replay_buffer")
        self.capacity = int(capacity)
        self.prioritized = bool(prioritized)
        self.alpha, self.beta = float(alpha), float(beta)
        self.options = ConduitOptions.from_kwargs(dict(conduit or {}))
        self._seed = self.options.seed if self.options.seed is not None else (seed or 0)
        self.batch_size_B = batch_size_B
        # one delivered part per learner (num_learners >= 1): RLlib's LearnerGroup hands part i to
        # learner i and concatenates their TD errors in that order (see sample())
        if isinstance(learner_shards, bool) or not isinstance(learner_shards, int) or learner_shards < 1:
            raise ConfigError("replay_buffer_config['learner_shards']", "an int >= 1 (max(1, num_learners))",
                              repr(learner_shards), "let conduit_rllib.enable() set it from config.num_learners")
        self.learner_shards = learner_shards
        self.edp: ExperienceDataPlane | None = None  # built on the first add (the spec comes from the data)
        self.tuner = None
        self._sources: dict[str, int] = {}       # RLlib episode id -> source, while the episode runs
        self._source_ids: dict[int, str] = {}    # and back
        self._next_source = 0
        self.ledger = EpisodeLedger()            # stored episodes and RLlib's eviction rule
        self._ring = self.capacity + int(np.ceil(self.capacity * self.options.ring_slack))
        self._last: Batch | None = None
        self._added = 0
        self._sampled = 0
        self._pending_state: dict | None = None

    # ------------------------------------------------------------------ build
    def _selector(self):
        return Prioritized(alpha=self.alpha, beta=self.beta, eps=0.0) if self.prioritized else Uniform()

    def _build(self, first_cols: dict[str, np.ndarray]) -> None:
        self._build_for(spec_for(first_cols, obs_codec=self.options.obs_codec))

    def _build_for(self, spec) -> None:
        """The data plane (and, for schedule='auto', its tuner) for ``spec``: the one place
        both a first add() and a restore build it, so a restored run is the run it saved."""
        buf = ExperienceBuffer(spec=spec, capacity=self._ring, selector=self._selector(), tier=self.options.tier,
                               seed=self._seed, reuse_outputs=self.options.reuse_outputs)
        self.edp = ExperienceDataPlane(buffer=buf, schedule=self.options.to_schedule())
        if self.options.schedule == "auto":
            from conduit_core.tuner import AutoTuner
            self.tuner = AutoTuner(self.edp, steps_per_phase=self.options.autotune_steps_per_phase,
                                   settle=self.options.autotune_settle)

    # -------------------------------------------------------------- ingestion
    def add(self, episodes, weight=None) -> None:
        """Ingest RLlib episodes (chunks of them: RLlib hands over each episode's new steps),
        ``ingest_granularity`` episodes per ingestion operator call, in the order given.
        First, RLlib's eviction rule: whole oldest episodes leave while the steps would exceed
        ``capacity`` (a new chunk of an episode evicted here is dropped, as RLlib drops it)."""
        if not isinstance(episodes, (list, tuple)):
            episodes = [episodes]
        chunks = []
        for ep in episodes:
            n = len(ep)
            if n == 0:
                continue
            cols = self.columns_of(ep)
            if self.edp is None:
                self._build(cols)
            src = self._sources.get(ep.id_)
            if src is None:
                src = self._sources[ep.id_] = self._next_source
                self._source_ids[src] = ep.id_
                self._next_source += 1
            chunks.append((ep, cols, src, n))
        if not chunks:
            return
        evict, drop = self.ledger.plan([(src, n) for _, _, src, n in chunks], self.capacity)
        for src in evict:
            self._evict_episode(src)
        keep = [c for c in chunks if c[2] not in drop]
        for ep, _, src, _ in chunks:
            if ep.is_done or src in drop:  # over, or evicted: its id starts a new episode if it comes back
                self._forget_source(src)
        cutoff = self._added + sum(n for *_, n in keep) - self._ring  # seqs below it: overwritten by the ring
        if cutoff > 0:
            for src in self.ledger.ring_conflicts(cutoff):
                self._evict_episode(src, early=True)
            self.ledger.forget_below(cutoff)
        group: list[Rollout] = []
        for _, cols, src, n in keep:
            group.append(Rollout(cols, source=src, rows=n))
            if len(group) >= self.edp.schedule.ingest_granularity:
                self._ingest(group)
                group = []
        if group:
            self._ingest(group)

    def _forget_source(self, src: int) -> None:
        ep_id = self._source_ids.pop(src, None)
        if ep_id is not None and self._sources.get(ep_id) == src:
            del self._sources[ep_id]

    def _evict_episode(self, src: int, *, early: bool = False) -> None:
        ranges = self.ledger.remove(src, early=early)
        self._forget_source(src)
        self.edp.evict(np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in ranges]))

    def _ingest(self, group: list[Rollout]) -> None:
        try:
            self.edp.ingest_many(group)  # refuses bad input before storing any of the group
            stored = len(group)
        except BaseException as exc:
            stored = len(getattr(exc, "stored_tickets", ()))  # a later failure: the first ones are stored
            raise
        finally:
            for r in group[:stored]:  # stored rows take the next seqs, in order (this buffer is their only writer)
                self.ledger.record(r.source, self._added, r.rows)
                self._added += r.rows

    # --------------------------------------------------------------- delivery
    def sample(self, num_items: int | None = None, *, batch_size_B: int | None = None,
               batch_length_T: int | None = None, n_step: int | tuple | None = None, beta: float | None = None,
               gamma: float = 0.99, include_infos: bool = False, include_extra_model_outputs: bool = False,
               sample_episodes: bool = True, to_numpy: bool = False, lookback: int = 0,
               min_batch_length_T: int = 0, **kwargs) -> list[DeliveredBatch]:
        if batch_length_T:
            raise ConfigError("batch_length_T", "0 (stateless modules)", batch_length_T,
                              "Conduit's RLlib adapter does not deliver sequences for stateful modules yet; "
                              "disable conduit_rllib for this config")
        if include_infos or include_extra_model_outputs:
            raise ConfigError("include_infos/include_extra_model_outputs", "False", True,
                              "Conduit stores the columns DQN trains on; drop these flags")
        if self.edp is None:
            raise ConfigError("sample()", "at least one add() before sampling", "an empty buffer",
                              "sample after the env runners produced data (num_steps_sampled_before_learning_starts)")
        B = num_items or batch_size_B or self.batch_size_B
        # RLlib's two buffers treat a window that runs past its episode's stored end
        # differently: the prioritized one redraws it, the uniform one delivers it shortened.
        b = self.edp.deliver(int(B), n_step=n_step if n_step is not None else 1, gamma=gamma,
                             beta=self.beta if beta is None else beta,
                             episode_end="redraw" if self.prioritized else "shorten")
        self._last = b
        self._sampled += b.size
        if self.tuner is not None:
            self.tuner.observe()
        if self.learner_shards == 1:
            return [DeliveredBatch(b)]
        # Several learners: k equal parts, rows in order. RLlib's ShardEpisodesIterator gives
        # equal-length items to shards in turn (part i -> learner i, none sliced), and DQN
        # concatenates the learners' TD errors in learner order: the rows' own order, so
        # update_priorities() maps each error to the row it was computed on. (RLlib's own
        # buffer hands its B one-step episodes out round-robin, learner 0 getting rows 0, k,
        # 2k, ..., and then applies the concatenated errors to rows 0, 1, 2, ...)
        # parts are copied: a view would carry the whole batch's storage to every remote learner
        return [DeliveredBatch(part.clone()) for part in b.split(self.learner_shards)]

    def update_priorities(self, priorities, module_id=None) -> None:
        if not self.prioritized or self._last is None:
            return
        # RLlib floors each priority at 1e-12 (never 0: a zero would never be drawn again)
        # and adds no epsilon; the selector is built with eps=0 to match.
        self.edp.update_priorities(self._last, np.maximum(np.abs(np.asarray(priorities, dtype=np.float64)),
                                                          RLLIB_MIN_PRIORITY))

    # ---------------------------------------------------------------- metrics
    def get_metrics(self) -> dict:
        return {}

    def conduit_metrics(self):
        """The data plane's metrics snapshot (per control point: blocked and busy time)."""
        return None if self.edp is None else self.edp.metrics()

    def __len__(self) -> int:
        return 0 if self.edp is None else len(self.edp.buffer)

    def get_num_timesteps(self, module_id=None) -> int:
        return len(self)

    def get_added_timesteps(self, module_id=None) -> int:
        return self._added

    def get_sampled_timesteps(self, module_id=None) -> int:
        return self._sampled

    def get_num_episodes(self, module_id=None) -> int:
        """Episodes stored (done or running), as RLlib counts them."""
        return len(self.ledger.episodes)

    def get_num_episodes_evicted(self, module_id=None) -> int:
        return self.ledger.evicted_episodes

    def eviction_report(self) -> dict:
        """Episodes and steps evicted; ``early``: episodes evicted because the ring would have
        cut them (not RLlib's rule: raise ``ring_slack`` if this is not 0)."""
        return {"episodes": self.ledger.evicted_episodes, "steps": self.ledger.evicted_rows,
                "early": self.ledger.early_episodes}

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        """Everything to continue exactly; numpy arrays and plain values (no pickle needed)."""
        return {"conduit_rllib": 1, "edp": None if self.edp is None else self.edp.state_dict(),
                "spec": None if self.edp is None else self.edp.buffer.spec.to_config(),
                "sources": [[k, v] for k, v in self._sources.items()], "next_source": self._next_source,
                "added": self._added, "sampled": self._sampled,
                "ledger": self.ledger.state(), "source_ids": [[k, v] for k, v in self._source_ids.items()]}

    def set_state(self, state: dict[str, Any]) -> None:
        from conduit_core import ExperienceSpec, StateError
        if state.get("conduit_rllib") != 1:
            raise StateError("replay buffer state: expected a conduit_rllib state (version 1). "
                             "Fix: restore a checkpoint written with conduit_rllib enabled.")
        if state["edp"] is not None:
            if self.edp is None:
                self._build_for(ExperienceSpec.from_config(state["spec"]))
            self.edp.load_state_dict(state["edp"])
        self._sources = {k: int(v) for k, v in state["sources"]}
        self._next_source = int(state["next_source"])
        self._added, self._sampled = int(state["added"]), int(state["sampled"])
        if "ledger" in state:
            self.ledger.load(state["ledger"])
        self._source_ids = {int(k): v for k, v in state.get("source_ids", [])}

    def close(self) -> None:
        if self.edp is not None:
            self.edp.close()

    def __del__(self):  # the worker thread is a daemon; still, free shared memory promptly
        try:
            self.close()
        except Exception:
            pass
