"""verl's own GRPO trainer (`python -m verl.trainer.main_ppo`), end to end on a CPU-only machine.

Nothing in verl or TransferQueue is edited. Every workaround is loaded into each process of the run
(driver, TaskRunner, workers, rollout server) through verl's own hook: `import verl` imports the
modules named in `VERL_USE_EXTERNAL_MODULES` (verl/__init__.py:49-52), and `run.py` sets it to
`integrations.verl_cpu.plugin`.

    run.py ──builds──> assets.py (tiny Qwen2, byte-level tokenizer, parquet) + reward.py
       │
       └─launches──> python -m verl.trainer.main_ppo <overrides>
                        every process: import verl -> plugin.py -> cpu_platform.py (CPU platform, gloo)
                                                              └-> hf_rollout.py (rollout "hf")

Modules: `cpu_platform` (CPU platform for verl's platform layer), `hf_rollout` (a CPU rollout server
plus the adapter the actor worker uses to push weights), `assets` (model, tokenizer, dataset),
`reward` (arithmetic partial-credit score), `ordered_sampler` (verl's replay buffer, rows in content order),
`overrides` (the Hydra overrides, each with its reason),
`metrics` (verl's per-step metrics -> JSON lines), `run` (one command).
"""
