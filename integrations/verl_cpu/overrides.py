"""The environment and Hydra overrides that make `python -m verl.trainer.main_ppo` run GRPO on CPU.

Each entry says why it is there (verl 0.9.1, paths under verl/). Extra overrides given to run.py are
appended after these, so Hydra lets them win (e.g. `transfer_queue.backend.storage_backend=<name>`,
`trainer.v1.trainer_mode=<mode>`, `trainer.use_v1=False`).
"""

from __future__ import annotations

import os

from integrations.verl_cpu.assets import Assets

PLUGIN_MODULE = "integrations.verl_cpu.plugin"


def environment() -> dict[str, str]:
    return {
        # verl/__init__.py:49 imports it in every process: CPU platform + "hf" rollout.
        "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE,
        # platform_manager.py:95: pick the "cpu" platform in processes that ask before the plugin runs.
        "VERL_PLATFORM": "cpu",
        # FSDP engines are registered for cuda/npu only (workers/engine/fsdp/transformer_impl.py:1143,
        # "No engine registered for device='cpu'"); base.py:405 lets this pick the (device-agnostic) class.
        "VERL_ENGINE_DEVICE": "cuda",
        # Hub look-ups fail at once instead of retrying for ~46 s; no hub is reachable.
        "HF_HUB_OFFLINE": "1",
        "RAY_AUTH_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
    }


SAMPLER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ordered_sampler.py")


def hydra_overrides(assets: Assets, *, run_dir: str, seed: int, steps: int) -> list[str]:
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        # data: 4 prompts per step, prompts <= 32 tokens (ChatML framing is 19), responses <= 16
        f"data.train_files={assets.train_files}",
        f"data.val_files={assets.val_files}",
        "data.train_batch_size=4",
        "data.max_prompt_length=32",
        "data.max_response_length=16",
        "data.filter_overlong_prompts=True",
        "data.dataloader_num_workers=0",
        f"data.seed={seed}",
        # model: the tiny random Qwen2; no flash-attn on CPU (workers/config/model.py:185 defaults to
        # flash_attention_2), no fused/rmpad kernels, nothing compiled.
        f"actor_rollout_ref.model.path={assets.model_dir}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        # actor: FSDP1 wants device params (sync_module_states=True, transformer_impl.py:444); FSDP2 runs
        # on CPU with gloo. Compute in fp32 (FSDP's mixed precision defaults to bf16 params,
        # transformer_impl.py:393): bf16 rounding turns any change of summation order into a 1e-4
        # difference in loss and grad norm between same-seed runs, and bf16 matmuls are slow on CPU.
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "actor_rollout_ref.actor.fsdp_config.full_determinism=True",
        f"actor_rollout_ref.actor.fsdp_config.seed={seed}",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.actor.use_kl_loss=False",
        # two optimizer steps per iteration: the second mini-batch is off-policy, so its loss is not the
        # trivial on-policy GRPO value (-mean advantage, ~0 when all responses have the same length)
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        # rollout: the CPU server in hf_rollout.py, n=2 per prompt, seeded per request.
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.full_determinism=True",
        f"actor_rollout_ref.rollout.seed={seed}",
        # one agent-loop worker and one reward worker (each default is 8 Ray actors)
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={assets.reward_path}",
        "reward.custom_reward_function.name=compute_score",
        # trainer: CPU, one fake GPU slot, `steps` iterations, no validation or checkpoints.
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=[console,file]",
        # rows of a batch in content order, not arrival order: same-seed runs equal to the bit
        # (ordered_sampler.py). Pass `trainer.v1.sampler.custom_sampler.path=null` to use verl's own.
        f"trainer.v1.sampler.custom_sampler.path={SAMPLER_PATH}",
        "trainer.v1.sampler.custom_sampler.name=content_ordered_replay_buffer",
        "trainer.project_name=conduit_verl_cpu",
        f"trainer.experiment_name=seed{seed}",
        f"trainer.default_local_dir={run_dir}/checkpoints",
        # Ray: worker groups demand accelerator slots (single_controller/ray/base.py:148,210,241,
        # "Total available GPUs 0 ..."): fake one. TransferQueue's controller and each storage unit
        # hold a CPU and verl defaults to 8 units: with fewer CPUs `pg.ready()` hangs forever.
        "+ray_kwargs.ray_init.num_gpus=1",
        "ray_kwargs.ray_init.num_cpus=6",
        "+ray_kwargs.ray_init.object_store_memory=1000000000",
        f"+ray_kwargs.ray_init._temp_dir={run_dir}/ray",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]


# verl's disaggregated trainers (experimental/one_step_off_policy, experimental/fully_async_policy): the
# module each runs as, and what each needs on top of hydra_overrides().
TRAINER_MODULES = {
    "main_ppo": "verl.trainer.main_ppo",
    "one_step_off": "verl.experimental.one_step_off_policy.main_ppo",
    "fully_async": "verl.experimental.fully_async_policy.fully_async_main",
}


def async_overrides(trainer: str, *, steps: int, staleness: int = 0, trigger: int = 1) -> list[str]:
    """Overrides for a disaggregated trainer: the trainer and the rollout each get a pool of one (fake)
    GPU slot, weights move through the CPU checkpoint engine (object_store_engine.py), and the
    fully-async trainer takes one mini-batch of prompts per step (``staleness``, ``trigger``: its
    `async_training.staleness_threshold` and `trigger_parameter_sync_step`)."""
    if trainer not in TRAINER_MODULES:
        raise ValueError(f"trainer: expected one of {sorted(TRAINER_MODULES)}, got {trainer!r}")
    if trainer == "main_ppo":
        return []
    out = [
        # the trainer and the rollout in pools of their own (fully_async_trainer.py:76 asserts it)
        "actor_rollout_ref.hybrid_engine=False",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=ray_object_store",
        f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={__package__}.object_store_engine",
        # two pools of one fake GPU slot each (single_controller/ray/base.py counts "GPU" resources);
        # the fully-async trainer and rollouter actors each ask Ray for 10 CPUs and its MessageQueue for
        # 2 (fully_async_trainer.py:53, fully_async_rollouter.py:329, message_queue.py:26): logical CPUs,
        # not cores; with fewer the trainer actor is never scheduled and the run waits forever
        "++ray_kwargs.ray_init.num_gpus=2",
        "ray_kwargs.ray_init.num_cpus=32",
    ]
    if trainer == "one_step_off":
        # its config's search path is `file://verl/trainer/config` (one_step_off_ppo_trainer.yaml), relative
        # to the working directory: found only from a verl source checkout ("Could not load 'ppo_trainer'")
        out += ["hydra.searchpath=[pkg://verl.trainer.config]"]
    if trainer == "fully_async":
        out += [
            f"async_training.staleness_threshold={staleness}",
            f"async_training.trigger_parameter_sync_step={trigger}",
            "async_training.require_batches=1",
            "async_training.partial_rollout=False",
            "async_training.concurrent_samples_per_replica=4",
            # the rollouter feeds one prompt at a time (fully_async_rollouter.py:351-352 assert both)
            "data.train_batch_size=0",
            "data.gen_batch_size=1",
            "rollout.n=2",
            # prompts the rollouter generates: one mini-batch (2 prompts) per trainer step
            f"rollout.total_rollout_steps={2 * steps * trigger}",
        ]
    return out
