"""A deliberately broken adapter: the example adapter with one fault switched on.

Each fault breaks one promise; the suite must fail exactly the checks that guard it.
"""

from __future__ import annotations

import numpy as np
import torch

from collections import deque

from conduit_conformance import AsyncQueue, ConvergenceResult, Delivered
from conduit_conformance.edp_session import delivered
from conduit_conformance.examples import minirl as fw
from conduit_conformance.examples.conduit_minirl import conformance as example
from conduit_conformance.examples.conduit_minirl.memory import ConduitReplayMemory, ConduitRolloutStore
from conduit_core.queues import admissible

FAULTS = {
    # fault: the checks it must fail (and no others)
    # losing or doubling accepted data also breaks the staleness bound (inserts missed for ever)
    # (and the exact shared-RNG check: other rows stored, other rows drawn)
    # (and a newer policy version's delivery lacks the rows dropped: onpolicy/version_isolation)
    "drop": {"ingest/exactly_once", "equivalence/sequential_matches_native", "onpolicy/consume_once",
             "offpolicy/staleness_bound", "equivalence/eviction_matches_native", "equivalence/exact_with_shared_rng",
             "onpolicy/version_isolation"},
    "duplicate": {"ingest/exactly_once", "equivalence/sequential_matches_native", "onpolicy/consume_once",
                  "offpolicy/staleness_bound", "equivalence/eviction_matches_native",
                  "equivalence/exact_with_shared_rng"},
    # a reversed rollout leaves the ring in another order, so other steps are evicted first
    "reorder": {"ingest/source_order", "equivalence/eviction_matches_native", "equivalence/exact_with_shared_rng"},
    "leak_versions": {"onpolicy/version_isolation"},
    # a newer version's data never delivered (an empty delivery leaks nothing: found in review)
    "starve_new_versions": {"onpolicy/version_isolation"},
    "redeliver": {"onpolicy/consume_once"},
    "lose_state": {"state/round_trip"},
    "stale_prefetch": {"offpolicy/staleness_bound"},
    "skew": {"deliver/uniform_distribution", "deliver/prioritized_distribution", "deliver/sees_newest",
             "equivalence/sequential_matches_native", "equivalence/exact_with_shared_rng"},
    # the shared RNG stream consumed once more than the framework does (e.g. a warm-up draw)
    "rng_drift": {"equivalence/exact_with_shared_rng"},
    "overlap_reorder": {"equivalence/overlap_same_multiset"},
    "ignore_priorities": {"deliver/prioritized_distribution"},
    "accept_bad_input": {"ingest/rejects_bad_input"},
    "corrupt_rewards": {"convergence/bandit"},
    # each row the newest (oldest) of three uniform draws: relearns the bandit's swapped arms in 0.23x
    # (5.1x) native's steps on seeds 0, 1, so the two-sided convergence check fails it as learning
    # faster (slower) (the newer/older of two was caught on only 13/17 of 20 seed pairs: found in review)
    "newest_of_three": {"deliver/uniform_distribution", "equivalence/sequential_matches_native",
                        "equivalence/exact_with_shared_rng", "convergence/bandit"},
    # (the oldest of three almost never hands out the newest push: deliver/sees_newest fails it too)
    "oldest_of_three": {"deliver/uniform_distribution", "equivalence/sequential_matches_native", "deliver/sees_newest",
                        "equivalence/exact_with_shared_rng", "convergence/bandit"},
    # the right ids with wrong contents: delivery's collation takes each row's reward from the next row
    "neighbour_rewards": {"deliver/rows_intact", "onpolicy/rows_intact"},
    # uniform replay's batches drawn otherwise with the same per-item frequencies (found in review:
    # the frequency checks pool over batches): no item twice in a batch where the framework draws
    # with replacement; a batch sorted by id (a gather ordered for locality, then handed out so)
    "distinct_batches": {"equivalence/sequential_matches_native", "equivalence/exact_with_shared_rng"},
    "sorted_batches": {"equivalence/sequential_matches_native", "equivalence/exact_with_shared_rng"},
    # found by a user trying the docs: each delivery hands out the batch drawn at the call before
    # (a prefetch the sequential schedule did not ask for), uniform and intact but one push late
    "stale_by_one": {"deliver/sees_newest", "offpolicy/staleness_bound", "state/round_trip",
                     "equivalence/exact_with_shared_rng"},
    # every 10th transition of a push lost (positions 9, 19, ...: a rollout of at most 9 steps never shows it)
    "drop_tenth": {"ingest/exactly_once", "deliver/uniform_distribution", "deliver/prioritized_distribution",
                   "equivalence/exact_with_shared_rng"},
    # bad obs refused with an error that names another field ("reward") and no unmet expectation
    "wrong_field_error": {"ingest/rejects_bad_input"},
    # n-step rows offered (the session has deliver_rows) and 'nstep' not declared: never certified
    "offers_undeclared_nstep": {"harness/declares_what_it_offers"},
    # asynchronous training (checks_async): verl's fully-async MessageQueue (no admission, the oldest
    # dropped when full); a queue that discards samples over the staleness bound; one that serves the
    # newest ready samples first (within the admission window). Each serves what finished, not what
    # started first, so each fails the order and the set trained on; dropping without admission also
    # loses samples and lets them age past the bound; discarding keeps within the bound but loses the
    # slow ones (trained mean length 5.1 where 12.4 was generated, seed 0); newest first lets the
    # oldest age past the bound
    "drop_when_full": {"async/nothing_dropped", "async/staleness_bound", "async/staleness0_is_synchronous",
                       "async/oldest_first", "async/no_length_bias"},
    "discard_stale": {"async/nothing_dropped", "async/staleness0_is_synchronous", "async/oldest_first",
                      "async/no_length_bias"},
    "newest_first": {"async/staleness_bound", "async/staleness0_is_synchronous", "async/oldest_first",
                     "async/no_length_bias"},
}
ASYNC_FAULTS = ("drop_when_full", "discard_stale", "newest_first")


BIASED = ("newest_of_three", "oldest_of_three")


class BrokenSession(example.AdapterSession):
    def __init__(self, store, fault: str, mode: str = "sequential", prioritized: bool = False):
        super().__init__(store)
        self.fault, self.prioritized = fault, prioritized
        self.mode = mode
        self.n_ingested = 0

    def ingest(self, rollout):
        # the faults drop, reorder or double whole transitions; each one's contents stay as produced
        self.n_ingested += 1
        steps = example.to_transitions(rollout)
        if self.fault == "drop" and self.n_ingested % 3 == 0:
            steps = steps[:-1]
        if self.fault == "drop_tenth":
            steps = [t for i, t in enumerate(steps) if i % 10 != 9]
        if self.fault == "reorder" or (self.fault == "overlap_reorder" and self.mode == "overlapped"):
            steps = steps[::-1]
        for _ in range(2 if self.fault == "duplicate" and self.n_ingested == 2 else 1):
            if not steps:
                return
            if isinstance(self.store, ConduitRolloutStore):
                self.store.push(steps, policy_version=rollout.policy_version, source=rollout.source)
            else:
                self.store.push(steps, source=rollout.source)

    def ingest_raw(self, columns, *, source=0):
        if self.fault == "wrong_field_error" and columns["obs"].shape[1:] != (4,):
            from conduit_core import SpecError
            raise SpecError("reward", "float32", "float32", "nothing to fix")
        if self.fault == "accept_bad_input":  # 'fixes' the shape silently instead of refusing
            columns = dict(columns)
            obs = columns["obs"]
            columns["obs"] = np.pad(obs, ((0, 0), (0, 4 - obs.shape[1])))
        super().ingest_raw(columns, source=source)

    def deliver(self, batch_size, *, policy_version=None):
        if isinstance(self.store, ConduitRolloutStore):
            if self.fault == "leak_versions":
                return self._drain_all()
            if self.fault == "starve_new_versions" and policy_version not in (None, 0):
                return Delivered(ids=np.zeros(0, np.int64))
            if self.fault == "redeliver":
                d = super().deliver(batch_size, policy_version=policy_version)
                self._replay = getattr(self, "_replay", []) + [d]
                return Delivered(ids=np.concatenate([x.ids for x in self._replay]),
                                 rows={k: np.concatenate([x.rows[k] for x in self._replay]) for k in d.rows})
            return super().deliver(batch_size, policy_version=policy_version)
        if self.fault == "distinct_batches" and not self.prioritized:   # the first draw of each item, topped up
            d = super().deliver(4 * batch_size)
            _, first = np.unique(d.ids, return_index=True)
            pick = np.concatenate([np.sort(first), np.setdiff1d(np.arange(d.ids.size), first)])[:batch_size]
            d.ids, d.rows = d.ids[pick], {k: v[pick] for k, v in d.rows.items()}
            return d
        d = super().deliver(batch_size)
        if self.fault == "stale_by_one":   # hands out the batch drawn at the call before (drawn ahead)
            d, self._ahead = getattr(self, "_ahead", None) or d, d
        if self.fault == "sorted_batches" and not self.prioritized:
            pick = np.argsort(d.ids, kind="stable")
            d.ids, d.rows = d.ids[pick], {k: v[pick] for k, v in d.rows.items()}
        if self.fault == "skew":  # favours old rows: each row past half the batch's largest id becomes its oldest
            pick = np.where(d.ids > np.max(d.ids) // 2, np.argmin(d.ids), np.arange(d.ids.size))
            d.ids, d.rows = d.ids[pick], {k: v[pick] for k, v in d.rows.items()}
        return d

    def _drain_all(self):
        return delivered(self.store.edp.buffer.take(None))  # every version, not only the learner's

    def update_priorities(self, d, priorities):
        if self.fault != "ignore_priorities":
            super().update_priorities(d, priorities)

    def load_state(self, state):
        super().load_state(state)
        if self.fault == "lose_state":
            self.store.edp.buffer.rng = np.random.default_rng(12345)  # the RNG was not restored


def _shift_rewards(store) -> None:
    """The store's delivery call hands the learner each row's reward from the row after it
    (a collation off by one): the ids, and so every id-reading check, stay right."""
    name = "drain" if isinstance(store, ConduitRolloutStore) else "sample"
    deliver = getattr(store, name)

    def shifted(*args, **kwargs):
        batch = deliver(*args, **kwargs)
        batch["reward"] = torch.roll(batch["reward"], -1)
        return batch
    setattr(store, name, shifted)


def _pick_of_three(store, fault: str) -> None:
    """For a ``BIASED`` fault, the store's uniform ``sample`` draws three batches and hands out, row
    by row, the newest (or oldest) of the three rows: a recency bias (e.g. a ring index taken from
    the wrong end). Other faults leave the store as it is."""
    if fault not in BIASED:
        return
    newer = fault == "newest_of_three"
    deliver = store.sample

    def picked(batch_size):
        out = deliver(batch_size)
        for other in (deliver(batch_size), deliver(batch_size)):
            ida, idb = out["obs"][:, 0], other["obs"][:, 0]
            keep = ida >= idb if newer else ida <= idb
            for name in list(out.keys()):
                col = out[name]
                out[name] = torch.where(keep.reshape((-1,) + (1,) * (col.dim() - 1)), col, other[name])
        return out
    store.sample = picked


class NStepSession(BrokenSession):
    """Offers n-step rows the harness does not declare: windows of one step whatever n asks for."""

    def deliver_rows(self, batch_size, *, n_step, gamma, beta=None):
        return self.deliver(batch_size)


class BrokenHarness(example.AdapterHarness):
    name = "broken"

    def __init__(self, fault: str):
        assert fault in FAULTS, fault
        self.fault = fault

    def async_queue(self, *, per_version, staleness):
        if self.fault in ASYNC_FAULTS:
            return BrokenAsyncQueue(self.fault, per_version=per_version, staleness=staleness)
        return super().async_queue(per_version=per_version, staleness=staleness)

    def session(self, *, seed, capacity=10_000, prioritized=False, alpha=None, onpolicy=False,
                mode="sequential", staleness=0):
        if onpolicy:
            store = ConduitRolloutStore(capacity, obs_shape=example.OBS_SHAPE, mode=mode)
        else:
            if self.fault == "stale_prefetch" and mode == "overlapped":
                staleness = 10 ** 9  # claims the bound it was asked for, enforces none
            store = ConduitReplayMemory(capacity, obs_shape=example.OBS_SHAPE, seed=seed, prioritized=prioritized,
                                        mode=mode, staleness=staleness, **({} if alpha is None else {"alpha": alpha}))
            if self.fault == "stale_prefetch" and mode == "overlapped":
                import time
                orig = store.edp.ingestion.commit
                def slow_commit(enc, timeout, _orig=orig):  # a slow ingestion operator
                    time.sleep(0.002)
                    return _orig(enc, timeout)
                store.edp.ingestion.commit = slow_commit  # the ingestion part's public operator
        if self.fault == "neighbour_rewards":
            _shift_rewards(store)
        if not (onpolicy or prioritized):
            _pick_of_three(store, self.fault)
        cls = NStepSession if self.fault == "offers_undeclared_nstep" else BrokenSession
        return cls(store, self.fault, mode, prioritized=prioritized)

    def shared_rng_sessions(self, *, seed, capacity=10_000):
        import random
        rng = random.Random(seed)
        if self.fault == "rng_drift":
            rng.random()
        store = ConduitReplayMemory(capacity, obs_shape=example.OBS_SHAPE, shared_rng=rng)
        _pick_of_three(store, self.fault)
        return BrokenSession(store, self.fault), example.NativeSession(capacity, seed)

    def convergence_workloads(self):
        if self.fault not in ("corrupt_rewards", *BIASED):
            return super().convergence_workloads()

        def run(path, seed):
            if path == "native":
                return example.run_bandit(path, seed)
            mem = ConduitReplayMemory(10_000, obs_shape=example.OBS_SHAPE, seed=seed)
            _pick_of_three(mem, self.fault)
            try:
                def sample(b):
                    cols = {k: v.numpy() for k, v in mem.sample(b).items()}
                    if self.fault == "corrupt_rewards":
                        cols["reward"] = np.zeros_like(cols["reward"])  # delivery corrupts rewards
                    return cols
                reached, steps, returns = fw.train_bandit(mem, seed=seed, sample=sample)
            finally:
                mem.close()
            return ConvergenceResult(reached, steps, returns)
        return {"bandit": run}


class BrokenAsyncQueue(AsyncQueue):
    """An asynchronous trainer's queue with one of ``ASYNC_FAULTS``."""

    def __init__(self, fault: str, *, per_version: int, staleness: int):
        self.fault, self.per_version, self.staleness = fault, per_version, staleness
        self.items: deque = deque()           # (item, versions), in put order
        self.admitted = self.delivered = self.version = 0

    def try_admit(self):
        if self.fault == "newest_first" and not admissible(
                self.admitted, version=self.version, staleness=self.staleness, per_version=self.per_version,
                outstanding=self.admitted - self.delivered, capacity=10 ** 9):
            return None
        self.admitted += 1
        return self.admitted - 1

    def put(self, ticket, item, *, versions):
        if self.fault == "drop_when_full" and len(self.items) >= (self.staleness + 1) * self.per_version:
            self.items.popleft()   # MessageQueue.put_sample: "Queue full, dropped sample"
        self.items.append((item, tuple(versions)))

    def try_take(self, n):
        if self.fault == "discard_stale":
            self.items = deque(x for x in self.items if self.version - x[1][0] <= self.staleness)
        if len(self.items) < n:
            return None
        pick = self.items.pop if self.fault == "newest_first" else self.items.popleft
        batch = [pick()[0] for _ in range(n)]
        self.delivered += n
        return batch

    def publish_version(self, version):
        self.version = version

    def pending(self):
        return [item for item, _ in self.items]
