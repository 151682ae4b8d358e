"""SRL's two replay kinds, ``simple_replay_buffer`` and ``prioritized_replay_buffer``, on an
:class:`ExperienceBuffer` whose items are whole samples (chunks of ``sample_length`` steps).

The core buffer stores, draws (uniform without replacement, or stratified proportional) and keeps
the priorities; this class is SRL's ``Buffer`` interface over it: SRL's arguments and readiness
rule, SRL's initial priority from a sample's TD errors, ``update_priorities`` by the
``sampling_indices`` SRL passes back, replay counts, and SRL's ``ReplayEntry`` with its samples
rebuilt time-major ``[T, B, ...]``, a get's chunks in slot order as SRL's buffers hand them out.
``put`` runs on the trainer worker's main thread, ``get`` and ``update_priorities`` on its
training thread; SRL's own buffers have no lock, this one is thread-safe, and ``get`` never blocks.

Delivery (``conduit_core.plane.prepared_replay``): ``delivery`` is the core's ``Schedule`` (the
scheduler's choice; default sequential: every ``get`` draws, gathers and rebuilds on the training
thread, as before). ``Schedule.overlapped(delivery_granularity=g, depth=d)`` prepares SRL's batch
objects ahead in a worker thread, ``g`` per operator call, at most ``d`` ahead; a prepared batch is
handed out only while it is what a sequential ``get`` would return (no chunk put since its draw,
beyond ``delivery.staleness``; for prioritized replay no priority update since its draw), otherwise
discarded with its RNG draw undone. ``priority_lag`` > 0 lets a prioritized batch miss that many
updates: opt-in, it changes SRL's algorithm (update k no longer applies to draw k + 1).

A sample's ``None`` fields are stored as SRL's ``buffer[:, ptr] = x`` stores them: the slot keeps
what it held (the previous sample's values, zeros when never written); a field ``None`` in the first
sample has no storage here as in SRL's buffer, and values later samples give it are dropped, as
SRL drops them, with a warning (``stats()["unstored_values"]`` counts the samples).

Deliberate differences from SRL's replay buffers, each for correctness (and each shown by a test in
``tests/srl_venv/test_buffers_vs_srl.py``):

- SRL's prioritized buffer sums the priority mass over ``[0, total_chunks - 1)``
  (``SegmentTree.reduce`` excludes its end), so the chunk in the last filled slot is never drawn
  (while filling: the newest one). Here every stored chunk can be drawn, with probability
  exactly ``p_i^alpha / sum_j p_j^alpha``.
- SRL's uniform buffer with ``batch_length < sample_length`` sorts the flattened gather indices
  (``_slicing``), which mixes steps of different chunks into one column. That case is refused
  here (``ConfigError``) rather than reproduced.
- The uniform kind reports ``empty()`` until ``batch_size`` chunks are stored (SRL's would raise
  in ``np.random.choice`` without replacement); ``reuses`` (replay counts) skip chunks
  overwritten since their draw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import contextlib
import threading

import numpy as np
from numpy.typing import ArrayLike
import torch

from conduit_core.buffer.experience_buffer import ExperienceBuffer
from conduit_core.errors import ConfigError, SpecError
from conduit_core.plane.prepared_deliveries import DeliveryRequest
from conduit_core.plane.prepared_replay import PreparedReplay
from conduit_core.planning.schedule import Schedule
from conduit_core.selection.selectors import Prioritized, Uniform
from conduit_core.schema.spec import ExperienceSpec, FieldSpec

from . import left_out, samples
from .delivery_plan import check_delivery

if TYPE_CHECKING:
    from rlsrl.api.trainer import SampleBatch
    from rlsrl.base.buffer import ReplayEntry

REPLAY_KINDS = ("simple_replay_buffer", "prioritized_replay_buffer")


class ConduitReplayBuffer:
    """``simple_replay_buffer`` / ``prioritized_replay_buffer`` on an :class:`ExperienceBuffer` whose
    items are whole samples (chunks of ``sample_length`` steps)."""

    def __init__(self, kind: str = "simple_replay_buffer", *, max_size: int, batch_size: int,
                 warmup_transitions: int, seed: int = 0, sample_length: int | None = None,
                 batch_length: int | None = None, burn_in_steps: int = 0, alpha: float = 0.6, beta: float = 0.4,
                 beta_scheduler: Any = None, max_priority: float = 1.0, priority_interpolation_eta: float | None = None,
                 delivery: Schedule | None = None, priority_lag: int = 0):
        if kind not in REPLAY_KINDS:
            raise ConfigError("kind", f"one of {REPLAY_KINDS}", repr(kind), "use ConduitQueueBuffer for queue kinds")
        self._config = dict(kind=kind, max_size=max_size, batch_size=batch_size, warmup_transitions=warmup_transitions,
                            seed=seed, sample_length=sample_length, batch_length=batch_length,
                            burn_in_steps=burn_in_steps, alpha=alpha, beta=beta, beta_scheduler=beta_scheduler,
                            max_priority=max_priority, priority_interpolation_eta=priority_interpolation_eta,
                            delivery=delivery, priority_lag=priority_lag)
        for name, v in (("max_size", max_size), ("batch_size", batch_size)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"{kind}.{name}", "an integer >= 1", repr(v), f"pass SRL's {name}")
        self.kind, self.prioritized = kind, kind == "prioritized_replay_buffer"
        if self.prioritized:
            if sample_length is None:
                raise ConfigError(f"{kind}.sample_length", "the sample length T", None,
                                  "pass sample_length (SRL's prioritized buffer needs it too)")
            if alpha < 0:
                raise ConfigError(f"{kind}.alpha", "a number >= 0", alpha, "use alpha=0.6")
            if beta <= 0:
                raise ConfigError(f"{kind}.beta", "a number > 0", beta, "use beta=0.4")
            if beta_scheduler is not None and beta_scheduler.init_value != beta:
                raise ConfigError(f"{kind}.beta_scheduler.init_value", beta, beta_scheduler.init_value,
                                  "start the scheduler at beta")
            if batch_length not in (None, sample_length):   # (SRL's prioritized buffer takes no batch_length)
                raise ConfigError(f"{kind}.batch_length", f"None (it is sample_length={sample_length})", batch_length,
                                  "leave batch_length out: prioritized chunks are whole samples")
            batch_length = sample_length
        elif batch_size > max_size:   # it draws batch_size distinct samples of the max_size it keeps
            raise ConfigError(f"{kind}.batch_size", f"<= max_size={max_size}", batch_size,
                              "raise max_size or lower batch_size (SRL's buffer fails at its first get; this one "
                              "would report empty() forever)")
        if sample_length is not None and batch_length is not None and batch_length != sample_length:
            raise ConfigError(f"{kind}.batch_length", f"equal to sample_length={sample_length}", batch_length,
                              "leave batch_length out (Conduit does not cut samples into shorter chunks)")
        self._max_size, self._batch_size = int(max_size), int(batch_size)
        self._warmup, self._seed = int(warmup_transitions), int(seed)
        self._sample_length, self._batch_length = sample_length, batch_length
        self._burn_in, self._eta = int(burn_in_steps), priority_interpolation_eta
        self._alpha, self._beta, self._beta_scheduler = float(alpha), float(beta), beta_scheduler
        self._max_priority = float(max_priority)
        check_delivery(delivery, priority_lag)
        self._schedule = Schedule.sequential() if delivery is None else delivery
        if priority_lag and not self.prioritized:
            raise ConfigError(f"{kind}.priority_lag", 0, priority_lag, "priority_lag is for prioritized replay only")
        self._priority_lag = priority_lag
        self._delivery: PreparedReplay | None = None
        self._training_steps = 0
        self._lock = threading.Lock()
        self._buffer: ExperienceBuffer | None = None
        self._template: dict[str, Any] | None = None    # flat name -> None (a field SRL left out) or FieldSpec
        self._replay_times = np.zeros(self._max_size, dtype=np.int64)
        self._codec: samples.SampleCodec | None = None
        self._unstored = left_out.UnstoredFields(kind)

    # ---------------------------------------------------------------- SRL's interface
    def put(self, x: SampleBatch) -> None:
        self.put_batch([x])

    def put_batch(self, xs: Sequence[SampleBatch]) -> None:
        """Several samples in one call (a consumer's group of ``g_ing``): every sample checked and
        encoded first, then stored in order (one ``add`` per ring-sized piece, under one lock); all or
        none."""
        xs = list(xs)
        if not xs:
            return
        flats = []
        for x in xs:
            if hasattr(x, "policy_name"):
                x.policy_name = None  # as SRL's replay buffers do (a non-numeric field)
            if self._codec is None:
                self._codec = samples.SampleCodec(x)
            flats.append(self._codec.flatten(x))
        with self._lock:
            if self._buffer is None:
                self._build(flats[0])
            checked = [self._row(flat) for flat in flats]
            rows = [row for row, _, _ in checked]
            left_out.keep_previous(rows, [missing for _, missing, _ in checked], first_seq=self._buffer.inserted, capacity=self._max_size,
                                   stored_row=lambda seq, names: self._buffer.stored_columns(np.array([seq]), names),
                                   zeros=lambda name: np.zeros(tuple(self._template[name].shape),
                                                               dtype=self._template[name].np_dtype))
            priorities = None
            if self.prioritized:
                initial = [self._initial_priority(flat) for flat in flats]
                if any(p is not None for p in initial):   # a sample without analyzed_result.ret: the
                    top = self._buffer.selector.max_priority  # running max, as SRL's put gives it
                    priorities = [top if p is None else p[0] for p in initial]
            # a group larger than the ring goes in ring-sized pieces, as that many puts would; every
            # piece is checked and encoded before the first is stored: nothing of a bad group is written
            cap = self._max_size
            pieces = [self._buffer.encode({name: np.stack([r[name] for r in rows[lo:lo + cap]]) for name in rows[0]})
                      for lo in range(0, len(rows), cap)]
            for k, (n, enc) in enumerate(pieces):
                first = self._buffer.add_encoded(enc, n, priorities=None if priorities is None else
                                                 priorities[k * cap:(k + 1) * cap])
                self._replay_times[(first + np.arange(n)) % cap] = 0
            for _, _, unstored in checked:   # said once stored (a refused group stored nothing to drop)
                if unstored:
                    self._unstored.drop(unstored)

    def _row(self, flat: dict[str, Any]) -> tuple[dict[str, np.ndarray | None], list[str], list[str]]:
        """One sample's stored fields, checked against the first sample's (raises before anything is
        written), the fields it leaves out, and the names of the values it gives that have no storage.
        A field the sample leaves ``None`` is ``None`` here (``left_out.keep_previous`` fills it). A
        field ``None`` in the first sample has no storage, in SRL's buffer as here: values a later
        sample gives it (a leaf, or a sub-structure's leaves) are dropped, with a warning, as SRL's
        assignment drops them."""
        extra = set(flat) - set(self._template)
        if extra:
            unstored = [t for t, spec in self._template.items() if spec is None]
            if any(not any(e.startswith(t + ".") for t in unstored) for e in extra):
                raise SpecError("sample fields", sorted(self._template), sorted(flat),
                                "keep the set of fields the same in every sample")
        row, missing = {}, []
        for name, spec in self._template.items():
            v = flat.get(name)
            if spec is None:
                if v is not None:
                    extra.add(name)
                continue
            if v is None:   # left out in this sample (e.g. SRL's info=None): the slot keeps what it holds
                row[name] = None
                missing.append(name)
                continue
            arr = np.asarray(v)
            if arr.shape != tuple(spec.shape):
                raise SpecError(f"{name}.shape", tuple(spec.shape), arr.shape,
                                "send samples of the first sample's shapes (SRL's sample_steps)")
            row[name] = arr
        return row, missing, sorted(extra)

    def get(self, batch_size: int | None = None) -> ReplayEntry:
        """SRL's ``get``. ``batch_size`` (an extension; default: the configured one) lets a harness
        draw other sizes. ``sampling_indices`` are the chunks' insertion numbers (seqs): SRL passes
        them back to ``update_priorities`` untouched, and a seq names one chunk for ever, so a
        priority for a chunk that was overwritten since is skipped, never written to its successor.
        A batch prepared ahead is handed over when the guards keep it; otherwise one is drawn now."""
        if self._delivery is None:
            raise ConfigError("get", "a buffer with chunks (not empty())", "nothing put yet",
                              "get only when empty() is False, as SRL's trainer does")
        request = DeliveryRequest("sample", int(batch_size or self._batch_size),
                                  beta=self._beta if self.prioritized else None, in_slot_order=True)
        p, reuses = self._delivery.deliver(request, on_handout=self._count_replays)
        sample, seqs = p.prepared
        if self.prioritized:
            return samples.replay_entry(reuses_left=-1, sample=sample, receive_time=-1,
                                        sampling_indices=seqs, reuses=reuses)
        return samples.replay_entry(reuses_left=-1, sample=sample, receive_time=-1, reuses=reuses)

    def _count_replays(self, batch) -> float:
        """At hand-out (the lock held): the batch's mean replay count; the uniform kind counts a
        replay per get (the prioritized one per priority update, as SRL)."""
        # a slot overwritten since the draw (staleness > 0) holds a chunk this batch does not deliver
        kept = batch.slots[self._buffer.meta["seq"][batch.slots] == batch.seqs]
        reuses = float(self._replay_times[kept].mean()) if kept.size else 0.0
        if not self.prioritized:
            self._replay_times[kept] += 1
        return reuses

    def _prepare(self, batch):
        """SRL's sample for a batch and, for the prioritized kind, its ``sampling_indices`` (the
        chunks' seqs; else None): time-major ``[T, B, ...]`` fields, rebuilt as put (ahead, in the
        preparing thread, or on the training thread). Its chunks come in slot order, as SRL's own
        buffers hand them out (``_slicing`` sorts the gather indices; the prioritized one sorts its
        draws): ``get``'s request draws them so (``in_slot_order``), before the gather."""
        columns = dict.fromkeys(self._template)
        for name in batch:
            columns[name] = batch[name].transpose(0, 1).contiguous().numpy()   # [B, T, ...] -> [T, B, ...]
        sample = self._codec.rebuild(columns)
        if not self.prioritized:
            return sample, None
        sample.register_metadata(sampling_weight=batch.weights.numpy().astype(np.float32))
        return sample, np.asarray(batch.seqs, dtype=np.int64)

    def update_priorities(self, idxes: ArrayLike, priorities: ArrayLike) -> int:
        """Priorities for delivered chunks, by their ``sampling_indices``; a chunk overwritten since is
        skipped. Returns how many were updated."""
        if not self.prioritized:
            raise ConfigError("update_priorities", "a prioritized_replay_buffer", self.kind,
                              "configure buffer_name='prioritized_replay_buffer'")
        idxes = np.asarray(idxes, dtype=np.int64).reshape(-1)
        pr = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if idxes.shape != pr.shape:
            raise SpecError("priorities", f"shape {idxes.shape} (one per sampling index)", pr.shape,
                            "pass one priority per chunk of the get")
        if not (np.isfinite(pr).all() and (pr > 0).all()):
            raise SpecError("priorities", "finite values > 0", pr[~(np.isfinite(pr) & (pr > 0))][0],
                            "pass |TD error| + a small epsilon")
        with self._lock:
            inserted = self._buffer.inserted
            if idxes.size and (idxes.min() < 0 or idxes.max() >= inserted):
                raise SpecError("idxes", f"sampling_indices of delivered chunks (seqs in [0, {inserted}))",
                                idxes[(idxes < 0) | (idxes >= inserted)][:4].tolist(),
                                "pass the ReplayEntry.sampling_indices of the batch the priorities are for")
            slots = idxes % self._max_size
            updated = self._buffer.update_priorities(slots, pr, seqs=idxes)
            self._replay_times[slots[idxes >= inserted - self._max_size]] += 1  # the chunks still stored
            self._training_steps += 1
            if self._beta_scheduler is not None:
                self._beta = self._beta_scheduler.get(self._training_steps)
            self._delivery.priorities_updated_locked()  # update k applies before draw k + 1
            return updated

    def qsize(self) -> int:
        return self._stored_chunks() * (self._sample_length or 0)

    def empty(self) -> bool:
        return self._stored_chunks() * (self._sample_length or 0) < self._warmup or \
            self._stored_chunks() < (self._batch_size if not self.prioritized else 1)

    def full(self) -> bool:
        return self._stored_chunks() == self._max_size

    @property
    def n_chunks_per_sample(self) -> int:
        return 1

    @property
    def experience_buffer(self) -> ExperienceBuffer | None:
        """The core buffer holding the chunks (None before the first put)."""
        return self._buffer

    def stats(self) -> dict[str, int]:
        out = {"chunks_put": 0 if self._buffer is None else self._buffer.inserted, "stored": self._stored_chunks(),
               "unstored_values": self._unstored.samples}
        if self._delivery is not None:
            m = self._delivery.metrics()
            out.update(prepared_hits=m.prefetch_hits, prepared_discards=m.prefetch_discards)
        return out

    def close(self) -> None:
        """Stop and join the preparing thread (if any); a failure it had is raised here."""
        if self._delivery is not None:
            self._delivery.close()

    # ---------------------------------------------------------------- pickling (SRL's save_buffer_on_exit)
    def __getstate__(self) -> dict:
        # batches prepared ahead are undone first: the saved RNG is the sequential one
        with (self._delivery.paused() if self._delivery is not None else contextlib.nullcontext()), self._lock:
            return dict(config=self._config, template=self._template, codec=self._codec,
                        replay_times=self._replay_times.copy(),
                        training_steps=self._training_steps, beta=self._beta, max_priority=self._max_priority,
                        buffer=None if self._buffer is None else self._buffer.state_dict())

    def __setstate__(self, state: dict) -> None:
        cfg = dict(state["config"])
        self.__init__(cfg.pop("kind"), **cfg)
        self._replay_times[:] = state["replay_times"]
        self._training_steps, self._beta, self._max_priority = (state["training_steps"], state["beta"],
                                                                state["max_priority"])
        self._codec = state["codec"]
        if state["buffer"] is not None:
            self._template = state["template"]
            self._make_buffer([fs for fs in self._template.values() if fs is not None])
            self._buffer.load_state_dict(state["buffer"])

    # ---------------------------------------------------------------- internals
    def _stored_chunks(self) -> int:
        return 0 if self._buffer is None else len(self._buffer)

    def _build(self, flat: dict[str, Any]) -> None:
        first = next((np.asarray(v) for v in flat.values() if v is not None), None)
        length = None if first is None or first.ndim == 0 else first.shape[0]
        # inferred from this sample, kept only once it is stored (a refused first sample changes nothing)
        sample_length = length if self._sample_length is None else self._sample_length
        batch_length = sample_length if self._batch_length is None else self._batch_length
        if length != sample_length:
            raise SpecError("sample length", sample_length, length,
                            "send samples of the configured sample_length (SRL's sample_steps)")
        if batch_length != sample_length:
            raise ConfigError(f"{self.kind}.batch_length", f"equal to sample_length={sample_length}",
                              batch_length,
                              "train on whole samples: SRL's own _slicing mixes steps of different samples "
                              "into one column when batch_length < sample_length (it sorts the flattened "
                              "gather indices), so Conduit refuses it instead of reproducing it")
        template, specs = {}, []
        for name, v in flat.items():
            if v is None:
                template[name] = None
                continue
            arr = np.asarray(v)
            if arr.dtype.kind in "OUSV":
                raise SpecError(name, "a numeric or bool array", f"dtype {arr.dtype}",
                                "drop non-numeric fields before the replay buffer (SRL drops policy_name)")
            if arr.ndim == 0 or arr.shape[0] != sample_length:
                raise SpecError(f"{name}.shape", f"({sample_length}, ...) (time first)", arr.shape,
                                "send time-major samples of sample_length steps")
            fs = FieldSpec(name, tuple(arr.shape), torch.from_numpy(np.zeros(0, arr.dtype)).dtype,
                           allow_nonfinite=True)  # SRL stores what it is given
            template[name] = fs
            specs.append(fs)
        self._sample_length, self._batch_length = sample_length, batch_length
        # what was inferred is part of the configuration: an unpickled buffer must know it
        self._config.update(sample_length=sample_length, batch_length=batch_length)
        self._template = template
        self._make_buffer(specs)

    def _make_buffer(self, specs: list[FieldSpec]) -> None:
        selector = (Prioritized(alpha=self._alpha, beta=self._beta, eps=0.0, stratified=True)
                    if self.prioritized else Uniform(replace=False))
        if self.prioritized:
            selector.max_priority = self._max_priority
        self._buffer = ExperienceBuffer(spec=ExperienceSpec(specs), capacity=self._max_size, selector=selector,
                                        seed=self._seed, done_fields=())
        self._delivery = PreparedReplay(buffer=self._buffer, schedule=self._schedule, lock=self._lock,
                                        priority_lag=self._priority_lag, prepare=self._prepare)

    def _initial_priority(self, flat: dict[str, Any]) -> list[float] | None:
        """SRL's rule: from the sample's TD errors ``|ret - value|`` after burn-in, interpolated between
        their max and mean by ``priority_interpolation_eta``; without ``analyzed_result.ret``, the
        running max priority (left to the selector)."""
        ret, value = flat.get("analyzed_result.ret"), flat.get("analyzed_result.value")
        if ret is None:
            return None
        if self._eta is None:
            raise ConfigError(f"{self.kind}.priority_interpolation_eta", "a number in [0, 1]", None,
                              "set priority_interpolation_eta (SRL needs it when samples carry analyzed_result.ret)")
        td = np.abs(np.asarray(ret) - np.asarray(value)).squeeze(-1)[self._burn_in:]
        return [float(self._eta * td.max() + (1 - self._eta) * td.mean())]
