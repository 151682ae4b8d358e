"""The convergence check's runs go side by side in worker processes: results in call order, a failure
raised, a dead worker a failure and never a hang, a run that cannot be sent (a closure) run here."""

import os
from concurrent.futures.process import BrokenProcessPool

import pytest

from conduit_conformance import checks_convergence as cc

from . import convergence_runs

CALLS = [("native", 0), ("conduit", 0), ("native", 1), ("conduit", 1)]


def test_runs_go_to_other_processes_and_come_back_in_call_order(monkeypatch):
    monkeypatch.setenv(cc.WORKERS_ENV, "2")
    results = cc.run_all(convergence_runs.where, CALLS)
    assert [(r.returns[0], r.returns[1]) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    pids = {r.env_steps for r in results}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


def test_one_worker_or_a_closure_runs_here_one_after_the_other(monkeypatch):
    monkeypatch.setenv(cc.WORKERS_ENV, "1")
    assert {r.env_steps for r in cc.run_all(convergence_runs.where, CALLS)} == {os.getpid()}
    monkeypatch.setenv(cc.WORKERS_ENV, "2")
    closure = lambda path, seed: convergence_runs.where(path, seed)   # noqa: E731 - cannot be pickled
    assert {r.env_steps for r in cc.run_all(closure, CALLS)} == {os.getpid()}


def test_a_failed_run_raises_and_a_dead_worker_fails_the_call_without_hanging(monkeypatch):
    monkeypatch.setenv(cc.WORKERS_ENV, "2")
    with pytest.raises(ValueError, match="run native 1 failed"):
        cc.run_all(convergence_runs.fails, CALLS)
    with pytest.raises(BrokenProcessPool):
        cc.run_all(convergence_runs.dies, CALLS)


def test_the_worker_count_is_checked_and_bounded(monkeypatch):
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv(cc.WORKERS_ENV, bad)
        with pytest.raises(ValueError, match=cc.WORKERS_ENV):
            cc.workers(4)
    monkeypatch.setenv(cc.WORKERS_ENV, "8")
    assert cc.workers(4) == 4 and cc.workers(1) == 1
    monkeypatch.delenv(cc.WORKERS_ENV)
    assert 1 <= cc.workers(100) <= cc.DEFAULT_MAX_WORKERS


def test_the_calibrated_bound_has_the_false_alarm_rate_it_states():
    """With the native spread declared, two equal arms fall outside the bound with probability 0.1%
    (log-steps normal with that sd), simulated over 200,000 seeded pairs of k-seed arms; and a change
    as large as the detectable ratio is caught 80% of the time."""
    import numpy as np
    rng = np.random.default_rng(0)
    for spread, k in ((0.38, 2), (0.16, 2), (0.16, 5)):
        bound = np.log(cc.ratio_bound(k, spread))
        same = rng.normal(0, spread, (200_000, 2, k)).mean(axis=2)   # (the mean of log-steps per arm)
        alarms = np.mean(np.abs(same[:, 1] - same[:, 0]) > bound)
        assert 0.0003 < alarms < 0.002, (spread, k, alarms)
        shift = np.log(cc.detectable_ratio(k, spread))
        caught = np.mean(np.abs(same[:, 1] + shift - same[:, 0]) > bound)
        assert 0.77 < caught < 0.83, (spread, k, caught)
    assert cc.ratio_bound(2) == 2.5 and cc.ratio_bound(5) == 2.0   # undeclared: the fixed bounds
    # the statistic simulated above is the one compare() computes with a declared spread
    for _ in range(20):
        n, c = np.exp(rng.normal(9, 0.3, 3)), np.exp(rng.normal(9, 0.3, 3))
        ratio, p, bound = cc.compare(list(n), list(c), 0.3)
        assert p is None and np.isclose(ratio, np.exp(np.log(c).mean() - np.log(n).mean()))
        assert bound == cc.ratio_bound(3, 0.3)


def test_calibration_measures_the_native_spread(monkeypatch):
    monkeypatch.setenv(cc.WORKERS_ENV, "1")
    from conduit_conformance.examples.conduit_minirl.conformance import harness
    out = cc.calibrate(harness(), [0, 1, 2])
    assert set(out) == {"bandit"} and len(out["bandit"]["steps"]) == 3
    assert out["bandit"]["spread"] >= 0 and out["bandit"]["bound_2_seeds"] >= 1.0


def test_a_declared_spread_must_be_a_plausible_sd():
    for bad in (0, -0.1, 12, "0.3", True):
        with pytest.raises(ValueError, match="convergence_spread"):
            cc.check_spread("w", bad)


def test_the_verdict_is_a_function_of_the_runs():
    """``judge``: the check's decision on stored runs (what the lab's power study replays). A run
    that misses the threshold counts as the largest budget; a path that never reaches it while the
    other always does fails whatever the ratio; the ratio must lie within the bound both ways."""
    same = cc.judge([1000, 1200], [True, True], [1100, 1150], [True, True], 0.2)
    assert same.ok and same.failure == "" and same.p is None and same.bound == cc.ratio_bound(2, 0.2)
    slow = cc.judge([1000, 1200], [True, True], [3000, 3300], [True, True], 0.2)
    assert not slow.ok and "learns slower" in slow.failure and slow.ratio > slow.bound
    fast = cc.judge([3000, 3300], [True, True], [1000, 1200], [True, True], 0.2)
    assert not fast.ok and "learns faster" in fast.failure
    never = cc.judge([1000, 1100], [True, True], [1200, 1200], [False, False], 5.0)   # within a wide bound ...
    assert not never.ok and "never reaches" in never.failure                      # ... but never reached
    always = cc.judge([1200, 1200], [False, False], [1000, 1100], [True, True], 5.0)
    assert not always.ok and "native on none" in always.failure
    undeclared = cc.judge([10, 11, 12, 13, 14], [True] * 5, [30, 31, 32, 33, 34], [True] * 5)
    assert not undeclared.ok and undeclared.bound == 2.0 and undeclared.p is not None
