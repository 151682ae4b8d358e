"""Algorithm subclasses: Conduit's buffer built with the config's seed, buffer checkpointing,
build-time checks and the data plane's counters in each result; nothing of the algorithm.

They are set as the config's ``algo_class`` by ``conduit_rllib.enable``; the training
step, sampling, learner updates and weight syncs are RLlib's own (with ``source_ingest``,
DQN's step first hands the env runners their writers). SAC and TQC are DQN subclasses in
RLlib with DQN's training step, so they take the same replay hooks (``ConduitReplayAlgorithm``).
"""

from __future__ import annotations

from ray.rllib.algorithms.dqn import DQN
from ray.rllib.algorithms.ppo import PPO
from ray.rllib.algorithms.sac import SAC
from ray.rllib.algorithms.tqc import TQC

from conduit_core.errors import ConfigError

from .checkpointing import BufferCheckpointMixin, check_capacity


def check_learner_shards(algo) -> None:
    """The buffer delivers one part per learner: refuse a learner count changed after enable()."""
    buf = getattr(algo, "local_replay_buffer", None)
    want = max(1, algo.config.num_learners)
    if buf is not None and getattr(buf, "learner_shards", want) != want:
        raise ConfigError("num_learners", f"a value giving {buf.learner_shards} learner(s), as when "
                          "conduit_rllib.enable() ran", algo.config.num_learners,
                          "call conduit_rllib.enable(config) again after changing num_learners")


#: the key of the data plane's metrics in ``algo.train()``'s result
CONDUIT_RESULTS = "conduit"


class ConduitReplayAlgorithm(BufferCheckpointMixin):
    """Mixed in before RLlib's DQN (or its subclasses SAC, TQC): Conduit's buffer built with
    the config's seed, source-ingest writers handed out, the buffer closed at cleanup."""

    def setup(self, config):
        super().setup(config)
        check_capacity(self)
        check_learner_shards(self)
        self.conduit_writers: dict[int, str] = {}   # source_ingest: env runner index -> its writer's id
        self.conduit_writer_handles: list = []      # those writers (retired when replaced)
        self.conduit_writers_for = None             # the buffer id they write for (a restore changes it)
        self.conduit_unwritten_seen = 0             # the buffer's unwritten_adds when writers were last handed out

    def _create_local_replay_buffer_if_necessary(self, config):
        """RLlib's buffer build, with the config's seed for Conduit's buffer: RLlib passes its
        buffers none (they draw unseeded), and Conduit's draws follow ``ConduitOptions.seed``,
        else this seed (else 0), so runs on different seeds draw differently and a run repeats."""
        from .opt_in import conduit_buffer_kwargs
        kwargs = conduit_buffer_kwargs(config.get("replay_buffer_config") or {})
        if kwargs is None:
            return super()._create_local_replay_buffer_if_necessary(config)
        from .replay_buffer import ConduitEpisodeReplayBuffer
        field = "replay_buffer_config['seed']" if "seed" in kwargs else "config.seed"
        seed = kwargs.pop("seed", self.config.seed)
        if (kwargs.get("conduit") or {}).get("seed") is None and seed is not None \
                and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ConfigError(field, "None or an int >= 0 (Conduit's replay draws are seeded with it)",
                              repr(seed), "call config.debugging(seed=0) (any int >= 0), or pass "
                              "conduit_rllib.enable(config, seed=...)")
        smoothing = self.config.metrics_num_episodes_for_smoothing
        return ConduitEpisodeReplayBuffer(**kwargs, seed=seed, metrics_num_episodes_for_smoothing=smoothing)

    def training_step(self):
        """RLlib's DQN step. With ``source_ingest``, the remote env runners get writers once
        the buffer exists (after the first step's driver-side add, or a restore), and again
        for the runners that lack one (restarted); DQN's step then hands their
        ``WrittenChunk``s to the buffer's ``add`` (see source_ingest.py)."""
        buf = getattr(self, "local_replay_buffer", None)
        if buf is not None and buf.options.source_ingest and buf.edp is not None:
            ledger = buf.edp.buffer.ingest_ledger.buffer
            healthy = self.env_runner_group.num_healthy_remote_workers()
            # again where a runner sent episodes instead of receipts since: restarted without a writer,
            # or its writer's shard was lost (the runner dropped the writer; the shard is replaced)
            if self.conduit_writers_for != ledger or len(self.conduit_writers) != healthy \
                    or buf.unwritten_adds != self.conduit_unwritten_seen:
                from .source_ingest import push_writers
                handles = push_writers(self, buf, retiring=self.conduit_writer_handles)
                self.conduit_writer_handles = list(handles.values())
                self.conduit_writers = {i: w.id for i, w in handles.items()}
                self.conduit_writers_for = ledger
                self.conduit_unwritten_seen = buf.unwritten_adds
        return super().training_step()

    def step(self):
        """RLlib's iteration, its result with the data plane's counters under ``"conduit"``
        (``MetricsSnapshot.scalars()``), where a user reads the rest of the run (TensorBoard,
        W&B, Tune): once per iteration, not per training step (a step is milliseconds). The
        counters are this process's: a restored run keeps its rows (``buffer_size``,
        ``inserted``), its call and time counters start again from zero."""
        result = super().step()
        buf = getattr(self, "local_replay_buffer", None)
        metrics = buf.conduit_metrics() if hasattr(buf, "conduit_metrics") else None
        if metrics is not None and isinstance(result, dict):
            result[CONDUIT_RESULTS] = metrics.scalars()
        return result

    def cleanup(self):
        buf = getattr(self, "local_replay_buffer", None)
        super().cleanup()
        if buf is not None and hasattr(buf, "close"):
            buf.close()


class ConduitDQN(ConduitReplayAlgorithm, DQN):
    pass


class ConduitSAC(ConduitReplayAlgorithm, SAC):
    pass


class ConduitTQC(ConduitReplayAlgorithm, TQC):
    pass


class ConduitPPO(BufferCheckpointMixin, PPO):
    pass
