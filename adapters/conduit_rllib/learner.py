"""Delivery's last step on the learner: a DeliveredBatch becomes the learner's tensors.

``ConduitDQNTorchLearner``, ``ConduitSACTorchLearner`` and ``ConduitTQCTorchLearner`` are
RLlib's DQN, SAC and TQC learners with one change made in ``build()``
(``ConduitReplayLearner``): the learner connector pipeline is wrapped by
``ConduitLearnerConnector``, which turns a ``DeliveredBatch`` into ``{module_id: {column:
tensor}}`` on the learner's device (a rename and, on GPU, one non-blocking copy per column)
instead of re-batching B one-step episodes. Anything else (real episodes) still goes
through RLlib's own pipeline, unchanged. The losses are RLlib's: SAC's learner is a DQN
learner in RLlib, and both read the same train-batch columns.
"""

from __future__ import annotations

import torch
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.algorithms.sac.torch.sac_torch_learner import SACTorchLearner
from ray.rllib.algorithms.tqc.torch.tqc_torch_learner import TQCTorchLearner
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from conduit_core.errors import ConfigError
from conduit_core.schema.nested import unflatten

from .columns import EXTRA, RLLIB_COLUMNS
from .learner_batch import SampleBatchMaker
from .replay_buffer import DeliveredBatch


#: the floating dtypes RLlib's learner connector turns into float32 (``convert_to_torch_tensor``: every
#: floating tensor but float16); a float64 observation (Meta-World's) is stored as it came and
#: reaches the loss as RLlib hands it over
WIDENED = frozenset({torch.float64, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2,
                     torch.float8_e5m2fnuz, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2})
FIRST_SEQ_KEY = "conduit_first_seq"  # with several learners, each: seq of the first row of the part it trained on


class ConduitLearnerConnector(ConnectorV2):
    def __init__(self, *, inner: ConnectorV2, device, module_id: str = DEFAULT_MODULE_ID,
                 log_provenance: bool = True):
        super().__init__()
        self.inner = inner
        # several learners: each logs the first seq of the part it trained on (FIRST_SEQ_KEY); a
        # lone learner trains on the whole delivered batch, and RLlib's metrics logger is a cost per update
        self.log_provenance = log_provenance
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.module_id = module_id
        self._names: dict[tuple, tuple] = {}   # delivered keys -> RLlib's name of each (None: an extra output)

    def _names_of(self, keys: tuple) -> tuple:
        names = tuple(None if k.startswith(EXTRA) else RLLIB_COLUMNS.get(k, k) for k in keys)
        if len(self._names) < 8:   # (a learner sees one or two layouts)
            self._names[keys] = names
        return names

    def __call__(self, *, rl_module, batch, episodes, explore=None, shared_data=None, metrics=None, **kwargs):
        if episodes and isinstance(episodes[0], DeliveredBatch):
            if len(episodes) != 1:
                raise ValueError("ConduitLearnerConnector: expected one DeliveredBatch per learner and update, got "
                                 f"{len(episodes)}. Fix: call conduit_rllib.enable() after setting num_learners "
                                 "(the buffer delivers one part per learner)")
            delivered = episodes[0].batch
            if self.log_provenance and metrics is not None and delivered.size:  # provenance: which rows this learner trained on
                metrics.log_value((self.module_id, FIRST_SEQ_KEY), int(delivered.seqs[0]), reduce="min", window=1)
            dev = self.device
            weights = delivered.weights
            # a CPU learner's batch, delivered on the host: nothing to move (loops, not comprehensions:
            # each would be a frame on every update's path)
            stay = dev.type == "cpu" and (weights is None or weights.is_cpu)
            if stay:
                for v in delivered.values():
                    if not v.is_cpu:
                        stay = False
                        break
            if not stay and weights is not None:
                weights = weights.to(dev, non_blocking=True)
            keys = tuple(delivered)
            names = self._names.get(keys)
            if names is None:
                names = self._names_of(keys)
            if stay and None not in names:   # (the usual update: the columns renamed in one C call)
                cols, extras = dict(zip(names, delivered.values())), ()
            else:
                cols, extras = {}, []
                for (k, v), name in zip(delivered.items(), names):
                    if not stay and v.device != dev:
                        v = v.to(dev, non_blocking=True)
                    if name is None:
                        extras.append((k[len(EXTRA):], v.float() if v.dtype in WIDENED else v))
                    else:
                        cols[name] = v
            for name, v in cols.items():   # as RLlib's NumpyToTensor: float64 observations train as float32
                if v.dtype in WIDENED:
                    cols[name] = v.float()
            if extras:  # include_extra_model_outputs: each under its key, nesting rebuilt (AddColumnsFrom...)
                cols.update({k: v for k, v in unflatten(extras).items() if k not in cols})
            if weights is not None:
                cols["weights"] = weights
            else:
                cols["weights"] = torch.ones(delivered.size, dtype=torch.float32, device=dev)
            return {self.module_id: cols}
        return self.inner(rl_module=rl_module, batch=batch, episodes=episodes, explore=explore,
                          shared_data=shared_data, metrics=metrics, **kwargs)

    def get_state(self, *args, **kwargs):
        return self.inner.get_state(*args, **kwargs)

    def set_state(self, state):
        return self.inner.set_state(state)


class ConduitReplayLearner:
    """Mixed in before an RLlib replay learner (DQN's, SAC's): its connector hands a delivered
    batch over as it is, and its train batch for it is built as RLlib builds it, with copied
    ``SampleBatch`` es (``learner_batch.SampleBatchMaker``)."""

    def build(self) -> None:
        from .opt_in import check_learner_connector
        check_learner_connector(self.config)  # a piece added after enable() is refused here
        super().build()
        self._learner_connector = ConduitLearnerConnector(inner=self._learner_connector, device=self._device,
                                                          log_provenance=self.config.num_learners > 1)
        self._conduit_sample_batches = SampleBatchMaker(SampleBatch)

    def _make_batch_if_necessary(self, training_data):
        """RLlib's, for one delivered batch: the same connector call, the same ``MultiAgentBatch``
        (env steps = the batch's rows, as ``len`` of the one "episode"), its ``SampleBatch``
        copied where ``SampleBatchMaker`` can. Anything else: RLlib's own."""
        episodes = training_data.episodes
        connector = self._learner_connector
        if training_data.batch is not None or not episodes or len(episodes) != 1 \
                or type(episodes[0]) is not DeliveredBatch or type(connector) is not ConduitLearnerConnector:
            if episodes and not getattr(self, "_conduit_buffer_checked", False):
                self._conduit_buffer_checked = True
                self._check_conduit_buffer(episodes)
            return super()._make_batch_if_necessary(training_data)
        shared_data = {}
        cols = connector(rl_module=self.module, batch={}, episodes=episodes, shared_data=shared_data,
                         metrics=self.metrics)
        make = self._conduit_sample_batches.build
        return MultiAgentBatch({module_id: SampleBatch(module_data, _zero_padded=True)
                                if shared_data.get(f"_zero_padded_for_mid={module_id}") else make(module_data)
                                for module_id, module_data in cols.items()}, env_steps=len(episodes[0]))

    def _check_conduit_buffer(self, episodes) -> None:
        """Once, at the first update that is not a delivered batch: with column delivery and a
        stateless module Conduit's buffer hands over nothing else, so RLlib's episodes here mean
        the algorithm was built by RLlib's own class (``tune.Tuner("SAC", ...)``, ``SAC(config)``),
        which builds RLlib's buffer and ignores Conduit's options. Refused, not run half-way."""
        config = getattr(self, "config", None)   # (a learner built by hand in a test may have none)
        opts = (getattr(config, "replay_buffer_config", None) or {}).get("conduit") or {}
        if opts.get("delivery") != "columns":
            return
        module = self.module[DEFAULT_MODULE_ID] if DEFAULT_MODULE_ID in self.module else None
        if module is None or module.is_stateful():
            return
        algo = getattr(config, "algo_class", None)
        shown = getattr(algo, "__name__", "Conduit's algorithm class")
        raise ConfigError("the algorithm class", f"{shown} (conduit_rllib.enable() set it as the config's algo_class: "
                          "it builds Conduit's buffer)", f"RLlib's own class: the learner got RLlib's "
                          f"{type(episodes[0]).__name__}s, not Conduit's batches",
                          "build with config.build_algo(), or pass the class to Tune: "
                          "tune.Tuner(config.algo_class, param_space=config), not tune.Tuner(\"SAC\", ...)")


class ConduitDQNTorchLearner(ConduitReplayLearner, DQNTorchLearner):
    """RLlib's DQN learner with Conduit's delivered batches (``ConduitReplayLearner``)."""


class ConduitSACTorchLearner(ConduitReplayLearner, SACTorchLearner):
    """RLlib's SAC learner with Conduit's delivered batches (``ConduitReplayLearner``)."""


class ConduitTQCTorchLearner(ConduitReplayLearner, TQCTorchLearner):
    """RLlib's TQC learner with Conduit's delivered batches (``ConduitReplayLearner``)."""
