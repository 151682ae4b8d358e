"""The data plane's short routes (a sequential ingest stored inline; a replay batch drawn by the
call that hands it out, ``InlineDelivery``) and the state they are chosen by: each is left when
what allows it changes (a delivery hook added, a reschedule), reads the layout a migration made,
and counts a failed or refused call in the metrics as the general routes do."""

import numpy as np
import pytest
import torch

from conduit_core import (ClosedError, ExperienceBuffer, ExperienceDataPlane, Prioritized, Schedule, ShardSpec,
                          SpecError, Uniform)

from ..helpers import SPEC, rollout


def make(schedule=None, selector=None, capacity=256, **kw):
    buf = ExperienceBuffer(spec=SPEC, capacity=capacity, selector=selector or Uniform(), seed=3)
    return ExperienceDataPlane(buffer=buf, schedule=schedule or Schedule.sequential(), **kw)


def test_a_delivery_hook_added_later_runs_on_every_batch_after_it():
    seen = []

    def hook(batch):
        seen.append(batch.size)
        return batch
    with make() as edp:
        edp.ingest(rollout(40))
        edp.deliver(8)
        edp.deliver(8, n_step=3, episode_end="redraw")
        assert not seen
        edp.add_delivery_hook(hook)
        edp.deliver(8)
        edp.deliver(8, n_step=3, episode_end="redraw")
        assert seen == [8, 8]


@pytest.mark.parametrize("selector", [Uniform, Prioritized])
def test_a_reschedule_round_trip_delivers_what_a_sequential_plane_delivers(selector):
    """sequential -> overlapped (staleness 0) -> sequential, delivering in each: the same batches,
    rows and priorities as a plane that stayed sequential."""
    def run(switch: bool):
        out = []
        with make(selector=selector()) as edp:
            for phase, schedule in enumerate((None, Schedule.overlapped(), Schedule.sequential())):
                if switch and schedule is not None:
                    edp.reschedule(schedule)
                for i in range(6):
                    edp.ingest(rollout(5, 30 * phase + 5 * i), source=i % 2)
                    b = edp.deliver(8, n_step=(1, 3), episode_end="redraw")
                    out.append((b.seqs.copy(), b["obs"].clone(), b["reward"].clone()))
                    if selector is Prioritized:
                        edp.update_priorities(b, np.random.default_rng(i).random(8) + 0.1)
        return out
    for (sa, oa, ra), (sb, ob, rb) in zip(run(False), run(True), strict=True):
        np.testing.assert_array_equal(sa, sb)
        assert torch.equal(oa, ob) and torch.equal(ra, rb)


def test_prioritized_windows_and_updates_after_a_growing_migration_use_the_new_trees():
    alpha = 0.6
    with make(selector=Prioritized(alpha=alpha), capacity=64) as edp:
        for i in range(4):
            edp.ingest(rollout(12, 12 * i, done_at=11), source=i)
        edp.migrate(shards=[ShardSpec("pageable", 96), ShardSpec("pageable", 96)], capacity=192, background=False)
        selector = edp.buffer.selector
        sums, mins, size = selector.trees
        assert sums is selector.index.trees()[0] and mins is selector.index.trees()[1] and size >= 192
        b = edp.deliver(16, n_step=3, episode_end="redraw")
        start = b["obs"][:, 0]
        assert torch.equal(b["next_obs"][:, 0], start + 3)   # each window three steps of one stored episode
        priorities = np.linspace(0.5, 2.0, 16)
        assert edp.update_priorities(b, priorities) == 16
        last = {int(s): p for s, p in zip(b.slots, priorities)}   # (a slot drawn twice: the later priority)
        slots = np.array(sorted(last))
        np.testing.assert_allclose(selector.index.get(slots), (np.array([last[s] for s in slots]) + selector.eps) ** alpha)
        assert sums[1] == pytest.approx(selector.index.total)
        for _ in range(20):   # only stored rows are drawn from the grown ring's trees
            b = edp.deliver(16, n_step=3, episode_end="redraw")
            assert set(b.seqs.tolist()) <= set(range(48))


def test_failed_and_refused_calls_count_as_calls_on_the_short_routes():
    with make(selector=Prioritized(alpha=0.6)) as edp:
        edp.ingest(rollout(20))
        b = edp.deliver(8)
        before = edp.metrics()
        with pytest.raises(SpecError):
            edp.ingest_many([{**rollout(3), "reward": np.ones(2, np.float32)}])
        with pytest.raises(Exception):
            edp.deliver(8, n_step=(True, 3))
        with pytest.raises(SpecError):
            edp.update_priorities(b, np.ones(3))
        after = edp.metrics()
        for point in ("ingest", "deliver", "priorities"):
            was, now = getattr(before, point), getattr(after, point)
            assert now.calls == was.calls + 1, point
            assert now.blocked_s > was.blocked_s, point
        assert after.ingest.items_in == before.ingest.items_in and after.deliver.items_out == before.deliver.items_out
    with pytest.raises(ClosedError):
        edp.ingest_many([rollout(2)])
    assert edp.metrics().ingest.calls == after.ingest.calls + 1   # a refused call counts too
