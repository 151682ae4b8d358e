"""Conduit in place of the fully-async trainer's ``MessageQueue``: oldest first, bounded staleness,
nothing dropped, every sample accounted for.

verl 0.9.1's fully-async trainer (``verl/experimental/fully_async_policy``) passes each generated prompt
group (a pickled ``RolloutSample``) from its rollouter to its trainer through ``MessageQueue``
(``message_queue.py``), a Ray actor over a deque that delivers in the order generations *finish* and, when
full, drops the oldest sample with a log warning. Neither is what the synchronous trainer does: it trains
on the prompts in the data loader's order, all of them. The rollouter already holds generation back
(``staleness_samples >= max_required_samples`` pauses it); what it cannot do is keep the order.

``ConduitMessageQueue`` offers ``MessageQueue``'s calls over :class:`~conduit_core.queues.VersionWindowQueue`:

- **order**: samples are delivered in the rollouter's feed order (the index in its ``sample_id``), a
  fast sample waiting for the slower ones started before it. The trained set is the generated set in
  prompt order, so response lengths are not skewed toward what finishes first;
- **admission, not drop**: the rollouter holds generation back itself (its ``staleness_samples`` gate,
  which counts this queue's size); this queue admits each sample in feed order into the version window
  (``staleness = ceil(async_training.staleness_threshold)`` versions of
  ``ppo_mini_batch_size * require_batches * trigger_parameter_sync_step`` samples each). A sample past
  the window could only be trained later than the bound allows, so its put is refused with an error (a
  broken gate is a bug to see, not a sample to drop or to train stale); nothing accepted is dropped;
- **versions**: each sample carries the weight versions that generated it (``min_global_steps`` ..
  ``max_global_steps`` of its responses: a partial rollout spans several). verl's trainer does not tell
  the queue its own version; the queue counts it from what it sees (``_trainer_asks``), never ahead of
  the trainer, so every delivery knows its staleness;
- **accounts**: ``get_statistics()`` adds ``produced == delivered + pending + cleared`` ("delivered" counts
  what the trainer took: a short last batch it then drops, fully_async_trainer.py, is counted), the staleness
  histogram, admission waits and the queue depth; ``dropped_samples`` is always 0. The same figures
  reach verl's tracker as ``fully_async/conduit/*`` (carried in the status of each batch's first sample).

Turned on with ``CONDUIT_VERL_MESSAGE_QUEUE=conduit`` in the environment of the run (the plugin then puts
this class where ``fully_async_main`` looks for ``MessageQueue``; verl's files are not edited).
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections import Counter, deque
from typing import Any

from conduit_core.errors import ClosedError, ConfigError, SemanticError
from conduit_core.queues import VersionWindowQueue, in_window

log = logging.getLogger(__name__)
ENV = "CONDUIT_VERL_MESSAGE_QUEUE"
_SAMPLE_ID = re.compile(r"^sample_\d+_(\d+)$")


def window_of(config) -> tuple[int, int]:
    """(samples per policy version, staleness in versions) of a fully-async config, as verl's trainer
    counts them (fully_async_trainer.py: ``required_samples``, ``_fit_update_local_step``)."""
    at = config.async_training
    required = int(config.actor_rollout_ref.actor.ppo_mini_batch_size) * int(at.get("require_batches", 1))
    per_version = required * int(at.get("trigger_parameter_sync_step", 1))
    threshold = float(at.get("staleness_threshold", 1))
    if threshold < 0:
        raise ConfigError("async_training.staleness_threshold", "a number >= 0", threshold,
                          "set how many versions a trained sample may lag (0: synchronous)")
    return per_version, math.ceil(threshold)


def first_feed_index(config) -> int:
    """The index the rollouter gives its first sample (fully_async_rollouter.py: 1, or where a resumed
    run left off)."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    trainer = config.trainer
    mode = trainer.get("resume_mode", "disable")
    if mode == "disable":
        return 1
    folder = None
    if mode == "resume_path":
        folder = trainer.get("resume_from_path")
    elif mode == "auto":
        folder = find_latest_ckpt_path(trainer.default_local_dir)
    if not folder:
        return 1
    per_version, _ = window_of(config)
    return int(str(folder).rstrip("/").split("global_step_")[-1]) * per_version + 1


class ConduitMessageQueue:
    """``MessageQueue``'s calls (put_sample, get_sample, get_queue_size, get_statistics, clear_queue,
    shutdown, get_memory_usage, put_validate, get_validate) over a version window; see the module doc.
    A threaded Ray actor (``actor_class()``): a get that waits for the oldest sample holds one thread."""

    def __init__(self, config, max_queue_size: int = 1000, *, first_index: int | None = None):
        self.per_version, self.staleness = window_of(config)
        self.required = self.per_version // int(config.async_training.get("trigger_parameter_sync_step", 1))
        self.max_queue_size = int(max_queue_size)
        self._next_index = first_feed_index(config) if first_index is None else int(first_index)
        # a resumed run starts at the trainer's version then (its feed index starts per_version x it on)
        self.start_version = (self._next_index - 1) // self.per_version
        # outstanding samples are bounded by the window each is admitted to: no second bound
        self.queue = VersionWindowQueue(per_version=self.per_version, staleness=self.staleness,
                                        capacity=1 << 40, start_version=self.start_version)
        self._arrived: dict[int, tuple[bytes, list[int]]] = {}   # finished ahead of an older sample
        self._lock = threading.Lock()           # puts: admission in feed order
        self._take_lock = threading.Lock()      # gets: one at a time, in order
        self._val = deque()
        self._counts = Counter()
        self._cleared, self._cleared_all = 0, False

    # ---- the rollouter's side ----
    def put_sample(self, sample: Any) -> bool:
        if sample is None:      # the rollouter's end signal
            self.queue.finish_producing()
            return True
        index, versions = self._tags(sample)
        with self._lock:
            # every refusal comes before anything changes
            if self._cleared_all or not self.queue.stats()["producing"]:
                raise ClosedError(f"put_sample: sample {index} came after the end of training (the end signal or "
                                  "clear_queue); it was not accepted")
            if index < self._next_index or index in self._arrived:
                raise ConfigError("sample_id", f"a feed index not yet put (next {self._next_index})", index,
                                  "put each generated sample once")
            seq = self.queue.stats()["admitted"] + index - self._next_index      # its place in delivery order
            if not in_window(seq, version=versions[0] - self.start_version, staleness=self.staleness,
                             per_version=self.per_version):
                # past its window it can only be trained later than the bound allows (waiting would not help)
                raise SemanticError(
                    f"put_sample: sample {index} (generated by version {versions[0]}) would be trained at version "
                    f"{self.start_version + seq // self.per_version}, over the staleness bound {self.staleness}; it "
                    "was not accepted. Fix: the rollouter must hold generation back "
                    "(async_training.staleness_threshold; its staleness_samples count) or raise the threshold")
            if versions[-1] > self.queue.version:   # generated with newer weights: the trainer has synced them
                self.queue.publish_version(versions[-1])
            self._arrived[index] = (sample, versions)
            self._counts["produced"] += 1
            while self._next_index in self._arrived:   # in window on arrival, no capacity bound: always admitted
                data, vs = self._arrived.pop(self._next_index)
                self.queue.put(self.queue.try_admit(version=vs[0]), data, versions=vs)
                self._next_index += 1
        return True

    def admits(self, index: int) -> bool:
        """Whether the sample at feed ``index`` may start generating now: inside the version window (a
        rollouter's gate asks before it starts one; verl's counts ``staleness_samples`` instead)."""
        s = self.queue.stats()
        seq = s["admitted"] + int(index) - self._next_index
        return in_window(seq, version=s["version"] - self.start_version, staleness=self.staleness,
                         per_version=self.per_version)

    # ---- the trainer's side ----
    def get_sample(self) -> tuple[Any | None, int]:
        """The oldest sample by feed order, waiting for it: ``(sample, queue size)``; ``(None, 0)`` once the
        rollouter's end signal is reached (as verl's queue hands it over)."""
        with self._take_lock:
            self._trainer_asks()
            taken = self.queue.take(1)      # its staleness counted against the trainer's weights now
            if not taken:
                return None, 0
            sample = taken[0].item
            if (self.queue.stats()["delivered"] - 1) % self.required == 0:   # the first of a training batch
                sample = self._with_metrics(sample, taken[0].staleness)
            return sample, self.get_queue_size()

    def try_get_batch(self, n: int) -> list | None:
        """The ``n`` oldest samples at once, or None while one of them is still generating (for a trainer
        that takes a whole batch, and the conformance suite)."""
        with self._take_lock:
            self._trainer_asks()
            taken = self.queue.try_take(n)
            return None if taken is None else [t.item for t in taken]

    def metrics(self) -> dict[str, float]:
        """What verl's tracker gets, flat and numeric: queue depth, the accounts, admission waits and the
        staleness histogram so far (``conduit/staleness_<lag>``: responses' prompt groups trained <lag>
        versions late, cumulative; two steps' difference is the batch between them)."""
        s = self.get_statistics()
        plain = ("queue_size", "total_produced", "total_consumed", "dropped_samples")
        out = {f"conduit/{k}": float(s[k]) for k in plain}
        out.update({k: float(v) for k, v in s.items()
                    if k.startswith("conduit/") and isinstance(v, (int, float, bool))})
        out.update({f"conduit/staleness_{lag}": float(n) for lag, n in s["conduit/staleness"].items()})
        return out

    def _with_metrics(self, sample, staleness: int):
        """The sample with Conduit's metrics in its ``rollout_status``: verl's trainer logs the first
        sample's status of each batch to its tracker, under ``fully_async/`` (detach_utils.py,
        ``assemble_batch_from_rollout_samples``; fully_async_trainer.py, ``_collect_metrics_from_samples``)."""
        import ray

        rs = ray.cloudpickle.loads(sample)
        rs.rollout_status = {**(rs.rollout_status or {}), **self.metrics(),
                             "conduit/first_sample_staleness": float(staleness)}
        return ray.cloudpickle.dumps(rs)

    def _trainer_asks(self) -> None:
        """verl's trainer does not tell the queue its weight version; the queue knows two lower bounds of
        it: a sample generated with version v (put_sample), and, when the trainer asks for more, the syncs
        it has done by then (one per ``per_version`` samples taken: fully_async_trainer.py syncs after every
        ``trigger_parameter_sync_step`` steps of ``required_samples``, before it asks again). The window
        moves with the larger; never ahead of the trainer."""
        version = self.start_version + self.queue.stats()["delivered"] // self.per_version
        if version > self.queue.version:
            self.queue.publish_version(version)

    def get_queue_size(self) -> int:
        """Every sample accepted and not yet delivered, those waiting behind an older one included: the
        rollouter's gate counts it as outstanding (fully_async_rollouter.py, reset_staleness)."""
        with self._lock:    # (a put moves samples between the two)
            return 0 if self._cleared_all else self.queue.stats()["ready"] + len(self._arrived)

    def get_statistics(self) -> dict[str, Any]:
        with self._lock:    # one consistent view: a put moves samples between these
            s = self.queue.stats()
            waiting = len(self._arrived)
            if self._cleared_all:
                s["ready"] = 0
            produced = self._counts["produced"]
        return {"queue_size": s["ready"] + waiting, "total_produced": produced, "total_consumed": s["delivered"],
                "dropped_samples": 0, "max_queue_size": self.max_queue_size,
                "conduit/pending": s["ready"] + waiting, "conduit/waiting_for_older": waiting,
                "conduit/cleared": self._cleared,
                "conduit/accounted": produced == s["delivered"] + s["ready"] + waiting + self._cleared,
                "conduit/version": s["version"], "conduit/staleness": s["staleness"],
                "conduit/admission_waits": s["admission_waits"], "conduit/admission_wait_s": s["admission_wait_s"]}

    def clear_queue(self) -> None:
        """verl calls it when training ends (fully_async_main.py, ``finally``): what is left was generated
        and never trained on; it is counted (``conduit/cleared``) and logged, and the queue closes."""
        with self._lock:
            if self._cleared_all:
                return
            left = len(self.queue.pending_items()) + len(self._arrived)
            self._arrived.clear()
            self.queue.close()
            self._cleared += left
            self._cleared_all = True
        if left:
            log.warning("conduit_verl: %d generated samples were never trained on (training ended first)", left)

    def shutdown(self) -> None:
        self.queue.finish_producing()

    def pending_samples(self) -> list:
        """Every sample accepted and not yet delivered, in feed order."""
        with self._lock:
            if self._cleared_all:
                return []
            return self.queue.pending_items() + [self._arrived[i][0] for i in sorted(self._arrived)]

    def get_memory_usage(self) -> dict:
        items = self.pending_samples()
        total = sum(len(x) for x in items if isinstance(x, (bytes, bytearray)))
        return {"queue_samples": len(items), "estimated_memory_bytes": total,
                "estimated_memory_mb": total / (1024 * 1024)}

    def put_validate(self, data) -> None:
        self._val.append(data)

    def get_validate(self):
        return self._val.popleft() if self._val else None

    # ---- tags ----
    @staticmethod
    def _tags(sample: Any) -> tuple[int, list[int]]:
        """(feed index, versions) of a pickled RolloutSample."""
        import ray
        import numpy as np

        rs = ray.cloudpickle.loads(sample) if isinstance(sample, (bytes, bytearray)) else sample
        match = _SAMPLE_ID.match(str(getattr(rs, "sample_id", "")))
        if match is None:
            raise ConfigError("sample_id", "'sample_<epoch>_<index>' (the rollouter's)", getattr(rs, "sample_id", None),
                              "put the RolloutSample the fully-async rollouter built")
        ntb = rs.full_batch.non_tensor_batch
        lo = int(np.min(ntb["min_global_steps"].astype(np.int64)))
        hi = int(np.max(ntb["max_global_steps"].astype(np.int64)))
        return int(match.group(1)), list(range(lo, hi + 1))


def actor_class():
    """The Ray actor class ``fully_async_main`` creates as ``MessageQueue.remote(config, max_queue_size)``."""
    import ray

    return ray.remote(num_cpus=1, max_concurrency=64)(ConduitMessageQueue)
