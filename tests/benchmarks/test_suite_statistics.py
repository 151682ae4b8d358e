"""The lab's studies of the suite's own statistics (``benchmarks/suite``) at a tiny size: the power study
of the convergence check replays the check's own decision on a pool of native runs (its rates are
deterministic for its seeds, and a change far outside the bound is caught every time); the false-alarm
study runs the semantic level over suite seeds and counts failures by check."""

import pytest

pytest.importorskip("conduit_benchmarks", reason="the lab is its own distribution: pip install -e benchmarks")


def test_the_power_study_replays_the_checks_decision(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUIT_CONVERGENCE_WORKERS", "1")
    from conduit_benchmarks.suite import convergence_power as cp
    argv = ["--pool", "12", "--seeds", "2", "--trials", "300", "--shift", "10", "--json", str(tmp_path / "p.json")]
    one, two = cp.main(argv), cp.main(argv)
    (r,) = one["workloads"]["bandit"]
    assert one["workloads"] == two["workloads"]          # seeded runs, seeded pairs
    assert r["pool"] == 12 and r["k"] == 2 and r["spread"] > 0
    for bound in ("calibrated", "fixed"):
        assert 0.0 <= r[bound]["false_alarms"] <= 1.0
        assert r[bound]["caught_slower"] == r[bound]["caught_faster"] == 1.0   # 10x: far outside any bound here
    with pytest.raises(SystemExit, match="fewer than the 14"):
        cp.power([1, 2, 3], [True] * 3, k=7, trials=1, shift=1.5)


def test_the_false_alarm_study_counts_failures_by_check(tmp_path):
    """The semantic level over suite seeds on the example adapter (exact by construction): every
    check that ran is counted on every seed, and none failed."""
    from conduit_benchmarks.suite import false_alarms
    r = false_alarms.main(["--harness", "example", "--seeds", "2", "--json", str(tmp_path / "f.json")])
    assert r["seeds"] == 2 and r["checks"] > 10 and r["check_runs"] == 2 * r["checks"]
    assert r["failed_runs"] == 0 and r["failed"] == {}
