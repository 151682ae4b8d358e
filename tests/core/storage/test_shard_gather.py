"""``shard_gather``: a gather over several shards against one host shard's rows, and the host
shards' numpy route (``host_rows``) against the shards' own gathers (``begin_gather``, the route
for shards that are not host numpy columns)."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core import ExperienceBuffer, ExperienceSpec, FieldSpec, Prioritized, ShardSpec, register_shard_kind
from conduit_core.storage.local_shard import LocalShard
from conduit_core.storage.shard_gather import begin_stored_gather, host_rows

SPEC = ExperienceSpec([FieldSpec("obs", (3, 2), torch.float32), FieldSpec("action", (), torch.int64),
                       FieldSpec("reward", (), torch.float32), FieldSpec("terminated", (), torch.bool),
                       FieldSpec("truncated", (), torch.bool), FieldSpec("img", (2,), torch.uint8)])


def rows(n: int, rng: np.random.Generator) -> dict:
    return {"obs": rng.standard_normal((n, 3, 2)).astype(np.float32), "action": rng.integers(0, 9, n),
            "reward": rng.standard_normal(n).astype(np.float32), "terminated": rng.random(n) < 0.2,
            "truncated": rng.random(n) < 0.1, "img": rng.integers(0, 255, (n, 2), dtype=np.uint8)}


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 20), min_size=1, max_size=4), seed=st.integers(0, 2**31),
       k=st.integers(0, 50), fields=st.sets(st.sampled_from(SPEC.names), min_size=1))
def test_several_host_shards_gather_what_one_host_shard_holds(sizes, seed, k, fields):
    rng = np.random.default_rng(seed)
    cap = sum(sizes)
    shards = [ShardSpec("pageable", c) for c in sizes]
    one, many = (ExperienceBuffer(spec=SPEC, capacity=cap, shards=s) for s in (None, shards))
    try:
        data = rows(cap, rng)
        one.add(data)
        many.add(data)
        storage = many.storage
        slots = rng.integers(0, cap, k)
        names = sorted(fields)
        want = {name: torch.from_numpy(np.ascontiguousarray(data[name][slots])) for name in names}
        shard_ids = np.searchsorted(storage.bounds, slots, side="right") - 1
        routes = {"begin_stored_gather": begin_stored_gather(storage.parts, storage.bounds, SPEC, slots, names,
                                                             torch.device("cpu"))(),
                  "gather": storage.gather(slots, fields=names), "one shard": one.storage.gather(slots, fields=names)}
        if k:   # the shards' own gathers (what non-host shards take), started before any is finished
            routes["host_rows"] = host_rows(storage.parts, storage.bounds, slots, shard_ids, names)
            own = {}
            started = [(np.flatnonzero(shard_ids == s), storage.parts[s].begin_gather(
                slots[shard_ids == s] - storage.bounds[s], names, torch.device("cpu"))) for s in np.unique(shard_ids)]
            for pos, finish in started:
                for name, t in finish().items():
                    own.setdefault(name, torch.empty((k, *t.shape[1:]), dtype=t.dtype))[torch.from_numpy(pos)] = t
            routes["begin_gather"] = own
        for route, got in routes.items():
            assert sorted(got) == names, route
            for name in names:
                assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), (route, name)
    finally:
        one.close()
        many.close()


@register_shard_kind
class DeferredShard(LocalShard):
    """A host shard that shows no host columns (as a remote or device shard): its gathers go
    through ``begin_gather``, whose starts and finishes it records, as a remote shard's are
    a request sent and an answer awaited."""
    kind = "deferred_test"
    events: list = []

    @property
    def on_host(self) -> bool:
        return False

    def host_column(self, name):
        return None

    def begin_gather(self, local, names, target):
        DeferredShard.events.append("B")
        finish = super().begin_gather(local, names, target)
        return lambda: DeferredShard.events.append("F") or finish()


def test_a_windows_first_and_last_rows_are_both_started_before_either_is_awaited():
    """Session 33: the batch's two gathers of an n-step draw (first rows, last rows) start
    together (``ColumnarStorage.gather_each``): over a shard that answers later, a draw waits once
    for them, not twice. The walk's own gather comes first, and the batch equals a host shard's."""
    rng = np.random.default_rng(4)
    spec = ExperienceSpec.transition(obs_shape=(3,))
    deferred = ExperienceBuffer(spec=spec, capacity=40, seed=1, selector=Prioritized(),
                                shards=[ShardSpec("pageable", 40, kind="deferred_test")])
    host = ExperienceBuffer(spec=spec, capacity=40, seed=1, selector=Prioritized())
    try:
        for i in range(8):
            obs = rng.standard_normal((6, 3)).astype(np.float32)
            data = {"obs": obs[:-1], "next_obs": obs[1:], "action": rng.integers(0, 2, 5),
                    "reward": rng.random(5).astype(np.float32), "terminated": np.zeros(5, bool),
                    "truncated": np.zeros(5, bool)}
            data["terminated"][-1] = i % 3 == 2
            deferred.add(data, source=i % 2)
            host.add(data, source=i % 2)
        for end in ("redraw", "shorten"):
            DeferredShard.events.clear()
            a = deferred.sample(8, n_step=3, episode_end=end)
            b = host.sample(8, n_step=3, episode_end=end)
            assert all(torch.equal(a[k], b[k]) for k in b.keys()), end
            assert "".join(DeferredShard.events).endswith("BFBBFF"), (end, DeferredShard.events)
    finally:
        deferred.close()
        host.close()
