"""Ingestion at the source for RLlib (``conduit_rllib.enable(config, source_ingest=True)``):
each remote env runner writes its episode chunks into the buffer's shard on its own node,
and the driver only sees receipts and the per-chunk facts its episode ledger needs.

    env runner k (RLlib's SingleAgentEnvRunner)               driver (ConduitDQN)
    sample() ── RLlib's own sampling, metrics as always
      └─ episode_columns(chunk) ── writer.write(cols) ──▶ shard actor (staged rows)
      └─ WrittenChunk(receipt, id, done, t_started, n, infos, lookback) ─▶ DQN's training step hands
                                                             them to local_replay_buffer.add() as it
                                                             would episodes; the buffer plans RLlib's
                                                             eviction, then ExperienceBuffer.commit()

The conversion is the driver path's own (``columns.episode_columns``), run in the worker;
the writer validates and encodes with the buffer's spec there. The driver's ingestion
(``episode_ingest``) runs the same plan on ``WrittenChunk``s as on episodes (ids, lengths,
done flags, infos, lookback rows), so eviction and n-step windows across chunks are those
of the driver path, and the stored rows and samples are the same.

The first training step goes through the driver (the buffer's spec comes from the first
chunk); ``ConduitDQN`` then hands each remote env runner a writer (``push_writers``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

from conduit_core.errors import StagedRowsLost
from conduit_core.source.source_writer import Receipt

from .columns import chunk_lookback_row, episode_columns, episode_infos


@dataclass(frozen=True)
class WrittenChunk:
    """An episode chunk an env runner wrote through its writer: its receipt and what the
    driver's ingestion reads of an episode (``id_``, ``is_done``, ``t_started``, length)."""

    receipt: Receipt
    id_: str
    is_done: bool
    t_started: int
    n: int
    infos: list | None = field(default=None, repr=False)     # the chunk's n + 1 infos (store_infos)
    lookback: dict | None = field(default=None, repr=False)  # columns.chunk_lookback_row (t_started > 0)

    def __len__(self) -> int:
        return self.n

    def env_steps(self) -> int:      # what RLlib's sample loop counts on an episode
        return self.n

    def agent_steps(self) -> int:
        return self.n


def write_chunks(writer, episodes, *, store_infos: bool) -> list[WrittenChunk]:
    """Write each non-empty chunk of ``episodes`` (in order) through ``writer``."""
    out = []
    for ep in episodes:
        n = len(ep)
        if n == 0:
            continue
        receipt = writer.write(episode_columns(ep))
        out.append(WrittenChunk(receipt=receipt, id_=ep.id_, is_done=bool(ep.is_done), t_started=int(ep.t_started),
                                n=n, infos=episode_infos(ep, n) if store_infos else None,
                                lookback=chunk_lookback_row(ep) if ep.t_started > 0 else None))
    return out


def abandon_gaps(buffer, written) -> int:
    """Receipts of these chunks' writers that never reached the driver are abandoned
    (``ExperienceBuffer.abandon_before`` below each writer's lowest ticket here): a runner's
    ``sample()`` results come one at a time, so a ticket missing below one that arrived is a
    result RLlib dropped (a sample that outlived ``sample_timeout_s``). Returns how many."""
    lowest: dict[str, Receipt] = {}
    for c in written:
        r = c.receipt
        if r.writer not in lowest or r.ticket < lowest[r.writer].ticket:
            lowest[r.writer] = r
    return sum(buffer.abandon_before(r) for r in lowest.values())


def chunk_infos(ep, n: int) -> list:
    """The chunk's infos: shipped with a written chunk, read from an episode."""
    written = getattr(ep, "receipt", None) is not None
    return ep.infos if written else episode_infos(ep, n)


def chunk_lookback(ep) -> dict | None:
    written = getattr(ep, "receipt", None) is not None
    return ep.lookback if written else chunk_lookback_row(ep)


class ConduitEnvRunner(SingleAgentEnvRunner):
    """RLlib's single-agent env runner; once the driver hands it a writer
    (``set_conduit_writer``), ``sample()`` writes the episodes it sampled and returns
    ``WrittenChunk``s in their place (RLlib's sampling, metrics and counters unchanged)."""

    conduit_writer = None
    conduit_store_infos = True

    def set_conduit_writer(self, writers: dict[int, Any], store_infos: bool) -> str:
        """Take this runner's writer from ``writers`` (by worker index); returns its id."""
        self.conduit_writer = writers[self.worker_index]
        self.conduit_store_infos = bool(store_infos)
        return self.conduit_writer.id

    def sample(self, **kwargs):
        episodes = super().sample(**kwargs)
        if self.conduit_writer is None:
            return episodes
        try:
            return write_chunks(self.conduit_writer, episodes, store_infos=self.conduit_store_infos)
        except StagedRowsLost as lost:
            # The shard this runner stages in is lost (its actor died, its node left): the episodes
            # go to the driver as RLlib's (nothing lost, nothing staged twice: every chunk of this
            # sample travels as an episode), and the driver hands out a writer for the shard that
            # replaces it (it counts a sample without receipts as a runner without a writer)
            import logging
            logging.getLogger("conduit").warning("conduit_rllib: env runner %s: %s; sending its episodes to the "
                                                 "driver until it gets a new writer", self.worker_index, lost)
            self.conduit_writer = None
            return episodes


def push_writers(algo, buf, *, retiring=()) -> dict[int, Any]:
    """Hand each healthy remote env runner a writer for the buffer's shard on its node;
    returns worker index -> writer. The writer's source is the worker index (the receipts'
    source is replaced by the episode's own at commit). The writers in ``retiring`` (those
    replaced) are retired once every runner has its new one: a runner's ``sample()`` that was
    running finished before its writer was swapped (an actor runs one call at a time), and what
    such a sample staged, RLlib having dropped its result, is freed (``retire_writer``)."""
    import ray
    group = algo.env_runner_group
    nodes = dict(group.foreach_env_runner(
        lambda w: (w.worker_index, ray.get_runtime_context().get_node_id()), local_env_runner=False))
    core = buf.edp.buffer
    writers = {i: core.writer(source=i, node=node) for i, node in nodes.items()}
    store = buf.options.store_infos
    ids = dict(group.foreach_env_runner(lambda w: (w.worker_index, w.set_conduit_writer(writers, store)),
                                        local_env_runner=False))
    for old in retiring:
        core.retire_writer(old)
    return {i: writers[i] for i in ids}
