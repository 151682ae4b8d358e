"""The replay buffer RLlib builds from ``replay_buffer_config={"type": "conduit_rllib...."}``.

It subclasses RLlib's ``PrioritizedEpisodeReplayBuffer`` only so that DQN's
``update_priorities_in_episode_replay_buffer`` (an ``isinstance`` check) hands it the
TD errors; none of the parent's storage is built or used. ``sample()`` returns one
``DeliveredBatch`` (a columnar batch, already selected and gathered) instead of B
one-step episodes; ``ConduitDQNTorchLearner``'s connector turns it into the learner's
tensors directly, skipping the episode re-batching.

The buffer composes its parts: ``episode_ingest`` stores the episode chunks ``add()``
hands it (sources, RLlib's eviction rule through ``episode_ledger``, infos and lookback
rows); ``sample_forms`` reads RLlib's other sample forms (one-step episodes, sequence
slices, the ``[B, T]`` batch form); the fast path's delivery is here.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
from numpy.typing import ArrayLike
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer

from conduit_core import Batch, CapacityError, ConfigError, ExperienceBuffer, ExperienceDataPlane, Prioritized, Uniform

from .columns import EXTRA, episode_columns, spec_for
from .delivered_episodes import EpisodeContext
from .episode_ingest import EpisodeIngest
from .episode_ledger import EpisodeLedger
from .info_store import InfoStore
from .options import ConduitOptions
from .replay_metrics import ReplayMetrics, batch_form_shape, one_step_shape, sequences_shape
from .replay_state import ReplayStateMixin
from .sample_forms import batch_form, check_infos_stored, check_rllib_n_step, episodes_of, sequence_slices
from .sequences import SequenceRules
from .source_ingest import abandon_gaps

if TYPE_CHECKING:
    from ray.rllib.utils.typing import EpisodeType
    from conduit_core.plane.metrics import MetricsSnapshot


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


class ConduitEpisodeReplayBuffer(ReplayStateMixin, PrioritizedEpisodeReplayBuffer):
    """Uniform or prioritized replay on the Conduit data plane (RLlib's semantics)."""

    columns_of = staticmethod(episode_columns)  # the ingestion transform: an episode chunk -> columns
    sequence_rules = SequenceRules()            # RLlib's rules for slices of stored episodes

    def __init__(self, capacity: int = 10000, *, prioritized: bool = False, alpha: float = 1.0,
                 beta: float = 0.4, conduit: dict | None = None, batch_size_B: int = 16,
                 batch_length_T: int | None = None, metrics_num_episodes_for_smoothing: int = 100,
                 seed: int | None = None, learner_shards: int = 1, fresh_seed: bool = False, **unused):
        # RLlib passes its own buffer kwargs; those that would change semantics are refused.
        for key in unused:
            if key not in ("type", "storage_unit", "replay_sequence_length", "replay_mode", "worker_side_prioritization"):
                raise ConfigError(f"replay_buffer_config[{key!r}]", "a key Conduit's buffer understands",
                                  repr(key), "remove it or add support in conduit_rllib.replay_buffer")
        self.capacity, self.prioritized = int(capacity), bool(prioritized)
        self.alpha, self.beta = float(alpha), float(beta)   # alpha's default: RLlib's; beta: each sample() passes its own
        self.options = ConduitOptions.from_kwargs(dict(conduit or {}))
        # the seed: the option's, else the algorithm's; fresh_seed (RLlib's offline pre-learners: one per Ray
        # Data worker, each drawing from an unseeded generator in RLlib) draws one from fresh entropy
        self._seed = self.options.seed if self.options.seed is not None else (
            int(np.random.SeedSequence().generate_state(1)[0]) if fresh_seed else (seed or 0))
        self.batch_size_B = batch_size_B
        # sample_episodes=False's default T, as the RLlib buffer of this kind keeps it (uniform: 64)
        self.batch_length_T = batch_length_T if batch_length_T is not None else (1 if self.prioritized else 64)
        # one delivered part per learner (num_learners >= 1): RLlib's LearnerGroup hands part i to
        # learner i and concatenates their TD errors in that order (see sample())
        if isinstance(learner_shards, bool) or not isinstance(learner_shards, int) or learner_shards < 1:
            raise ConfigError("replay_buffer_config['learner_shards']", "an int >= 1 (max(1, num_learners))",
                              repr(learner_shards), "let conduit_rllib.enable() set it from config.num_learners")
        self.learner_shards = learner_shards
        self.edp: ExperienceDataPlane | None = None  # built on the first add (the spec comes from the data)
        self.tuner = None
        self.ledger = EpisodeLedger()            # stored episodes and RLlib's eviction rule
        self._ring = self.capacity + int(np.ceil(self.capacity * self.options.ring_slack))
        self.infos = InfoStore(self._ring)       # RLlib's infos, beside the rows (objects, not columns)
        # the ingestion side: sources, evictions, infos and lookback rows, steps added (see episode_ingest)
        self.ingest = EpisodeIngest(self.ledger, self.infos, capacity=self.capacity,
                                    store_infos=self.options.store_infos)
        self.context = EpisodeContext()         # spaces and ids for rebuilt episodes (from the first chunk)
        self._sequence_rng = np.random.default_rng([self._seed, 1])  # sequence starts (stateful modules)
        self._shared_draw = None                 # share_rng(): RLlib's own draws, for exact equivalence
        # the core Batch of the last sample: RLlib's update_priorities(priorities) applies to it
        self.last_sampled: Batch | None = None
        self._sampled = 0
        self.unwritten_adds = 0   # source_ingest: adds of episodes a runner did not write at the source
        led = self.ledger   # get_metrics(): lifetime steps and episodes added and evicted, steps sampled
        self.replay_metrics = ReplayMetrics(lambda: (self.ingest.added, led.evicted_rows, len(led.episodes) + led.lost_episodes
                                                     + led.evicted_episodes, led.evicted_episodes, self._sampled),
                                            window=metrics_num_episodes_for_smoothing)

    @property
    def episode_id_to_index(self) -> dict[str, int]:
        """RLlib's index of the stored episodes by id: each stored episode's id, with its position
        among them, oldest first. RLlib's offline pre-learner reads it to skip an episode it added
        before (``OfflinePreLearner._validate_episodes``). Read only: the ledger rebuilds it after a change."""
        return self.ledger.stored_ids()

    @property
    def seed(self) -> int:
        """The seed the buffer's draws start from: ``ConduitOptions.seed``, else the algorithm
        config's seed (``ConduitDQN`` passes it), else 0."""
        return self._seed

    # ------------------------------------------------------------------ build
    def _selector(self):
        return Prioritized(alpha=self.alpha, beta=self.beta, eps=0.0) if self.prioritized else Uniform(draw=self._shared_draw)

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
        if o.mode != "sequential" or o.delivery_granularity != 1 or o.staleness != 0:
            # batches drawn ahead and discarded are rolled back on Conduit's RNG, not on the shared one
            raise ConfigError("share_rng()", "mode='sequential', delivery_granularity=1, staleness=0",
                              f"mode={o.mode!r}, delivery_granularity={o.delivery_granularity}, "
                              f"staleness={o.staleness}", "share the RNG only with the sequential schedule")
        self._shared_draw = lambda count, batch: np.array([rng.integers(count) for _ in range(batch)], dtype=np.int64)

    def _build(self, first_cols: dict[str, np.ndarray]) -> None:
        self._build_for(spec_for(first_cols, obs_codec=self.options.obs_codec))

    def _build_for(self, spec) -> None:
        """The data plane (and, for mode='auto', its tuner) for ``spec``: the one place
        both a first add() and a restore build it, so a restored run is the run it saved."""
        buf = ExperienceBuffer(spec=spec, capacity=self._ring, selector=self._selector(), tier=self.options.tier,
                               shards=self._source_shards(), seed=self._seed, reuse_outputs=self.options.reuse_outputs)
        self.edp = ExperienceDataPlane(buffer=buf, schedule=self.options.to_schedule())
        self.ingest.attach(self.edp, ring=self._ring)
        # what the fast path gathers: the learner's columns, not the extra model outputs (computed once)
        self._core_fields = tuple(f for f in spec.names if not f.startswith(EXTRA))
        self._extra_fields = frozenset(f for f in spec.names if f.startswith(EXTRA))   # every add() checks them
        self._spec_fields = frozenset(spec.names)
        if self.options.mode == "auto":
            from conduit_core.planning.tuner import AutoTuner
            self.tuner = AutoTuner(self.edp, steps_per_phase=self.options.autotune_steps_per_phase,
                                   settle=self.options.autotune_settle)

    def _source_shards(self):
        """Remote shards env runners' writers stage in (``source_ingest``), else None (``tier``)."""
        if not self.options.source_ingest:
            return None
        from conduit_core import ShardSpec
        nodes = self.options.source_nodes or (None,)
        per, extra = divmod(self._ring, len(nodes))
        return [ShardSpec("remote", per + (i < extra), node=n) for i, n in enumerate(nodes)]

    # -------------------------------------------------------------- ingestion
    def add(self, episodes: EpisodeType | Iterable[EpisodeType], weight: float | None = None) -> None:
        """Ingest RLlib episodes (chunks of them: RLlib hands over each episode's new steps),
        ``ingest_granularity`` episodes per ingestion operator call, in the order given, with
        the eviction rule of the RLlib buffer this one stands in for: whole oldest episodes
        leave while the steps exceed ``capacity``, decided once per call for the prioritized
        buffer (a new chunk of an episode evicted here is dropped) and after every chunk for
        the uniform one (an episode evicted mid-call restarts with its next chunk)."""
        if weight is not None:
            raise ConfigError("add(weight=...)", "None (new steps start at the running max priority)", repr(weight),
                              "add without weight (RLlib's DQN passes none); Conduit does not take a starting "
                              "priority through add()")
        if type(episodes) in (set, deque):   # RLlib's force_list: its offline pre-learner adds a set
            episodes = list(episodes)
        elif not isinstance(episodes, (list, tuple)):
            episodes = [episodes]
        for ep in episodes:   # (a loop, not a comprehension: every env step's add comes here)
            if type(ep).__name__ == "MultiAgentEpisode":   # (multi_agent() set after enable(): checked per call)
                raise ConfigError("add(episodes)", "RLlib SingleAgentEpisodes (conduit_rllib's DQN buffer stands in "
                                  "for RLlib's single-agent episode buffers)", "a MultiAgentEpisode",
                                  "run multi-agent DQN on RLlib's MultiAgentEpisodeReplayBuffer, without "
                                  "conduit_rllib.enable(); nothing of this call was stored")
            if getattr(ep, "receipt", None) is not None:   # chunks env runners wrote at the source (source_ingest.py)
                written = [getattr(c, "receipt", None) is not None for c in episodes]
                if not all(written):   # a runner without a writer yet (e.g. restarted): runs of each kind, in order
                    k = written.index(not written[0])
                    self.add(episodes[:k])
                    return self.add(episodes[k:])
                return self._add_written(episodes)
        longest = max((len(ep) for ep in episodes), default=0)
        if longest > self._ring:   # refused before anything is planned, evicted, stored or renamed
            raise CapacityError(f"add(): an episode chunk of {longest} steps is longer than the buffer's ring of "
                                f"{self._ring} slots (capacity {self.capacity} x (1 + ring_slack)); RLlib's "
                                "buffer would hold it, over its capacity, until the next add evicts it. Nothing was "
                                "stored or evicted. Fix: raise the replay buffer's capacity (or ring_slack), or "
                                "hand over shorter chunks (rollout_fragment_length).")
        if self.options.source_ingest and self.edp is not None:
            self.unwritten_adds += 1   # episodes from a runner without a writer (ConduitDQN hands it one)
        if self.edp is not None:
            self.ingest.sync_losses()   # episodes with rows on a lost shard leave before this add's plan
        chunks, ends = [], {}
        ingest = self.ingest
        for ep in episodes:
            n = len(ep)
            if n == 0:
                continue
            cols = self.columns_of(ep)
            if self.edp is None:
                self._build(cols)
            elif cols.keys() != self._spec_fields:   # (the usual add: one comparison in C)
                self._check_extras(cols)
            ctx = self.context
            if ctx.observation_space is None and ctx.action_space is None and ctx.agent_id is None \
                    and ctx.module_id is None:   # empty: the first chunk, or the first after a restore
                self.context = EpisodeContext(ep.observation_space, ep.action_space, ep.agent_id, ep.module_id)
            chunks.append((ep, cols, ingest.continuing_source(ep, ends), n))
        if not chunks:   # (RLlib logs an add of nothing too: DQN's runners may time out)
            return self.replay_metrics.after_add(self.ledger.rows, len(self.ledger.episodes))
        if self.prioritized:
            self.ingest.add_as_prioritized(chunks)
        else:
            self.ingest.add_as_uniform(chunks)
        self.replay_metrics.after_add(self.ledger.rows, len(self.ledger.episodes))

    def _add_written(self, written) -> None:
        """``add`` for ``WrittenChunk``s: the same plan as for episodes; each receipt is
        committed once (one committed or declined before is skipped, counted in
        ``ingest.duplicates``, and changes nothing)."""
        if self.edp is None or not self.options.source_ingest:
            raise ConfigError("add(written chunks)", "a buffer built with source_ingest=True by an earlier add()",
                              "no data plane yet" if self.edp is None else "source_ingest=False",
                              "enable source_ingest and let the first training step go through the driver")
        abandon_gaps(self.edp.buffer, written)   # results of these runners RLlib dropped: their rows released
        self.ingest.sync_losses()
        taken, seen, chunks, ends = self.edp.buffer.ingest_ledger.taken, set(), [], {}
        for c in written:
            if c.receipt.key in taken or c.receipt.key in seen:
                self.ingest.duplicates += 1
                continue
            seen.add(c.receipt.key)
            chunks.append((c, None, self.ingest.continuing_source(c, ends), c.n))
        if chunks:
            (self.ingest.add_as_prioritized if self.prioritized else self.ingest.add_as_uniform)(chunks)
        self.replay_metrics.after_add(self.ledger.rows, len(self.ledger.episodes))

    def _check_extras(self, cols: dict) -> None:
        """Called where a chunk's columns are not the spec's fields: the extra outputs differ, named."""
        want = self._extra_fields
        have = {k for k in cols if k.startswith(EXTRA)}
        if have != want:
            from conduit_core import SpecError
            raise SpecError("episode.extra_model_outputs", f"the keys of the first episode ({sorted(want)})",
                            sorted(have), "return the same extra model outputs on every forward pass (the "
                            "buffer's fields are fixed by its first add())")

    # --------------------------------------------------------------- delivery
    def sample(self, num_items: int | None = None, *, batch_size_B: int | None = None,
               batch_length_T: int | None = None, n_step: int | tuple | None = None, beta: float = 0.0,
               gamma: float = 0.99, include_infos: bool = False, include_extra_model_outputs: bool = False,
               sample_episodes: bool | None = None, to_numpy: bool = False, lookback: int = 0,
               min_batch_length_T: int = 0, **kwargs: Any) -> list:
        """What RLlib's buffer of this kind returns for these arguments (the same
        distribution; see the module docstring for the form): a one-item list with a
        ``DeliveredBatch`` on the fast path, else RLlib's ``SingleAgentEpisode`` list.
        ``sample_episodes``: None is RLlib's default for the kind (the uniform buffer's
        ``[B, T]`` batch form; the prioritized one always returns episodes). Arguments
        neither RLlib buffer reads, and n-step forms RLlib refuses, are refused."""
        if kwargs:
            raise ConfigError(f"sample({sorted(kwargs)[0]}=...)", "an argument of RLlib's episode buffers' sample()",
                              repr(sorted(kwargs)[0]), "check the spelling (e.g. n_step, batch_length_T, "
                              "include_infos); RLlib would ignore it silently")
        if n_step is not None and type(n_step) is not int and not (   # (the usual range, decided inline)
                type(n_step) is tuple and len(n_step) == 2 and type(n_step[0]) is int and type(n_step[1]) is int
                and 1 <= n_step[0] < n_step[1]) and not isinstance(n_step, np.integer):
            check_rllib_n_step(n_step)
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
            if not sample_episodes:  # RLlib's [B, T] batch form (DreamerV3's kind): None is its default here
                return self._sample_batch_form(B, int(batch_length_T or self.batch_length_T))
            if batch_length_T:
                return self._sample_sequences(B, int(batch_length_T), n_step, int(lookback), int(min_batch_length_T))
            if n_step is None:   # RLlib's uniform buffer asserts it is given for episodes
                raise ConfigError("sample(n_step=...)", "an int or (lo, hi) when sampling episodes", "None",
                                  "pass n_step=1 (or the n-step to apply)")
            if min_batch_length_T:   # RLlib redraws starts this close to their episode's end; not built here
                raise ConfigError("sample(min_batch_length_T=...)", "0 for one-step draws (batch_length_T=0) from "
                                  "the uniform buffer", repr(min_batch_length_T), "use burn_in_len=0 (it only applies "
                                  "to stateful modules), a prioritized buffer, or batch_length_T > 0 for sequences")
        # RLlib's two buffers treat a window that runs past its episode's stored end
        # differently: the prioritized one redraws it, the uniform one delivers it shortened.
        if beta is None and self.prioritized:   # RLlib's asserts beta >= 0.0 (a TypeError on None)
            raise ConfigError("sample(beta=...)", "a float >= 0", "None", "pass one, or none for RLlib's 0.0")
        self.ingest.sync_losses()   # (the deliver passes over lost rows itself; the episodes form reads the ledger)
        b = self.edp.deliver(B, n_step=n_step if n_step is not None else 1, gamma=gamma, beta=beta or 0.0,
                             episode_end="redraw" if self.prioritized else "shorten",
                             fields=None if include_extra_model_outputs else self._core_fields)
        self.last_sampled = b
        self._sampled += B   # (b.size: a replay batch has the B items asked for)
        self.replay_metrics.after_sample(B, *one_step_shape(b, n_step, self.ledger))
        if self.tuner is not None:
            self.tuner.observe()
        if self.options.delivery == "episodes" or include_infos:
            check_infos_stored(self.options.store_infos, include_infos or not self.prioritized)
            episodes = self._episodes_of(b, include_infos=include_infos or not self.prioritized,
                                         include_extras=include_extra_model_outputs, lookback=int(lookback))
            if to_numpy and self.prioritized:   # (RLlib's uniform buffer reads no to_numpy)
                for ep in episodes:
                    ep.to_numpy()
            return episodes
        if self.learner_shards == 1:
            return [DeliveredBatch(b)]
        # Several learners: k equal parts, rows in order (part i -> learner i, as RLlib's
        # ShardEpisodesIterator hands equal-length items out), so DQN's TD errors, concatenated in
        # learner order, map to the rows they were computed on (RLlib's own buffer deals its B
        # episodes round-robin and applies the errors to rows 0, 1, 2, ...). Parts are
        # copied: a view would carry the whole batch's storage to every remote learner.
        return [DeliveredBatch(part.clone()) for part in b.split(self.learner_shards)]

    def _episodes_of(self, b: Batch, *, include_infos: bool, include_extras: bool, lookback: int) -> list:
        """The delivered rows as RLlib's one-step episodes (``sample_forms.episodes_of``)."""
        return episodes_of(b, self.ledger, self.infos, include_infos=include_infos, include_extras=include_extras,
                           uniform=not self.prioritized, lookback=lookback, ctx=self.context,
                           learner_shards=self.learner_shards)

    def _sample_sequences(self, B: int, T: int, n_step, lookback: int, min_T: int) -> list:
        """RLlib's uniform sequence slices, as its episodes (``sample_forms.sequence_slices``)."""
        out = self.ingest.after_losses(lambda: sequence_slices(
            self.edp, self.ledger, self.infos, self.ingest.lookback_rows, rng=self._sequence_rng,
            rules=self.sequence_rules, ctx=self.context, store_infos=self.options.store_infos,
            B=B, T=T, n_step=n_step, lookback=lookback, min_T=min_T))
        self._sampled += B
        self.replay_metrics.after_sample(B, *sequences_shape(out, B))
        self.last_sampled = None  # no priorities for the uniform buffer
        return out

    def _sample_batch_form(self, B: int, T: int) -> dict[str, np.ndarray]:
        """RLlib's ``sample_episodes=False`` dict of ``[B, T]`` arrays (``sample_forms.batch_form``)."""
        out, rows = self.ingest.after_losses(lambda: batch_form(self.edp, self.ledger, rng=self._sequence_rng,
                                                          fields=self._core_fields, B=B, T=T))
        self._sampled += B * T
        self.replay_metrics.after_sample(B * T, *batch_form_shape(rows))
        self.last_sampled = None
        return out

    def update_priorities(self, priorities: ArrayLike, module_id: str | None = None) -> None:
        """RLlib's call: priorities for the rows of the last sample."""
        if self.prioritized:
            if self.last_sampled is None:   # (RLlib's buffer asserts: its sampled indices were cleared)
                raise ConfigError("update_priorities()", "one call per sample()", "a call with no sample() since "
                                  "the last update (or the last restore)", "sample() first; update each sample once")
            # update_priorities_of's call, inline: a hot path
            self.edp.update_priorities(self.last_sampled, np.asarray(priorities), abs_floor=RLLIB_MIN_PRIORITY)
            self.last_sampled = None

    def update_priorities_of(self, batch: Any, priorities: ArrayLike) -> None:
        """Priorities for the rows of a delivered core ``Batch`` (any earlier one; rows
        overwritten since are skipped). RLlib floors each priority at 1e-12 (never 0: a zero
        would never be drawn again) and adds no epsilon; the selector is built with eps=0 to match."""
        if not self.prioritized:
            return
        self.edp.update_priorities(batch, np.asarray(priorities), abs_floor=RLLIB_MIN_PRIORITY)   # max(|p|, 1e-12)

    # ---------------------------------------------------------------- metrics
    def get_metrics(self) -> dict:
        """RLlib's replay metrics since the last call, every key its buffers report (``replay_metrics``)."""
        return self.replay_metrics.result()

    def conduit_metrics(self) -> MetricsSnapshot | None:
        """The data plane's metrics snapshot (per control point: blocked and busy time)."""
        return None if self.edp is None else self.edp.metrics()

    def __len__(self) -> int:
        return 0 if self.edp is None else len(self.edp.buffer)

    def get_num_timesteps(self, module_id: str | None = None) -> int:
        return len(self)

    def get_added_timesteps(self, module_id: str | None = None) -> int:
        return self.ingest.added

    def get_sampled_timesteps(self, module_id: str | None = None) -> int:
        return self._sampled

    def get_num_episodes(self, module_id: str | None = None) -> int:
        """Episodes stored (done or running), as RLlib counts them."""
        return len(self.ledger.episodes)

    def get_num_episodes_evicted(self, module_id: str | None = None) -> int:
        return self.ledger.evicted_episodes

    def eviction_report(self) -> dict:
        """Episodes and steps evicted; ``early``: episodes evicted because the ring would have
        cut them (not RLlib's rule: raise ``ring_slack`` if this is not 0)."""
        return {"episodes": self.ledger.evicted_episodes, "steps": self.ledger.evicted_rows, "early": self.ledger.early_episodes}

    def close(self) -> None:
        if self.edp is not None:
            self.edp.close()

    def __del__(self):  # the worker thread is a daemon; still, free shared memory promptly
        try:   # (not contextlib: at interpreter exit the module may be gone already)
            self.close()
        except Exception:
            pass
