"""A CartPole PPO experiment for SRL, registered through ``rlsrl.api.config.register_experiment``.

The layout is SRL's ``atari-mini`` (``rlsrl/legacy/experiments/atari_benchmark.py``) scaled down to
2 CPU cores: ``actors`` actor workers x ``envs_per_actor`` CartPole environments in a ring, one
policy worker, one trainer worker running MAPPO (``mappo``) on an ``actor-critic`` MLP policy (no
CNN, no RNN), a master worker for name resolution, every worker on ``cpu``. Samples are
``sample_steps`` steps (+1 bootstrap step), time-major ``[T, ...]``.

``buffer_zero_copy`` is False by default, so the trainer's own buffer (``buffer_name`` /
``buffer_args``, built by ``rlsrl.base.buffer.make_buffer`` in the trainer worker) receives every
sample: that is the stage Conduit replaces. (With ``buffer_zero_copy=True`` SRL moves batching
into the shared-memory stream and the trainer's buffer becomes ``simple_queue(max_size=100)``.)

SRL builds experiments with ``cls()`` (``rlsrl/api/config.py:587``): :func:`register` binds the
parameters with ``functools.partial``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Optional

import rlsrl.api.config as cfg

from . import env as cartpole_env

STREAMS = ("shm", "zmq")
CONSUMERS = ("srl", "conduit")


@dataclasses.dataclass
class CartPolePPOExperiment(cfg.Experiment):
    seed: int = 0
    stream: str = "shm"              # "shm": SRL's shared-memory streams; "zmq": NAME streams over ZMQ
    actors: int = 1                  # shared-memory streams race with > 1 actor (scripts/srl/README.md)
    envs_per_actor: int = 16
    inference_splits: int = 4
    policy_workers: int = 1
    sample_steps: int = 50
    buffer_name: str = "priority_queue"
    buffer_args: Dict[str, Any] = dataclasses.field(
        default_factory=lambda: dict(batch_size=16, reuses=1, max_size=32))
    buffer_zero_copy: bool = False
    sample_stream_qsize: int = 1024
    device: str = "cpu"
    port: int = 51234                # the master worker's name-resolve server
    hidden_dim: int = 64
    num_dense_layers: int = 2
    lr: float = 5e-4
    entropy_bonus_weight: float = 0.01
    returns_dir: Optional[str] = None  # else $CONDUIT_SRL_RETURNS_DIR (env.py)
    log_frequency_seconds: int = 5
    consumer: str = "srl"            # "srl": SRL's own consumer for the stream; "conduit": conduit_srl.sample_consumer
    g_ing: int = 1                   # Conduit's consumer: samples per buffer call
    shm_order: str = "fresh"         # Conduit's consumer on shared memory: "fresh" (SRL's) or "old"
    consumer_stats_path: Optional[str] = None   # Conduit's consumer writes its counters there ({pid})

    def __post_init__(self):
        if self.stream not in STREAMS:
            raise ValueError(f"stream must be one of {STREAMS}, got {self.stream!r}")
        if self.consumer not in CONSUMERS:
            raise ValueError(f"consumer must be one of {CONSUMERS}, got {self.consumer!r}")

    def make_envs(self, aw_rank: int):
        env_name = cartpole_env.register()
        return [cfg.Environment(type_=env_name,
                                args=dict(seed=self.seed + 12345 * x + aw_rank * self.envs_per_actor,
                                          returns_dir=self.returns_dir))
                for x in range(self.envs_per_actor)]

    def initial_setup(self) -> cfg.ExperimentConfig:
        policy_name = "default"
        policy = cfg.Policy(type_="actor-critic", args=dict(
            obs_dim={"obs": 4},
            action_dim=2,
            hidden_dim=self.hidden_dim,
            num_dense_layers=self.num_dense_layers,
            num_rnn_layers=0,
            rnn_type="lstm",
            popart=True,
            layernorm=False,
            shared_backbone=True,
            chunk_len=10,
            seed=self.seed,
        ))
        trainer = cfg.Trainer(type_="mappo", args=dict(
            discount_rate=0.99,
            gae_lambda=0.97,
            eps_clip=0.2,
            clip_value=True,
            dual_clip=False,
            vtrace=False,
            value_loss="huber",
            value_loss_weight=1.0,
            value_loss_config=dict(delta=10.0),
            entropy_bonus_weight=self.entropy_bonus_weight,
            optimizer="adam",
            optimizer_config=dict(lr=self.lr),
            popart=True,
            max_grad_norm=40.0,
            bootstrap_steps=1,
            recompute_adv_among_epochs=False,
            recompute_adv_on_reuse=False,
            burn_in_steps=0,
        ))
        agent_specs = [cfg.AgentSpec(index_regex=".*", inference_stream_idx=0, sample_stream_idx=0,
                                     send_full_trajectory=False, send_after_done=False,
                                     sample_steps=self.sample_steps, bootstrap_steps=1)]
        if self.stream == "shm":
            sample_stream = cfg.SampleStream(type_=cfg.SampleStream.Type.SHARED_MEMORY, stream_name=policy_name,
                                             plugin=cfg.SharedMemorySampleStreamPlugin(qsize=self.sample_stream_qsize))
            inference_stream = cfg.InferenceStream(type_=cfg.InferenceStream.Type.SHARED_MEMORY,
                                                   stream_name=policy_name)
        else:
            sample_stream = cfg.SampleStream(type_=cfg.SampleStream.Type.NAME, stream_name=policy_name)
            inference_stream = cfg.InferenceStream(type_=cfg.InferenceStream.Type.NAME, stream_name=policy_name)

        actors = [cfg.ActorWorker(env=self.make_envs(i), inference_streams=[inference_stream],
                                  sample_streams=[sample_stream], agent_specs=agent_specs, max_num_steps=20000,
                                  inference_splits=self.inference_splits, ring_size=self.envs_per_actor)
                  for i in range(self.actors)]
        policies = [cfg.PolicyWorker(policy_name=policy_name, inference_stream=inference_stream, policy=policy,
                                     worker_info=cfg.WorkerInformation(device=self.device))
                    for _ in range(self.policy_workers)]
        # the trainer's end of the stream: SRL's consumer (built by make_consumer from the SampleStream) or
        # Conduit's, wrapping the same SampleStream object the actors hold (conduit_srl.consumer)
        trainer_stream = sample_stream
        if self.consumer == "conduit":
            import conduit_srl
            trainer_stream = conduit_srl.sample_consumer(sample_stream, g_ing=self.g_ing, shm_order=self.shm_order,
                                                         stats_path=self.consumer_stats_path)
        trainers = [cfg.TrainerWorker(
            buffer_name=self.buffer_name,
            buffer_zero_copy=self.buffer_zero_copy,
            buffer_args=dict(self.buffer_args),
            policy_name=policy_name,
            trainer=trainer,
            policy=policy,
            log_frequency_seconds=self.log_frequency_seconds,
            sample_stream=trainer_stream,
            worker_info=cfg.WorkerInformation(wandb_job_type="tw", wandb_group="cartpole",
                                              wandb_project="conduit-srl", wandb_name=f"seed{self.seed}",
                                              log_terminal=True, device=self.device),
        )]
        return cfg.ExperimentConfig(actors=actors, policies=policies, trainers=trainers,
                                    master_worker=[cfg.MasterWorker(address="localhost", port=self.port)])


def register(name: str, **params) -> str:
    """Register ``name`` in SRL's experiment registry with these parameters (once per process)."""
    if name not in cfg.ALL_EXPERIMENT_CLASSES:
        CartPolePPOExperiment(**params)  # validate here, not in SRL's launcher
        cfg.register_experiment(name, functools.partial(CartPolePPOExperiment, **params))
    return name
