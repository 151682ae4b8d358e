"""The ranking statistics `conduit tune` judges its top-8 prediction with."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core.planning.ranking import concordant_pairs, order_stability, pair_agreement, split_half


def test_pair_agreement_counts_strict_and_tied_pairs():
    times = {"a": 1.00, "b": 1.02, "c": 1.30}
    assert pair_agreement(["a", "b", "c"], times, 0.0) == {"identical": True, "pairs_ok": 3, "pairs_strict": 3,
                                                           "pairs": 3}
    # b predicted before a: wrong strictly, but a and b differ by 2%, a tie within a 5% resolution
    got = pair_agreement(["b", "a", "c"], times, 0.05)
    assert got == {"identical": False, "pairs_ok": 3, "pairs_strict": 2, "pairs": 3}
    assert pair_agreement(["c", "a", "b"], times, 0.05)["pairs_ok"] == 1


def test_well_separated_configurations_have_a_stable_order():
    rng = random.Random(1)
    runs = {f"c{i}": [1.0 + 0.1 * i + rng.gauss(0, 0.005) for _ in range(6)] for i in range(8)}
    stab = order_stability(runs, list(runs), resamples=300)
    assert stab["p_identical"] == 1.0 and stab["mean_pairs"] == stab["pairs"] == 28
    half = split_half(runs)
    assert half == {"identical": True, "pairs_agree": 28, "pairs": 28}


def test_ties_have_an_order_the_measurement_does_not_reproduce():
    rng = random.Random(2)
    runs = {f"c{i}": [1.0 + rng.gauss(0, 0.05) for _ in range(6)] for i in range(8)}
    stab = order_stability(runs, list(runs), resamples=500)
    assert stab["p_identical"] < 0.05            # 8 tied configurations: 8! orders
    assert stab["mean_pairs"] < 0.9 * 28


def test_rounds_are_resampled_together_so_shared_drift_cancels():
    # Every round shifts all configurations alike (the machine drifted); the order within a
    # round never changes, so a joint resample keeps it, an independent one would not.
    drift = [0.0, 0.3, -0.2, 0.5, 0.1, -0.4]
    runs = {f"c{i}": [1.0 + 0.01 * i + d for d in drift] for i in range(8)}
    assert order_stability(runs, list(runs), resamples=300)["p_identical"] == 1.0


def test_unaligned_or_single_rounds_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="runs: every configuration needs the same number of rounds"):
        order_stability({"a": [1.0, 1.1], "b": [1.0]}, ["a", "b"])
    with pytest.raises(ValueError, match="runs: need at least 2 rounds"):
        split_half({"a": [1.0], "b": [2.0]})


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3),
                       st.floats(0.1, 10.0, allow_nan=False), min_size=2, max_size=9))
def test_concordance_is_complete_for_the_sorted_order_and_symmetric_under_reversal(times):
    order = sorted(times, key=times.get)
    n = len(order) * (len(order) - 1) // 2
    assert concordant_pairs(order, times) == n
    distinct = len(set(times.values())) == len(times)
    if distinct:  # reversing a strict order makes every pair discordant
        assert concordant_pairs(order[::-1], times) == 0
    assert pair_agreement(order, times, 0.0)["identical"]
