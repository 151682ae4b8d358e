"""SRL against Conduit, run in SRL's own venv (scripts/srl): ``buffers`` (the trainer worker's put
and get, same samples), ``get`` (the training thread's get while the main thread puts) and ``ppo``
(SRL's PPO end to end with either buffer)."""
