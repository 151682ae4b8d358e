"""The cost model and the auto-tuner: pure predictions, fitting, and a live switch."""

import numpy as np
import pytest

from conduit_core import ExperienceBuffer, ExperienceDataPlane, Prioritized, Schedule
from conduit_core.planning.costmodel import Config, OperatorCost, Profile, enumerate_configs, fit_operator, predict, rank
from conduit_core.planning.tuner import AutoTuner

from ..helpers import SPEC, rollout


def prof(**kw):
    base = dict(base_s=5e-3, priorities_s=1e-4, ingest=OperatorCost(2e-4, 1e-6, 0), deliver=OperatorCost(1e-4, 2e-6, 0),
                rows_per_step=4, rollouts_per_step=1, batch_size=32, transition_bytes=100, staleness=0,
                thread_handoff_s=3e-5, thread_interference=1.0, process_handoff_s=6e-5, process_interference=0.3)
    base.update(kw)
    return Profile(**base)


def test_search_space_has_at_least_32_points():
    assert len(enumerate_configs()) >= 32
    assert len({c.label for c in enumerate_configs()}) == len(enumerate_configs())


def test_sequential_step_is_base_plus_the_path():
    p = prof()
    pr = predict(Config(), p, cores=2)
    assert pr.step_s == pytest.approx(5e-3 + 1e-4 + (2e-4 + 4e-6) + (1e-4 + 64e-6))


def test_overlap_pays_only_when_it_does_not_steal_the_caller():
    heavy = prof(ingest=OperatorCost(3e-3, 0, 0))
    seq = predict(Config(), heavy, cores=2).step_s
    assert predict(Config(mode="overlapped", worker="process"), heavy, cores=2).step_s < seq       # a spare core does the work
    assert predict(Config(mode="overlapped", worker="thread"), heavy, cores=2).step_s >= seq - 1e-9  # the GIL: no gain
    assert predict(Config(mode="overlapped", worker="process"), heavy, cores=1).step_s >= seq - 1e-9  # no spare core


def test_prepared_batches_only_pay_within_the_staleness_bound():
    p0, p16 = prof(staleness=0), prof(staleness=16)
    assert predict(Config(delivery_granularity=4), p0, cores=2).step_s > predict(Config(delivery_granularity=1), p0, cores=2).step_s
    assert predict(Config(delivery_granularity=4), p16, cores=2).step_s < predict(Config(delivery_granularity=1), p16, cores=2).step_s


def test_fit_operator_recovers_fixed_and_per_item_costs():
    true = OperatorCost(1e-4, 2e-6, 0.0)
    samples = [(c, i, 0.0, true(i, 0.0, calls=c)) for c, i in [(1, 4), (0.25, 4), (1, 32), (0.5, 16)]]
    got = fit_operator(samples)
    assert got.fixed_s == pytest.approx(1e-4, rel=1e-6) and got.per_item_s == pytest.approx(2e-6, rel=1e-6)


def test_rank_orders_by_predicted_step_time():
    r = rank(enumerate_configs(), prof(), cores=2)
    assert [x.step_s for x in r] == sorted(x.step_s for x in r)


def test_auto_tuner_calibrates_on_the_live_run_and_switches_without_loss():
    buf = ExperienceBuffer(spec=SPEC, capacity=10_000, selector=Prioritized())
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential())
    tuner = AutoTuner(edp, steps_per_phase=6, settle=(0, 0))
    nid = 0
    for step in range(40):
        edp.ingest(rollout(4, nid), source=step % 2)
        nid += 4
        b = edp.deliver(8)
        edp.update_priorities(b, np.ones(b.size))
        tuner.observe()
    assert tuner.done and tuner.choice is not None and "picked" in tuner.report()
    edp.flush()
    assert len(buf) == nid  # nothing lost across four schedule switches
    edp.close()


def _phase_from(config, p, cores=2):
    """What a profiling phase would measure if the machine followed the model exactly."""
    from conduit_core.planning.costmodel import operator_times
    from conduit_core.planning.tuner import PhaseResult
    pr = predict(config, p, cores=cores)
    i_s, d_s = operator_times(config, p)
    seq = config.mode == "sequential"
    handoff = (i_s + d_s) if seq else (p.thread_handoff_s if config.worker == "thread" else p.process_handoff_s)
    return PhaseResult(config, pr.step_s, {
        "ingest_calls": p.rollouts_per_step / config.ingest_granularity, "ingest_rows": p.rows_per_step, "ingest_busy_s": i_s,
        "deliver_items": p.batch_size, "deliver_busy_s": d_s, "handoff_s": handoff, "priorities_s": p.priorities_s})


def test_profile_from_phases_recovers_the_profile_that_produced_them():
    """The pure half of the auto-tuner (and of `conduit tune`): phases measured on a machine that
    follows the model give back its profile, so the predictions for all 48 points match."""
    from conduit_core.planning.tuner import PHASES, profile_from_phases
    true = prof(staleness=16, thread_interference=0.6, process_interference=0.2)
    phases = [_phase_from(c, true) for c in PHASES]
    got = profile_from_phases(phases, transition_bytes=true.transition_bytes, batch_size=true.batch_size,
                              staleness=true.staleness)
    for c in enumerate_configs():
        assert predict(c, got, cores=2).step_s == pytest.approx(predict(c, true, cores=2).step_s, rel=1e-6), c.label
    assert got.thread_interference == pytest.approx(0.6) and got.process_interference == pytest.approx(0.2)


def test_profile_from_phases_needs_two_sequential_granularities():
    from conduit_core.planning.tuner import profile_from_phases
    with pytest.raises(ValueError, match="two granularities"):
        profile_from_phases([_phase_from(Config(), prof())], transition_bytes=100, batch_size=32, staleness=0)


def test_steady_state_waits_for_the_drift_to_stop():
    from conduit_core.planning.tuner import is_steady
    falling = [1.0 - 0.03 * i for i in range(12)]           # still getting faster by 3% a step
    assert not is_steady(falling, window=4, tol=0.03)
    flat = falling + [0.64, 0.65, 0.64, 0.65, 0.64, 0.65, 0.64, 0.65]
    assert is_steady(flat, window=4, tol=0.03)
    assert not is_steady([0.5] * 7, window=4)               # too few times to compare two windows
    noisy = [0.6, 0.9, 0.6, 0.61, 0.6, 0.59, 0.6, 0.95]      # outliers do not move the medians
    assert is_steady(noisy, window=4, tol=0.03)


def test_auto_tuner_waits_for_a_steady_step_time_before_calibrating(monkeypatch):
    import conduit_core.planning.tuner as tuner_mod
    buf = ExperienceBuffer(spec=SPEC, capacity=100)
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential())
    clock = [0.0]
    monkeypatch.setattr(tuner_mod.time, "perf_counter", lambda: clock[0])
    tuner = AutoTuner(edp, steps_per_phase=3, settle=(4, 100), settle_window=4, settle_tol=0.03)
    steps = [0.30, 0.25, 0.20, 0.16, 0.13, 0.11, 0.10, 0.10, 0.10, 0.10, 0.10, 0.10, 0.10]  # warms up, then flat
    for dt in steps:
        clock[0] += dt
        assert not tuner.settled and "steady" in tuner.report() and edp.schedule == Schedule.sequential()
        tuner.observe()
        if tuner.settled:
            break
    # settled when the median of the last 4 steps came within 3% of the 4 before (12 steps in),
    # not while the step time was still falling
    assert tuner.settled and len(tuner.settle_steps) == 12
    assert tuner.settle_steps[-4:] == pytest.approx([0.10] * 4)
    assert "calibrating" in tuner.report()
    capped = AutoTuner(edp, steps_per_phase=3, settle=(1, 3))
    for _ in range(4):  # never steady (too few steps): calibration starts at the cap anyway
        clock[0] += 0.1
        capped.observe()
    assert capped.settled
    edp.close()


def test_auto_tuner_migrates_the_buffer_to_the_placement_it_picks():
    from conduit_core.planning.tuner import current_placement
    buf = ExperienceBuffer(spec=SPEC, capacity=1000)
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential())
    assert current_placement(buf) == "host"
    tuner = AutoTuner(edp, steps_per_phase=3, settle=(0, 0), placements=("shm",))  # only shm may win
    nid = 0
    while not tuner.done:
        edp.ingest(rollout(4, nid))
        nid += 4
        edp.deliver(8)
        tuner.observe()
    assert tuner.choice.placement == "shm" and current_placement(buf) == "shm"
    assert buf.storage.shards[0].tier.value == "shared"
    edp.flush()
    got = np.sort(buf.storage.read_rows(0, len(buf))["obs"][:, 0].numpy())
    np.testing.assert_array_equal(got, np.arange(nid, dtype=np.float32))  # every row once, after the move
    edp.close()
