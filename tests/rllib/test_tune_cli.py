"""`conduit tune rllib-dqn`, the command docs/benchmarks.md section 8 comes from, end to end at
a tiny size: every configuration is predicted and measured live on one RLlib DQN, the best
and the pick are judged on the confirmation rounds, and the report carries the ranking
statistics (the measurement's own top-8 reproducibility among them)."""

import json
import statistics

from conduit_core.planning.costmodel import enumerate_configs


def test_tune_rllib_dqn_reports_every_configuration(ray_session, tmp_path, capsys):
    from conduit_benchmarks.rllib.tune import main

    out = tmp_path / "tune.json"
    report = main(["--dims", "8", "--rounds", "2", "--confirm-rounds", "2", "--warmup", "1", "--max-warmup", "1",
                   "--steps-per-iter", "20", "--json", str(out)])
    entry = report["dims"][8]
    labels = {c.label for c in enumerate_configs()}
    assert len(labels) >= 32 and set(entry["predicted_s"]) == labels == set(entry["survey_s"])
    confirm = entry["rounds_s_per_step"]["confirm"]
    assert all(len(v) == 2 for v in confirm.values()) and set(confirm) == set(entry["confirmed_s"])
    # the best is the confirmed minimum; the pick is the predicted minimum, measured again
    assert entry["best"] == min(entry["confirmed_s"], key=entry["confirmed_s"].get)
    assert entry["pick"] == min(entry["predicted_s"], key=entry["predicted_s"].get) and entry["pick"] in confirm
    meds = {k: statistics.median(v) for k, v in confirm.items()}
    assert abs(entry["pick_vs_best"] - (meds[entry["pick"]] / meds[entry["best"]] - 1)) < 1e-9
    top = entry["top8"]
    assert top["pairs"] == 28 and 0 <= top["pairs_strict"] <= top["pairs_ok"] <= 28
    assert 0.0 < top["measured_stability"]["p_identical"] <= 1.0 and top["measured_split_half"]["pairs"] == 28
    assert json.loads(out.read_text())["dims"]["8"]["best"] == entry["best"]
    assert "the measurement's own top-8 order" in capsys.readouterr().out
