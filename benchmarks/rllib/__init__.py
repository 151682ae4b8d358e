"""RLlib unmodified vs RLlib with Conduit: ``bench`` (``conduit bench rllib-dqn | rllib-ppo |
rllib-dqn-mountaincar | rllib-sac | rllib-sac-metaworld | rllib-ppo-multi-agent | rllib-dqn-atari``),
``learners`` (``num_learners`` 0, 1, 2), with the same ``timing`` wrappers around both arms;
``offline`` (``conduit bench rllib-bc``: BC's offline pre-learner with either buffer),
``conduit_path`` (Conduit's share of a DQN step, call by call), ``add`` (ingestion per env-runner
hand-over), ``fidelity`` (what each buffer delivers on the same episodes) and ``tune`` (``conduit
tune rllib-dqn``: the cost model on RLlib's DQN)."""
