"""Stable-Baselines3 unmodified vs SB3 with the worked example adapter (``examples/conduit_sb3``):
``dqn`` (``conduit bench sb3-dqn``: DQN CartPole, both arms in turns, the experience path split into
add and sample)."""
