"""Real SRL (openpsi-projects/srl at b3b01ea) training CartPole with PPO through SRL's own launcher, on CPU,
with SRL's buffer or Conduit's, and SRL's sample consumer or Conduit's (``conduit_srl``). SRL is imported and called, never copied: the environment
and the experiment go through SRL's registries, the CPU shims patch SRL's names from outside its tree.

    PYTHONPATH=.:adapters /work/srl-venv/bin/python -m integrations.srl_cartpole.run --buffer conduit --seconds 90
    ... run --buffer conduit --consumer conduit --g-ing 16 --stream zmq|shm [--zero-copy]

Modules: ``env`` (CartPole-v1 as an SRL environment, episode returns logged per process), ``cpu`` (shims
for a machine without CUDA), ``experiment`` (a scaled-down atari-mini layout), ``timing`` (the buffer
timing proxy), ``run`` (launch, stop, summarize). ``benchmarks/srl/ppo.py`` runs both buffer arms;
``compare_consumers`` SRL's consumer and buffer vs Conduit's consumer (g_ing 1 and 16) on both streams;
``consumer_cost`` the consumer's cost per sample on the trainer's thread with the actors out of the way.
"""
