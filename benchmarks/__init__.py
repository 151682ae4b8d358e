"""Conduit's lab: each workload measured against its unmodified framework or peer, in one run.

A bed per concern; ``conduit bench WORKLOAD`` runs the workloads with an entry point
(pyproject.toml), ``python -m benchmarks.BED.MODULE`` (from a checkout's root; installed as
``conduit_benchmarks``) runs any of them. docs/benchmarks.md gives each current result with its command.

- ``buffer``: the buffer alone against RLlib's, TorchRL's and a numpy ring; Atari gathers and
  decodes; memory; per-call cost against another checkout; GPU tiers.
- ``rllib``: RLlib's DQN and PPO unmodified vs with Conduit; several learners; Conduit's share
  of a step; ingestion; fidelity; the cost model on RLlib.
- ``srl``: SRL's buffers vs Conduit's inside SRL's trainer worker, and SRL's PPO end to end.
- ``verl``: GRPO's post-generation path and TransferQueue backends; verl's own trainers on CPU,
  synchronous and fully asynchronous.
- ``sb3``: Stable-Baselines3's DQN with its own buffer vs the worked example adapter's.
- ``plane``: the data plane's scheduling, placement, migration, remote shards, ingestion at the
  source and the auto-tuner.
- ``suite``: the conformance suite's own statistics (the convergence check's false alarms and power).
- ``common``: timing, medians, paired ratios, tables and reports shared by all.
"""
