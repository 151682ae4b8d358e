"""The lab's SB3 bench (``conduit bench sb3-dqn``) at a tiny size: both arms run in turns, the report's ratios are the medians of
the per-round ratios it prints (what docs/benchmarks.md section 19 quotes), and each arm's buffer
was really used (adds and samples timed on both)."""

import json

import numpy as np

from conduit_benchmarks.sb3.dqn import main


def test_the_bench_reports_paired_ratios_of_both_arms(tmp_path):
    out = tmp_path / "r.json"
    report = main(["--steps", "1100", "--rounds", "2", "--out", str(out)])
    assert json.loads(out.read_text())["path_ratio"] == report["path_ratio"]
    for r in report["rounds"]:
        for arm in ("sb3", "conduit"):
            assert r[arm]["add_s"] > 0 and r[arm]["sample_s"] > 0   # DQN trained once past learning_starts
            assert abs(r[arm]["path_s"] - r[arm]["add_s"] - r[arm]["sample_s"]) < 1e-9
    for key, field in (("iteration_ratio", "total_s"), ("path_ratio", "path_s"), ("add_ratio", "add_s")):
        want = np.median([r["conduit"][field] / r["sb3"][field] for r in report["rounds"]])
        assert report[key] == want
