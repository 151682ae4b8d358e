"""Topology, the pure placement planner and its baselines, and online migration."""


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_core import CapacityError, ConfigError, ExperienceBuffer, ExperienceDataPlane, Prioritized, ShardSpec
from conduit_core.buffer.migration import begin_migration
from conduit_core.planning.placement import (BASELINES, Workload, best_access, conservative_plan, fixed_plan, greedy_plan, plan,
                                     shard_specs)
from conduit_core.planning.topology import Link, TierInfo, Topology, a100_nvlink_8, mi250x_8, probe

from ..helpers import SPEC, rollout


def small_topology(gpu_gb=1.0, pinned_gb=4.0, host_gb=64.0) -> Topology:
    tiers = (TierInfo("host", "pageable", int(host_gb * 1e9)), TierInfo("pinned", "pinned", int(pinned_gb * 1e9)),
             TierInfo("gpu0", "device", int(gpu_gb * 1e9), "cuda:0"))
    links = [Link(a, b, 10.0, 1.0) for a in ("host", "pinned") for b in ("host", "pinned")]
    links += [Link("pinned", "gpu0", 24.0, 10.0), Link("host", "gpu0", 12.0, 15.0), Link("gpu0", "gpu0", 1000.0, 5.0),
              Link("gpu0", "host", 12.0, 15.0), Link("gpu0", "pinned", 24.0, 10.0)]
    return Topology("small", tiers, tuple(links), cores=2)


def test_presets_have_their_documented_links_and_round_trip(tmp_path):
    a = a100_nvlink_8()
    assert a.link("gpu0", "gpu5").bandwidth_GBps == 300.0 and a.link("pinned", "gpu3").bandwidth_GBps > \
        a.link("host", "gpu3").bandwidth_GBps
    m = mi250x_8()
    bws = {m.link("gpu0", f"gpu{j}").bandwidth_GBps for j in range(1, 8)}
    assert len(bws) >= 3  # non-uniform GPU<->GPU links
    assert m.link("gpu0", "gpu1").bandwidth_GBps == 200.0
    for t in (a, m):
        assert t.source
        t.save(str(tmp_path / "t.json"))
        assert Topology.load(str(tmp_path / "t.json")) == t


def test_probe_measures_this_machine():
    t = probe(nbytes=8 << 20, reps=2)
    assert t.link("host", "host").bandwidth_GBps > 0.1 and t.tier("host").capacity_bytes > 0
    assert t.cores >= 1 and t.notes


def test_plan_prefers_the_learners_device_while_it_fits():
    t = small_topology()
    w = Workload(transition_bytes=1000, capacity=100_000, batch_size=256, learner="gpu0")  # 0.1 GB
    p = plan(w, t)
    assert p.fractions() == {"gpu0": 1.0}
    assert p.total_s <= min(fixed_plan(b, w, t).total_s for b in ("pageable", "pinned", "single-gpu"))


def test_plan_spills_by_bandwidth_and_never_exceeds_a_tier():
    t = small_topology(gpu_gb=1.0, pinned_gb=2.0)
    # 20 KB transitions (bandwidth dominates the link latencies), 5 GB in all
    w = Workload(transition_bytes=20_000, capacity=250_000, batch_size=256, inserts_per_step=4, learner="gpu0")
    p = plan(w, t)
    for a in p.assignments:
        assert a.slots * w.transition_bytes <= t.tier(a.tier).capacity_bytes
    assert sum(a.slots for a in p.assignments) == w.capacity
    assert p.fractions().get("pinned", 0) > 0  # faster to the GPU than pageable memory
    with pytest.raises(CapacityError):
        fixed_plan("single-gpu", w, t)
    with pytest.raises(CapacityError):
        greedy_plan(w, t)  # fills the fastest tier, then fails
    assert p.total_s <= conservative_plan(w, t).total_s
    assert "ranked" in p.render() and "gpu0" in p.render()


def test_conservative_takes_the_largest_tier_and_fails_when_it_cannot_hold_the_buffer():
    t = Topology("budgeted-host+node", (TierInfo("host", "pageable", 10**8), TierInfo("node1", "remote", 10**10)),
                 (Link("host", "host", 10.0, 1.0), Link("host", "node1", 1.0, 300.0), Link("node1", "host", 1.0, 300.0)),
                 cores=2)
    w = Workload(transition_bytes=1000, capacity=50_000, batch_size=256)   # 50 MB: fits the host budget
    assert conservative_plan(w, t).fractions() == {"node1": 1.0}           # sized for the worst case anyway
    assert plan(w, t).fractions() == {"host": 1.0}
    assert plan(w, t).total_s < conservative_plan(w, t).total_s
    with pytest.raises(CapacityError, match="conservative: the largest tier node1"):
        conservative_plan(Workload(transition_bytes=1000, capacity=2 * 10**7, batch_size=256), t)


def test_plan_skips_a_tier_whose_latency_outweighs_its_share():
    # pinned holds 10% and shares the host's link to the GPU with pageable memory: for small
    # transitions its extra link latency costs more than its bandwidth saves
    t = small_topology(gpu_gb=0.0, pinned_gb=0.01, host_gb=64.0)
    w = Workload(transition_bytes=100, capacity=1_000_000, batch_size=32, learner="gpu0")
    p = plan(w, t)
    assert p.fractions() == {"host": 1.0}
    big = Workload(transition_bytes=100_000, capacity=1_000, batch_size=256, learner="gpu0")
    t2 = small_topology(gpu_gb=0.0, pinned_gb=0.05, host_gb=64.0)
    assert "pinned" in plan(big, t2).fractions()  # large transitions: worth it


def test_plan_uses_every_gpu_in_parallel_on_the_a100_preset():
    t = a100_nvlink_8()
    w = Workload(transition_bytes=7000, capacity=100_000_000, batch_size=256, inserts_per_step=4, learner="gpu0")
    p = plan(w, t)  # 700 GB: all eight GPUs (560 GB, read in parallel over NVLink) + pinned
    f = p.fractions()
    assert all(f.get(f"gpu{i}", 0) > 0 for i in range(8)) and "pinned" in f
    assert p.total_s < fixed_plan("pageable", w, t).total_s


def test_plan_rejects_what_nothing_can_hold():
    with pytest.raises(CapacityError, match="Fix"):
        plan(Workload(transition_bytes=10**6, capacity=10**6, batch_size=32), small_topology())


def test_every_baseline_runs_on_the_presets():
    w = Workload(transition_bytes=7000, capacity=1_000_000, batch_size=256, learner="gpu0")
    for t in (a100_nvlink_8(), mi250x_8()):
        best = plan(w, t)
        for b in BASELINES:
            assert best.total_s <= fixed_plan(b, w, t).total_s + 1e-12


def test_the_gpu_baselines_on_a_machine_without_gpus_say_so():
    """(all-gpus divided by the GPU count: a ZeroDivisionError on a CPU machine's probe, found by
    running the README's ``conduit plan`` here)"""
    host_only = Topology("cpu", (TierInfo("host", "pageable", int(64e9)),), (Link("host", "host", 10.0, 1.0),), cores=2)
    w = Workload(transition_bytes=7000, capacity=1_000_000, batch_size=32)
    for b in ("all-gpus", "single-gpu"):
        with pytest.raises(CapacityError, match="no GPU tier|no tier"):
            fixed_plan(b, w, host_only)


# ------------------------------------------------------------------ migration
def ids_in_order(buf):
    stt = buf.state_dict()
    seq = stt["meta"]["seq"]
    keep = seq >= buf.inserted - len(buf)
    order = np.argsort(seq[keep])
    return stt["data"]["obs"][keep][order][:, 0].astype(int), stt["data"]["obs"][keep][order][:, 1].astype(int)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.one_of(st.tuples(st.just("ingest"), st.integers(0, 2), st.integers(1, 7)),
                              st.tuples(st.just("deliver")), st.tuples(st.just("step"))), max_size=40),
       grow=st.booleans(), prioritized=st.booleans(), adaptive=st.booleans())
def test_migration_loses_and_duplicates_nothing_under_concurrent_ingest_and_delivery(ops, grow, prioritized,
                                                                                    adaptive):
    cap = 64
    buf = ExperienceBuffer(spec=SPEC, capacity=cap, selector=Prioritized() if prioritized else Uniform())
    nid = 0
    per_src: dict[int, list[int]] = {}
    for _ in range(3):
        buf.add(rollout(5, nid, source_tag=0), source=0)
        per_src.setdefault(0, []).extend(range(nid, nid + 5))
        nid += 5
    new_cap = 96 if grow else cap
    m = begin_migration(buf, shards=[ShardSpec("pageable", new_cap // 2), ShardSpec("shared", new_cap - new_cap // 2)],
                        capacity=new_cap, chunk_bytes=None if adaptive else 4 * SPEC.stored_bytes_per_transition,
                        max_hold_s=1e-6)  # adaptive: chunk sizes change from step to step
    for op in ops:
        if op[0] == "ingest":
            _, src, n = op
            buf.add(rollout(n, nid, source_tag=src), source=src)
            per_src.setdefault(src, []).extend(range(nid, nid + n))
            nid += n
        elif op[0] == "deliver":
            b = buf.sample(8)
            np.testing.assert_array_equal(b["obs"][:, 0].numpy(), b.seqs.astype(np.float32))
        else:
            m.step()
    m.finish()
    assert buf.capacity == new_cap and not buf.migrating
    ids, srcs = ids_in_order(buf)
    live_from = nid - len(buf)
    assert ids.tolist() == list(range(live_from, nid))  # exactly the live rows, once each, in order
    for s, want in per_src.items():
        assert [i for i, x in zip(ids, srcs) if x == s] == [i for i in want if i >= live_from]
    b = buf.sample(64)
    np.testing.assert_array_equal(b["obs"][:, 0].numpy(), b.seqs.astype(np.float32))
    assert (b.seqs >= live_from).all()
    buf.close()


def test_chunks_are_sized_to_hold_the_lock_about_the_target():
    from conduit_core.buffer.migration import next_chunk_rows
    assert next_chunk_rows(1000, 0.004, target_s=0.002, most=10**6) == 500     # too slow: shrink at once
    assert next_chunk_rows(1000, 0.0001, target_s=0.002, most=10**6) == 2000   # fast: at most double
    assert next_chunk_rows(1000, 0.0, target_s=0.002, most=1500) == 1500       # capped
    assert next_chunk_rows(1, 10.0, target_s=0.002, most=100) == 1             # never below one row


def test_background_migration_of_a_large_buffer_copies_in_short_chunks():
    buf = ExperienceBuffer(spec=SPEC, capacity=20_000)
    buf.add(rollout(20_000))
    m = begin_migration(buf, shards=[ShardSpec("shared", 30_000)], capacity=30_000, max_hold_s=0.0005)
    while not m.step():   # the background thread's steps (finish() copies what is left in the largest chunks)
        pass
    m.finish()
    assert m.chunks > 1 and len(buf) == 20_000 and buf.capacity == 30_000
    with pytest.raises(ConfigError, match="max_hold_s"):
        begin_migration(buf, shards=[ShardSpec("pageable", 30_000)], max_hold_s=0)


def test_growing_capacity_keeps_filling_after_the_swap():
    buf = ExperienceBuffer(spec=SPEC, capacity=20)
    buf.add(rollout(20))
    begin_migration(buf, shards=[ShardSpec("pageable", 50)], capacity=50).finish()
    buf.add(rollout(25, 20))
    assert len(buf) == 45 and buf.capacity == 50
    with pytest.raises(ConfigError, match="shrinking"):
        begin_migration(buf, shards=[ShardSpec("pageable", 10)], capacity=10)


def test_data_plane_migrates_in_the_background_while_serving():
    from conduit_core import Schedule
    buf = ExperienceBuffer(spec=SPEC, capacity=1000)
    with ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped()) as edp:
        for i in range(20):
            edp.ingest(rollout(10, 10 * i), source=i % 3)
        handle = edp.migrate(shards=[ShardSpec("shared", 1000), ShardSpec("pageable", 1000)], capacity=2000)
        for i in range(20, 40):
            edp.ingest(rollout(10, 10 * i), source=i % 3)
            edp.deliver(16)
        handle.wait()
        edp.flush()
        assert buf.capacity == 2000 and len(buf) == 400
        ids, _ = ids_in_order(buf)
        assert ids.tolist() == list(range(400))


from conduit_core import Uniform  # noqa: E402  (used in the property test's strategy)


def with_mapped_link(t: Topology, bw: float) -> Topology:
    return Topology(t.name, t.tiers, t.links + (Link("mapped:pinned", "gpu0", bw, 5.0),), t.cores)


def test_gear_reads_pinned_memory_in_place_and_skips_the_host_gather():
    t = small_topology()
    w = Workload(transition_bytes=20_000, capacity=100_000, batch_size=256, learner="gpu0")
    pinned, gear = fixed_plan("pinned", w, t), fixed_plan("gear", w, t)
    assert [a.access for a in pinned.assignments] == ["copy"] and [a.access for a in gear.assignments] == ["mapped"]
    rows = 256 * 20_000
    # copy: host gather at the host's 10 GB/s plus the 24 GB/s DMA link; mapped: the link alone
    assert pinned.delivery_s == pytest.approx(10e-6 + rows / 24e9 + rows / 10e9)
    assert gear.delivery_s == pytest.approx(10e-6 + rows / 24e9)


def test_best_access_follows_the_measured_mapped_link():
    t = small_topology()
    w = Workload(transition_bytes=20_000, capacity=100_000, batch_size=256, learner="gpu0")
    assert best_access(w, with_mapped_link(t, 20.0), "pinned") == "mapped"   # no gather beats a 4 GB/s loss
    assert best_access(w, with_mapped_link(t, 3.0), "pinned") == "copy"      # in-place reads too slow
    assert best_access(w, t, "host") == "copy"                               # pageable memory cannot be mapped
    cpu = Workload(transition_bytes=20_000, capacity=100_000, batch_size=256, learner="host")
    assert best_access(cpu, t, "pinned") == "copy"                           # a CPU learner reads host memory


def test_plan_uses_mapped_pinned_memory_when_it_spills_past_the_gpu():
    t = with_mapped_link(small_topology(gpu_gb=1.0, pinned_gb=8.0), 20.0)
    w = Workload(transition_bytes=20_000, capacity=250_000, batch_size=256, learner="gpu0")  # 5 GB
    p = plan(w, t)
    access = {a.tier: a.access for a in p.assignments}
    assert access.get("pinned") == "mapped" and "read in place" in p.render()
    specs = shard_specs(p, t)
    assert {(s.tier.value, s.access) for s in specs} >= {("pinned", "mapped")}
    assert sum(s.capacity for s in specs) == w.capacity
    for b in BASELINES:
        try:
            assert p.total_s <= fixed_plan(b, w, t).total_s + 1e-12
        except CapacityError:
            pass
