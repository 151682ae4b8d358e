"""PPO through Conduit: the learner connector's output is ingested once, tagged with the
policy version, and delivered as minibatches.

Stage map for PPO (per ``learner_group.update``):

    RLlib learner connector (AddOneTs..., GAE with the value forward pass)  -> ingestion transform
    write the train batch's columns once, policy_version = weights seq no   -> ingestion
    take exactly that version's rows, once                                  -> delivery (isolation)
    epochs x minibatches: one permutation per epoch, index_select per column -> delivery

RLlib's ``MiniBatchCyclicIterator`` slices and concatenates ``SampleBatch`` objects per
minibatch; here each minibatch is one ``index_select`` per column on tensors that
already live on the learner's device. The order follows RLlib's: the first epoch in
batch order, each later epoch a fresh permutation, minibatches running across epoch
boundaries until every row was seen ``num_epochs`` times.

Each trained module's rows go through a FIFO plane of their own (one module single-agent, one per
trained module multi-agent). With ``num_learners >= 1`` each learner is its own process with its own planes: RLlib
shards the episodes across learners, each learner's connector output is ingested and
delivered where it is trained on, and with several learners RLlib's ``num_total_minibatches``
(every learner makes the same number of updates, as data-parallel gradients need) sets the
count of minibatches, as in RLlib's own iterator.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from conduit_core import ConfigError, ExperienceBuffer, ExperienceDataPlane, ExperienceSpec, FieldSpec, Fifo, Schedule

from .options import ConduitOptions


def minibatch_count(rows: list[int], *, num_epochs: int, minibatch_size: int, num_total_minibatches: int = 0) -> int:
    """How many minibatches RLlib's ``MiniBatchCyclicIterator`` yields for modules holding ``rows``
    rows each: ``num_total_minibatches`` where given (several learners), else until every module
    has cycled through its batch ``num_epochs`` times (a module wraps when a minibatch reaches its
    end, so after k minibatches it has covered floor(k * minibatch_size / rows) epochs)."""
    if num_total_minibatches:
        return num_total_minibatches
    return max(math.ceil(num_epochs * n / minibatch_size) for n in rows)


def minibatch_order(n: int, *, num_epochs: int, minibatch_size: int, shuffle: bool,
                    rng: np.random.Generator, num_total_minibatches: int = 0, count: int | None = None) -> np.ndarray:
    """The row index of every minibatch slot of one module, RLlib's cyclic order (see module
    docstring). ``num_total_minibatches`` (RLlib passes it with several learners, so that every
    learner makes the same number of updates): that many minibatches, cycling on through the
    batch, in place of ``num_epochs`` passes. ``count``: that many minibatches (a multi-agent
    batch's, ``minibatch_count`` over its modules: a smaller module cycles on meanwhile)."""
    k = count if count is not None else minibatch_count([n], num_epochs=num_epochs, minibatch_size=minibatch_size,
                                                        num_total_minibatches=num_total_minibatches)
    total = k * minibatch_size
    epochs = math.ceil(total / n)
    order = [np.arange(n)]
    for _ in range(1, epochs):
        order.append(rng.permutation(n) if shuffle else np.arange(n))
    return np.concatenate(order)[:total].reshape(k, minibatch_size)


class ConduitMinibatches:
    """Iterates the learner's minibatches from the delivered Batches (tensors on device): each
    one a ``MultiAgentBatch`` of every module's rows at its order's next row (``parts``: module
    id -> (columns, order), every order of the same number of minibatches), as RLlib's iterator
    yields them."""

    def __init__(self, parts: dict[str, tuple[dict[str, torch.Tensor], np.ndarray]], *, env_steps: int):
        self.parts, self.env_steps = parts, env_steps
        counts = {order.shape[0] for _, order in parts.values()}
        if len(counts) != 1:
            raise ValueError(f"conduit: the modules' minibatch counts differ ({sorted(counts)}); one count for all")
        self._count = counts.pop()

    def __len__(self) -> int:
        return self._count

    def __iter__(self):
        indices = {}
        for mid, (columns, order) in self.parts.items():
            device = next(iter(columns.values())).device
            indices[mid] = torch.from_numpy(order).to(device)
        for i in range(self._count):
            yield MultiAgentBatch({mid: SampleBatch({k: torch.index_select(v, 0, indices[mid][i])
                                                     for k, v in columns.items()})
                                   for mid, (columns, _) in self.parts.items()}, self.env_steps)


def _spec_of(columns: dict[str, torch.Tensor]) -> ExperienceSpec:
    bad = [k for k in columns if not k.isidentifier() or k.startswith("_")]
    if bad:
        raise ConfigError("train batch column", "a Python identifier not starting with '_'", repr(bad[0]),
                          "rename the column in your connector piece")
    return ExperienceSpec([FieldSpec(k, tuple(v.shape[1:]), v.dtype) for k, v in columns.items()])


class OnPolicyPath:
    """Ingestion and delivery of on-policy train batches through a FIFO data plane.

    ``ingest(columns, version)`` writes a train batch once, tagged with the policy
    version; ``deliver(version)`` takes exactly that version's rows, once. The plane is
    (re)built when the batch's columns change or outgrow it (it is empty between updates).
    """

    def __init__(self, *, tier: str = "pageable", device=None, schedule: Schedule | None = None):
        self.tier, self.device = tier, device
        self.schedule = schedule or Schedule.sequential()
        self.edp: ExperienceDataPlane | None = None

    def _plane(self, spec: ExperienceSpec, n: int) -> ExperienceDataPlane:
        edp = self.edp
        if edp is None or edp.buffer.spec != spec or edp.buffer.capacity < n:
            if edp is not None:
                edp.close()
            buf = ExperienceBuffer(spec=spec, capacity=max(2 * n, 1024), selector=Fifo(), tier=self.tier)
            edp = self.edp = ExperienceDataPlane(buffer=buf, schedule=self.schedule, device=self.device)
        return edp

    def ingest(self, columns: dict, *, policy_version: int, source: int = 0) -> None:
        n = next(iter(columns.values())).shape[0]
        self._plane(_spec_of(columns), n).ingest(columns, policy_version=policy_version, source=source)

    def deliver(self, *, policy_version: int):
        if self.edp is None:
            raise ConfigError("deliver()", "an ingest() first", "no data", "ingest the train batch before delivering")
        return self.edp.deliver(None, policy_version=policy_version)

    def close(self) -> None:
        if self.edp is not None:
            self.edp.close()


class ConduitPPOTorchLearner(PPOTorchLearner):
    """RLlib's PPOTorchLearner; only the train-batch -> minibatch path goes through Conduit: each
    module's rows (one module single-agent; every trained module of a multi-agent config, shared
    or separate policies) through a FIFO data plane of its own (``conduit_paths``)."""

    def build(self) -> None:
        super().build()
        opts = ConduitOptions.from_kwargs(dict(self.config.learner_config_dict.get("conduit", {})))
        self._conduit_opts = opts
        self.conduit_paths: dict[str, OnPolicyPath] = {}   # module id -> its on-policy data plane
        seed = opts.seed if opts.seed is not None else (self.config.seed or 0)
        self._conduit_rng = np.random.default_rng(seed)

    def shutdown(self) -> None:
        """RLlib's shutdown (the learner group's, at ``algo.stop()``), then every module's plane
        closed: its threads and memory returned."""
        try:
            super().shutdown()
        finally:
            for path in self.conduit_paths.values():
                path.close()

    def _path(self, module_id: str) -> OnPolicyPath:
        path = self.conduit_paths.get(module_id)
        if path is None:
            path = self.conduit_paths[module_id] = OnPolicyPath(tier=self._conduit_opts.tier, device=self._device)
        return path

    def _create_iterator_if_necessary(self, *, training_data, num_total_minibatches: int = 0, num_epochs: int = 1,
                                      minibatch_size=None, shuffle_batch_per_epoch: bool = False, **kwargs):
        def rllibs_own():
            return super(ConduitPPOTorchLearner, self)._create_iterator_if_necessary(
                training_data=training_data, num_total_minibatches=num_total_minibatches, num_epochs=num_epochs,
                minibatch_size=minibatch_size, shuffle_batch_per_epoch=shuffle_batch_per_epoch, **kwargs)
        if training_data.episodes is None or training_data.data_iterators or not minibatch_size:
            return rllibs_own()
        # Ingestion transform: RLlib's own learner connector (GAE etc.), unchanged.
        batch = self._make_batch_if_necessary(training_data=training_data)
        for mid in list(batch.policy_batches):
            if not self.should_module_be_updated(mid, batch):
                del batch.policy_batches[mid]
        if not batch.policy_batches:   # no module to train this update: RLlib's own route, as without Conduit
            return rllibs_own()
        modules = {}
        for mid, mb in batch.policy_batches.items():
            n = len(mb)
            if n == 0:   # (RLlib's iterator refuses it too: it would cycle an empty batch forever)
                raise ValueError(f"The batch for module_id {mid} is empty! conduit: every trained module needs "
                                 "rows in each train batch (as RLlib's MiniBatchCyclicIterator requires)")
            columns = {k: v for k, v in mb.items() if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == n}
            skipped = sorted(set(mb.keys()) - set(columns))
            if skipped:
                raise ConfigError(f"train batch columns of module {mid!r}", "tensors with one row per timestep",
                                  skipped, "conduit_rllib's PPO path needs flat, non-recurrent batches")
            modules[mid] = (columns, n)
        # Ingestion: written once, tagged with the policy version that produced the data.
        version = int(self._weights_seq_no)
        for mid, (columns, _) in modules.items():
            self._path(mid).ingest(columns, policy_version=version)
        # Delivery: exactly this version's rows, consumed once, on the learner's device.
        count = minibatch_count([n for _, n in modules.values()], num_epochs=num_epochs,
                                minibatch_size=int(minibatch_size), num_total_minibatches=int(num_total_minibatches or 0))
        parts = {}
        for mid, (_, n) in modules.items():
            delivered = self._path(mid).deliver(policy_version=version)
            if delivered.size != n:
                raise RuntimeError(f"conduit: delivered {delivered.size} rows of module {mid!r}, version {version}; "
                                   f"ingested {n}")
            parts[mid] = (dict(delivered), minibatch_order(
                n, num_epochs=num_epochs, minibatch_size=int(minibatch_size),
                shuffle=shuffle_batch_per_epoch and num_epochs > 1, rng=self._conduit_rng, count=count))
        self.conduit_minibatches = ({mid: n for mid, (_, n) in modules.items()}, count)   # (rows, minibatches) of the last update
        for mid in modules:   # each module's plane's counters in RLlib's result: result["learners"][mid]["conduit"]
            self.metrics.log_dict(self._path(mid).edp.metrics().scalars(), key=(mid, "conduit"), reduce="mean",
                                  window=1)
        return ConduitMinibatches(parts, env_steps=batch.env_steps())


def enable_ppo(config, opts: ConduitOptions):
    from .algorithms import ConduitPPO
    if config.framework_str != "torch":
        raise ConfigError("framework", "'torch'", repr(config.framework_str), "call config.framework('torch')")
    from ray.rllib.algorithms.ppo import PPO

    from .opt_in import own_class
    check_ppo_options(opts)
    learner_cls = own_class(config.learner_class, PPOTorchLearner, ConduitPPOTorchLearner, "learner_class",
                            "config.learners(learner_class=...)")
    algo_cls = own_class(config.algo_class, PPO, ConduitPPO, "algo_class", "the config's algo_class")
    lcd = dict(config.learner_config_dict or {})
    lcd["conduit"] = opts.to_dict()
    config.learners(learner_class=learner_cls, learner_config_dict=lcd)
    config.algo_class = algo_cls
    return config


#: the options PPO's path reads (``ConduitPPOTorchLearner.build``); every other one must keep its default
PPO_OPTIONS = ("tier", "seed")


def check_ppo_options(opts: ConduitOptions) -> None:
    """PPO's on-policy path writes each train batch once and hands it to the minibatches in the
    learner's own thread: the schedule, codec, delivery and replay options have nothing to act
    on. One set to other than its default is refused, not silently ignored."""
    default = ConduitOptions()
    for f in dataclasses.fields(ConduitOptions):
        if f.name not in PPO_OPTIONS and getattr(opts, f.name) != getattr(default, f.name):
            raise ConfigError(f"conduit_rllib.enable({f.name}=...)", f"{getattr(default, f.name)!r} (its default) "
                              f"for PPO, which reads only {', '.join(PPO_OPTIONS)}", repr(getattr(opts, f.name)),
                              f"drop {f.name}= for PPO (it applies to DQN's replay buffer)")
