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

from conduit_core import (Batch, ConfigError, ExperienceBuffer, ExperienceDataPlane, Prioritized, Rollout,
                          SemanticError, Uniform)

from .columns import EXTRA, chunk_lookback_row, episode_columns, episode_infos, spec_for
from .delivered_episodes import EpisodeContext, one_step_episodes, sequence_episode, shard_order
from .episode_ledger import EpisodeLedger
from .info_store import InfoStore
from .options import ConduitOptions
from .sequences import SequenceRules, assemble_batch, batch_rows, draw_slices


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
    sequence_rules = SequenceRules()            # RLlib's rules for slices of stored episodes

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
        self.batch_length_T = batch_length_T  # sample_episodes=False's default T, as RLlib's buffer keeps it
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
        self.infos = InfoStore(self._ring)       # RLlib's infos, beside the rows (objects, not columns)
        self.context = EpisodeContext()         # spaces and ids for rebuilt episodes (from the first chunk)
        self._sequence_rng = np.random.default_rng([self._seed, 1])  # sequence starts (stateful modules)
        self._shared_draw = None                 # share_rng(): RLlib's own draws, for exact equivalence
        self._lookback_rows: dict[int, dict] = {}  # source -> its first chunk's lookback step (see columns)
        self._last: Batch | None = None
        self._added = 0
        self._sampled = 0
        self._pending_state: dict | None = None

    # ------------------------------------------------------------------ build
    def _selector(self):
        if self.prioritized:
            return Prioritized(alpha=self.alpha, beta=self.beta, eps=0.0)
        return Uniform(draw=self._shared_draw)

    def share_rng(self, rng: np.random.Generator) -> None:
        """Exact equivalence with RLlib's uniform ``EpisodeReplayBuffer``: draw each item as it
        does, one ``rng.integers(stored steps)`` per item over the stored steps oldest first,
        from ``rng`` (e.g. a Generator seeded as that buffer's ``rng``). Both then deliver the
        same rows in the same order for an int ``n_step`` (n-step ranges and sequences still
        draw from Conduit's own RNG). Call before the first ``add()``; the generator's state is
        the caller's (it is not saved with the buffer)."""
        if self.prioritized or self.edp is not None:
            raise ConfigError("share_rng()", "a uniform buffer before its first add()",
                              "prioritized" if self.prioritized else "a buffer already holding data",
                              "build a uniform ConduitEpisodeReplayBuffer and share the RNG first")
        o = self.options
        if o.schedule != "sequential" or o.delivery_granularity != 1 or o.staleness != 0:
            # batches drawn ahead and discarded are rolled back on Conduit's RNG, not on the shared one
            raise ConfigError("share_rng()", "schedule='sequential', delivery_granularity=1, staleness=0",
                              f"schedule={o.schedule!r}, delivery_granularity={o.delivery_granularity}, "
                              f"staleness={o.staleness}", "share the RNG only with the sequential schedule")
        self._shared_draw = lambda count, batch: np.array([rng.integers(count) for _ in range(batch)], dtype=np.int64)

    def _build(self, first_cols: dict[str, np.ndarray]) -> None:
        self._build_for(spec_for(first_cols, obs_codec=self.options.obs_codec))

    def _build_for(self, spec) -> None:
        """The data plane (and, for schedule='auto', its tuner) for ``spec``: the one place
        both a first add() and a restore build it, so a restored run is the run it saved."""
        buf = ExperienceBuffer(spec=spec, capacity=self._ring, selector=self._selector(), tier=self.options.tier,
                               seed=self._seed, reuse_outputs=self.options.reuse_outputs)
        self.edp = ExperienceDataPlane(buffer=buf, schedule=self.options.to_schedule())
        # what the fast path gathers: the learner's columns, not the extra model outputs (computed once)
        self._core_fields = tuple(f for f in spec.names if not f.startswith(EXTRA))
        if self.options.schedule == "auto":
            from conduit_core.tuner import AutoTuner
            self.tuner = AutoTuner(self.edp, steps_per_phase=self.options.autotune_steps_per_phase,
                                   settle=self.options.autotune_settle)

    # -------------------------------------------------------------- ingestion
    def add(self, episodes, weight=None) -> None:
        """Ingest RLlib episodes (chunks of them: RLlib hands over each episode's new steps),
        ``ingest_granularity`` episodes per ingestion operator call, in the order given, with
        the eviction rule of the RLlib buffer this one stands in for: whole oldest episodes
        leave while the steps exceed ``capacity``, decided once per call for the prioritized
        buffer (a new chunk of an episode evicted here is dropped) and after every chunk for
        the uniform one (an episode evicted mid-call restarts with its next chunk)."""
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
            else:
                self._check_extras(cols)
            if self.context == EpisodeContext():  # the first chunk, or the first after a restore
                self.context = EpisodeContext(ep.observation_space, ep.action_space, ep.agent_id, ep.module_id)
            chunks.append((ep, cols, self._source_of(ep), n))
        if not chunks:
            return
        if self.prioritized:
            self._add_as_prioritized(chunks)
        else:
            self._add_as_uniform(chunks)

    def _source_of(self, ep) -> int:
        """The source (Conduit's episode key) of an RLlib episode id, a new one if none is open."""
        src = self._sources.get(ep.id_)
        if src is None:
            src = self._sources[ep.id_] = self._next_source
            self._source_ids[src] = ep.id_
            self._next_source += 1
        return src

    def _add_as_prioritized(self, chunks) -> None:
        """``PrioritizedEpisodeReplayBuffer.add``: one decision for the whole call (``plan``)."""
        evict, drop = self.ledger.plan([(src, n) for _, _, src, n in chunks], self.capacity)
        keep = [c for c in chunks if c[2] not in drop]
        if sum(n for *_, n in keep) > self._ring:
            from conduit_core import CapacityError
            raise CapacityError(f"add(): {sum(n for *_, n in keep)} new steps in one call exceed the buffer's ring "
                                f"of {self._ring} slots (capacity {self.capacity}); RLlib's prioritized buffer fails "
                                "here too. Fix: raise the replay buffer capacity, or hand over fewer steps per add.")
        for src in evict:
            self._evict_episode(src)
        for ep, _, src, _ in chunks:
            if ep.is_done or src in drop:  # over, or evicted: its id starts a new episode if it comes back
                self._forget_source(src)
        self._ingest_in_groups([(Rollout(cols, source=src, rows=n), ep) for ep, cols, src, n in keep])
        for ep, _, _, _ in keep:
            if ep.is_done:
                self._forget_source(self._sources.get(ep.id_, -1))

    def _add_as_uniform(self, chunks) -> None:
        """``EpisodeReplayBuffer.add``: chunk by chunk, evicting after each (``plan_per_chunk``)."""
        sources: dict = {}  # plan key -> Conduit source
        group: list[tuple[Rollout, Any]] = []
        for step in self.ledger.plan_per_chunk([(src, n) for _, _, src, n in chunks], self.capacity):
            if step[0] == "add":
                _, i, key = step
                ep, cols, src, n = chunks[i]
                if key not in sources:
                    if isinstance(key, tuple):  # its episode left earlier in this call: it starts over
                        self._forget_source(src)
                        sources[key] = self._source_of(ep)
                    else:
                        sources[key] = key
                group.append((Rollout(cols, source=sources[key], rows=n), ep, key))
                continue
            sources.update(self._ingest_in_groups(group))  # what the plan added is stored before anything leaves
            group = []
            src = sources.get(step[1], step[1])
            if src in self.ledger.episodes:  # (not if the ring already cut it early)
                self._evict_episode(src)
        sources.update(self._ingest_in_groups(group))
        for ep, _, src, _ in chunks:
            if ep.is_done:
                self._forget_source(self._sources.get(ep.id_, src))

    def _ingest_in_groups(self, rollouts: list) -> dict:
        """Store ``(rollout, episode[, plan key])`` items, ``ingest_granularity`` per call.

        The ring is larger than capacity; where these rows would still overwrite a stored
        step, the episode it would cut leaves first, whole (counted in ``eviction_report``
        as early: not RLlib's rule, raise ``ring_slack``), and a chunk of such an episode
        starts a new one. Returns plan key -> the source its chunks now go to."""
        moved: dict = {}
        if not rollouts:
            return moved
        cutoff = self._added + sum(item[0].rows for item in rollouts) - self._ring
        if cutoff > 0:
            early = set(self.ledger.ring_conflicts(cutoff))
            for src in early:
                self._evict_episode(src, early=True)
            self.ledger.forget_below(cutoff)
            fixed, renamed = [], {}
            for item in rollouts:
                r, ep = item[0], item[1]
                if r.source in early:
                    new = renamed.setdefault(r.source, self._source_of(ep))
                    r = Rollout(r.data, source=new, rows=r.rows)
                    if len(item) > 2:
                        moved[item[2]] = new
                fixed.append((r, ep))
            rollouts = fixed
        g = self.edp.schedule.ingest_granularity
        for k in range(0, len(rollouts), g):
            self._ingest([(item[0], item[1]) for item in rollouts[k:k + g]])
        return moved

    def _check_extras(self, cols: dict) -> None:
        have = {k for k in cols if k.startswith(EXTRA)}
        want = {k for k in self.edp.buffer.spec.names if k.startswith(EXTRA)}
        if have != want:
            from conduit_core import SpecError
            raise SpecError("episode.extra_model_outputs", f"the keys of the first episode ({sorted(want)})",
                            sorted(have), "return the same extra model outputs on every forward pass (the "
                            "buffer's fields are fixed by its first add())")

    def _forget_source(self, src: int) -> None:
        ep_id = self._source_ids.pop(src, None)
        if ep_id is not None and self._sources.get(ep_id) == src:
            del self._sources[ep_id]

    def _evict_episode(self, src: int, *, early: bool = False) -> None:
        ranges = self.ledger.remove(src, early=early)
        self._lookback_rows.pop(src, None)
        self._forget_source(src)
        self.edp.evict(np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in ranges]))

    def _ingest(self, group: list[tuple[Rollout, Any]]) -> None:
        infos = [episode_infos(ep, r.rows) if self.options.store_infos else None for r, ep in group]
        try:
            self.edp.ingest_many([r for r, _ in group])  # refuses bad input before storing any of the group
            stored = len(group)
        except BaseException as exc:
            stored = len(getattr(exc, "stored_tickets", ()))  # a later failure: the first ones are stored
            raise
        finally:
            for (r, ep), info in zip(group[:stored], infos):  # stored rows take the next seqs, in order
                if r.source not in self.ledger.episodes and ep.t_started > 0:  # a stored episode starts mid-way
                    row = chunk_lookback_row(ep)
                    if row is not None:
                        self._lookback_rows[r.source] = row
                self.ledger.record(r.source, self._added, r.rows, id_=ep.id_, t_started=ep.t_started)
                if info is not None:
                    self.infos.put(self._added, info)
                self._added += r.rows

    # --------------------------------------------------------------- delivery
    def sample(self, num_items: int | None = None, *, batch_size_B: int | None = None,
               batch_length_T: int | None = None, n_step: int | tuple | None = None, beta: float | None = None,
               gamma: float = 0.99, include_infos: bool = False, include_extra_model_outputs: bool = False,
               sample_episodes: bool = True, to_numpy: bool = False, lookback: int = 0,
               min_batch_length_T: int = 0, **kwargs) -> list:
        """What RLlib's buffer of this kind returns for these arguments (the same
        distribution; see the module docstring for the form): a one-item list with a
        ``DeliveredBatch`` on the fast path, else RLlib's ``SingleAgentEpisode`` list.
        ``sample_episodes`` defaults to True here (what DQN and SAC pass); RLlib's uniform
        buffer defaults to False, its ``[B, T]`` batch form: pass it explicitly for that."""
        if self.edp is None:
            raise ConfigError("sample()", "at least one add() before sampling", "an empty buffer",
                              "sample after the env runners produced data (num_steps_sampled_before_learning_starts)")
        if num_items is not None and batch_size_B is not None:
            raise ConfigError("sample(num_items=..., batch_size_B=...)", "one of the two", "both",
                              "pass either num_items or batch_size_B (RLlib's buffers assert the same)")
        B = int(num_items or batch_size_B or self.batch_size_B)
        # RLlib's prioritized buffer ignores batch_length_T, lookback and min_batch_length_T
        # (it always returns one-step n-step episodes); its uniform one slices sequences.
        if not self.prioritized:
            if not sample_episodes:  # RLlib's [B, T] batch form (DreamerV3's kind)
                return self._sample_batch_form(B, int(batch_length_T or self.batch_length_T))
            if batch_length_T:
                return self._sample_sequences(B, int(batch_length_T), n_step, int(lookback), int(min_batch_length_T))
        # RLlib's two buffers treat a window that runs past its episode's stored end
        # differently: the prioritized one redraws it, the uniform one delivers it shortened.
        b = self.edp.deliver(B, n_step=n_step if n_step is not None else 1, gamma=gamma,
                             beta=self.beta if beta is None else beta,
                             episode_end="redraw" if self.prioritized else "shorten",
                             fields=None if include_extra_model_outputs else self._core_fields)
        self._last = b
        self._sampled += b.size
        if self.tuner is not None:
            self.tuner.observe()
        if self.options.delivery == "episodes" or include_infos:
            self._check_infos_stored(include_infos or not self.prioritized)
            return self._episodes_of(b, include_infos=include_infos or not self.prioritized,
                                     include_extras=include_extra_model_outputs, lookback=int(lookback))
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

    def _check_infos_stored(self, needed: bool) -> None:
        if needed and not self.options.store_infos:
            raise ConfigError("conduit_rllib.enable(store_infos=...)", "True for samples that carry infos "
                              "(include_infos, episode delivery from the uniform buffer, sequences)", False,
                              "drop store_infos=False (RLlib's buffers keep infos with every episode)")

    def _episodes_of(self, b: Batch, *, include_infos: bool, include_extras: bool, lookback: int) -> list:
        """The delivered rows as RLlib's one-step episodes (see delivered_episodes)."""
        cols = {k: v.cpu().numpy() for k, v in b.items()}
        index = self.ledger.index()
        ep, pos = index.locate(b.seqs)
        first = last = None
        if include_infos:
            first = self.infos.obs_infos(b.seqs)
            last = self.infos.next_infos(index.seq_at(ep, pos + cols["n_step"].astype(np.int64) - 1))
        episodes = one_step_episodes(
            cols, weights=None if b.weights is None else b.weights.cpu().numpy(), starts=pos, first_infos=first,
            last_infos=last, ids=[index.records[e].id_ for e in ep], include_extras=include_extras,
            uniform=not self.prioritized, lookback=lookback, ctx=self.context)
        if self.learner_shards > 1:  # learner i gets rows i*m.. in order, as on the fast path
            episodes = [episodes[j] for j in shard_order(len(episodes), self.learner_shards)]
        return episodes

    def _sample_sequences(self, B: int, T: int, n_step, lookback: int, min_T: int) -> list:
        """RLlib's uniform sequence slices (``sequences.draw_slices``), as its episodes."""
        if n_step not in (None, 1):
            raise ConfigError("n_step", "1 when sampling sequences (batch_length_T > 0)", repr(n_step),
                              "sample sequences with n_step=1 (RLlib's buffer asserts the same)")
        if lookback < 0 or min_T < 0:
            raise ConfigError("lookback/min_batch_length_T", ">= 0", (lookback, min_T), "pass non-negative ints")
        self._check_infos_stored(True)
        index = self.ledger.index()
        rules = self.sequence_rules
        chosen = draw_slices(index, self._sequence_rng, B, T, min_T, rules)
        extra = [self._lookback_rows.get(int(index.sources[e])) for e, _, _ in chosen]
        held = [rules.lookback_steps(t, lookback, 0 if x is None else 1) for (_, t, _), x in zip(chosen, extra)]
        # stored rows from max(t - held, 0); a held step before the episode's first is its chunk's lookback
        seqs = [index.seq_at(np.full(t + L - max(t - h, 0), e), np.arange(max(t - h, 0), t + L))
                for (e, t, L), h in zip(chosen, held)]
        cols = {k: v.cpu().numpy() for k, v in self.edp.read(np.concatenate(seqs)).items()}
        out, at = [], 0
        for (e, t, L), s, h, x in zip(chosen, seqs, held, extra):
            part = {k: v[at:at + s.size] for k, v in cols.items()}
            at += s.size
            rec = index.records[e]
            infos = self.infos.obs_infos(s) + self.infos.next_infos(s[-1:])
            if h > t:  # the chunk's own lookback step comes first
                part = {k: np.concatenate([np.asarray(x["cols"][k], dtype=v.dtype), v]) for k, v in part.items()}
                infos = [x["info"], *infos]
            out.append(sequence_episode(part, lookback_steps=h, lookback=lookback, infos=infos, id_=rec.id_,
                                        t_started=rec.t_started + t, ctx=self.context))
        self._sampled += B
        self._last = None  # no priorities for the uniform buffer
        return out

    def _sample_batch_form(self, B: int, T: int) -> dict[str, np.ndarray]:
        """RLlib's ``sample_episodes=False`` dict of ``[B, T]`` arrays (``sequences.batch_rows``)."""
        if not T or T < 1:
            raise ConfigError("batch_length_T", "an int >= 1 for sample_episodes=False", repr(T),
                              "pass batch_length_T (or build the buffer with batch_length_T=...)")
        index = self.ledger.index()
        rows = batch_rows(index, self._sequence_rng, B, T)
        read = lambda seqs: {k: v.cpu().numpy() for k, v in self.edp.read(seqs, fields=self._core_fields).items()}
        out = assemble_batch(rows, index, read, T)
        self._sampled += B * T
        self._last = None
        return out

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
                "ledger": self.ledger.state(), "source_ids": [[k, v] for k, v in self._source_ids.items()],
                "infos": self.infos.state(self._stored_seqs() if self.options.store_infos else np.zeros(0, np.int64)),
                "lookback_rows": [[src, row["cols"], row["info"]] for src, row in self._lookback_rows.items()],
                "sequence_rng": self._sequence_rng.bit_generator.state}

    def _stored_seqs(self) -> np.ndarray:
        ranges = [r for rec in self.ledger.episodes.values() for r in rec.seqs()]
        return (np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in ranges]) if ranges
                else np.zeros(0, dtype=np.int64))

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
        if "infos" in state:  # written since 2026-11-30; older states restore without infos
            self.infos.load(state["infos"])
        self._lookback_rows = {int(src): {"cols": {k: np.asarray(v) for k, v in c.items()}, "info": i}
                               for src, c, i in state.get("lookback_rows", [])}
        if "sequence_rng" in state:
            self._sequence_rng.bit_generator.state = state["sequence_rng"]

    def close(self) -> None:
        if self.edp is not None:
            self.edp.close()

    def __del__(self):  # the worker thread is a daemon; still, free shared memory promptly
        try:
            self.close()
        except Exception:
            pass
