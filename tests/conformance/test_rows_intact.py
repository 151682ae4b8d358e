"""deliver/rows_intact and onpolicy/rows_intact: the right ids with wrong contents fail, with the
field, the id, and the expected and delivered values named; a harness that hands back no rows
fails (it declares the path, so a missing piece is a failure, not a skip)."""

import numpy as np
import pytest

from conduit_conformance import check_adapter
from conduit_conformance.examples.conduit_minirl import conformance as example

from .broken_adapter import BrokenHarness

CHECKS = ["deliver/rows_intact", "onpolicy/rows_intact"]


def test_the_broken_adapters_neighbour_rewards_are_caught_with_field_id_and_values():
    report = check_adapter(BrokenHarness("neighbour_rewards"), select=CHECKS)
    for cid in CHECKS:
        detail = report.by_id()[cid].detail
        assert report.by_id()[cid].status == "fail", report.table()
        assert "reward of the row with id" in detail and ", expected " in detail, detail
    assert report.by_id()["deliver/rows_intact"].detail.startswith("uniform replay:")
    assert report.by_id()["onpolicy/rows_intact"].detail.startswith("on-policy, version 0:")


def _corrupted(corrupt):
    """The example adapter with ``corrupt(rows)`` applied to what every delivery hands back."""
    class Session(example.AdapterSession):
        def deliver(self, batch_size, *, policy_version=None):
            d = super().deliver(batch_size, policy_version=policy_version)
            if d.rows is not None and len(d.ids) > 1:
                d.rows = corrupt({k: v.copy() for k, v in d.rows.items()})
            return d

    class Harness(example.AdapterHarness):
        def session(self, **kw):
            return Session(super().session(**kw).store)
    return Harness()


def _float16(rows):
    with np.errstate(over="ignore"):       # ids past 2**22: float16 overflows, as a lossy cast would
        return {**rows, "obs": rows["obs"].astype(np.float16)}


def _roll(field, shift=1):
    return lambda rows: {**rows, field: np.roll(rows[field], shift, axis=0)}


CORRUPTIONS = {
    # corruption of the delivered rows: (the field named, a word of the detail)
    "action_shifted_by_one": (_roll("action"), "action"),
    "next_obs_is_obs": (lambda rows: {**rows, "next_obs": rows["obs"]}, "next_obs"),
    "rewards_of_the_wrong_sign": (lambda rows: {**rows, "reward": -rows["reward"]}, "reward"),
    "terminated_lost": (lambda rows: {**rows, "terminated": np.zeros_like(rows["terminated"])}, "terminated"),
    "truncated_as_terminated": (lambda rows: {**rows, "terminated": rows["terminated"] | rows["truncated"],
                                              "truncated": np.zeros_like(rows["truncated"])}, "terminated"),
    "obs_through_float16": (_float16, "float16"),
    "obs_through_bfloat16": (lambda rows: {**rows, "obs": __import__("torch").from_numpy(rows["obs"]).bfloat16()
                                           .float().numpy()}, "obs"),
    "source_column_lost": (lambda rows: {**rows, "obs": rows["obs"] * np.array([1, 0, 1, 1], np.float32)}, "obs"),
    "framework_names_not_mapped": (lambda rows: {**rows, "rewards": rows.pop("reward")}, "'rewards'"),
    "reward_not_handed_back": (lambda rows: {k: v for k, v in rows.items() if k != "reward"}, "lacks ['reward']"),
    "one_entry_short": (lambda rows: {**rows, "action": rows["action"][:-1]}, "shape"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_each_corruption_is_caught_by_both_checks(name):
    corrupt, word = CORRUPTIONS[name]
    report = check_adapter(_corrupted(corrupt), select=CHECKS)
    for cid in CHECKS:
        r = report.by_id()[cid]
        assert r.status == "fail" and word in r.detail, report.table()


def test_a_harness_without_rows_fails_rather_than_skips():
    report = check_adapter(_corrupted(lambda rows: None), select=CHECKS)
    for cid in CHECKS:
        r = report.by_id()[cid]
        assert r.status == "fail" and "Delivered.rows is None" in r.detail and "declares" in r.detail, report.table()


def test_the_correct_adapter_reports_what_it_compared():
    report = check_adapter(example.harness(), select=CHECKS)
    assert report.ok, report.table()
    assert "uniform replay: 512 rows; prioritized replay: 512 rows" in report.by_id()["deliver/rows_intact"].detail
    assert "fields obs, next_obs, action, reward, terminated, truncated" in report.by_id()["onpolicy/rows_intact"].detail
