"""The replay buffer RLlib builds from ``replay_buffer_config={"type": "conduit_rllib...."}``.

It subclasses RLlib's ``PrioritizedEpisodeReplayBuffer`` only so that DQN's
``update_priorities_in_episode_replay_buffer`` (an ``isinstance`` check) hands it the
TD errors; none of the parent's storage is built or used. ``sample()`` returns one
``DeliveredBatch`` (a columnar batch, already selected and gathered) instead of B
one-step episodes; ``ConduitDQNTorchLearner``'s connector turns it into the learner's
tensors directly, skipping the episode re-batching.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer

from conduit_core import Batch, ConfigError, ExperienceBuffer, ExperienceDataPlane, Prioritized, Rollout, Uniform

from .columns import episode_columns, spec_for
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
                 **unused):
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
        self.edp: ExperienceDataPlane | None = None  # built on the first add (the spec comes from the data)
        self.tuner = None
        self._sources: dict[str, int] = {}
        self._next_source = 0
        # episode (source) -> seq of its last stored step, oldest last step first: an episode
        # is stored while that step is (RLlib's get_num_episodes counts done episodes too)
        self._episode_last: OrderedDict[int, int] = OrderedDict()
        self._episodes_evicted = 0
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
        buf = ExperienceBuffer(spec=spec, capacity=self.capacity, selector=self._selector(), tier=self.options.tier,
                               seed=self._seed, reuse_outputs=self.options.reuse_outputs)
        self.edp = ExperienceDataPlane(buffer=buf, schedule=self.options.to_schedule())
        if self.options.schedule == "auto":
            from conduit_core.tuner import AutoTuner
            self.tuner = AutoTuner(self.edp, steps_per_phase=self.options.autotune_steps_per_phase,
                                   settle=self.options.autotune_settle)

    # -------------------------------------------------------------- ingestion
    def add(self, episodes, weight=None) -> None:
        """Ingest RLlib episodes (chunks of them: RLlib hands over each episode's new steps),
        ``ingest_granularity`` episodes per ingestion operator call, in the order given."""
        if not isinstance(episodes, (list, tuple)):
            episodes = [episodes]
        group: list[Rollout] = []
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
                self._next_source += 1
            group.append(Rollout(cols, source=src, rows=n))
            if ep.is_done:
                self._sources.pop(ep.id_, None)  # the episode is over: its id will not come back
            if len(group) >= self.edp.schedule.ingest_granularity:
                self._ingest(group)
                group = []
        if group:
            self._ingest(group)

    def _ingest(self, group: list[Rollout]) -> None:
        self.edp.ingest_many(group)  # raises before accepting anything of a group it refuses
        for r in group:  # accepted rows take the next seqs, in order (this buffer is their only writer)
            self._added += r.rows
            self._episode_last[r.source] = self._added - 1
            self._episode_last.move_to_end(r.source)

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
        return [DeliveredBatch(b)]

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
        """Episodes with a stored step (done or running), as RLlib counts them."""
        self._forget_evicted_episodes()
        return len(self._episode_last)

    def get_num_episodes_evicted(self, module_id=None) -> int:
        self._forget_evicted_episodes()
        return self._episodes_evicted

    def _forget_evicted_episodes(self) -> None:
        if self.edp is None:
            return
        buf = self.edp.buffer
        oldest = buf.inserted - len(buf)  # seq of the oldest stored step
        while self._episode_last:
            src, last = next(iter(self._episode_last.items()))
            if last >= oldest:
                break
            self._episode_last.popitem(last=False)
            self._episodes_evicted += 1

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        """Everything to continue exactly; numpy arrays and plain values (no pickle needed)."""
        return {"conduit_rllib": 1, "edp": None if self.edp is None else self.edp.state_dict(),
                "spec": None if self.edp is None else self.edp.buffer.spec.to_config(),
                "sources": [[k, v] for k, v in self._sources.items()], "next_source": self._next_source,
                "added": self._added, "sampled": self._sampled,
                "episode_last": [[k, v] for k, v in self._episode_last.items()],
                "episodes_evicted": self._episodes_evicted}

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
        self._episode_last = OrderedDict((int(k), int(v)) for k, v in state.get("episode_last", []))
        self._episodes_evicted = int(state.get("episodes_evicted", 0))

    def close(self) -> None:
        if self.edp is not None:
            self.edp.close()

    def __del__(self):  # the worker thread is a daemon; still, free shared memory promptly
        try:
            self.close()
        except Exception:
            pass
