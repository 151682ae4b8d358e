"""The conformance suite itself: it passes a correct adapter, fails exactly the right
checks on a broken one (each check is shown able to fail), handles expected failures,
and is reachable from Python, pytest and the CLI."""

import json
import subprocess
import sys

import pytest

from conduit_conformance import REGISTRY, ConformanceTests, check_adapter, load_harness
from conduit_conformance.checks_convergence import SEEDS_ENV
from conduit_conformance.examples.conduit_minirl.conformance import harness as example_harness

from .broken_adapter import ASYNC_FAULTS, FAULTS, BrokenHarness


def failed(report):
    return {r.id for r in report.results if r.status == "fail"}


# minirl has no n-step or sequence sampling, no prioritized buffer of its own and discrete actions
# only (a bandit's arms); the RLlib and SRL adapters' mutations show these can fail
# (tests/rllib/test_rllib_mutations.py: continuous actions narrowed or taken as discrete)
# (each shown able to fail elsewhere: the time-major checks in test_time_major_checks.py)
NOT_IN_MINIRL = {cid for cid, c in REGISTRY.items() if c.needs & {"nstep", "sequences", "continuous", "time_major"}} | {
    "equivalence/prioritized_matches_native"}


def test_correct_adapter_passes_every_check():
    report = check_adapter(example_harness(), level="convergence")
    assert report.ok, report.table()
    status = {r.id: r.status for r in report.results}
    assert {s for cid, s in status.items() if cid not in NOT_IN_MINIRL} == {"pass"}
    assert {status[cid] for cid in NOT_IN_MINIRL} == {"skip"}  # skipped, with the capability named
    assert len(report.results) == len(REGISTRY)  # every check ran


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_broken_adapter_fails_exactly_the_checks_guarding_the_broken_promise(fault, monkeypatch):
    monkeypatch.setenv(SEEDS_ENV, "0,1")   # the CI seeds, whatever the caller's environment asks for
    # an async fault lives in async_queue() alone, which only the async checks call: the rest of the
    # suite would run the example adapter unchanged (and pass, as the test above shows)
    select = ["async/"] if fault in ASYNC_FAULTS else None
    report = check_adapter(BrokenHarness(fault), level="convergence", select=select)
    assert failed(report) == FAULTS[fault], report.table()


def test_every_check_is_shown_able_to_fail():
    caught = set().union(*FAULTS.values())
    expected = {cid for cid in REGISTRY if not cid.endswith("/*") and cid not in NOT_IN_MINIRL} | {"convergence/bandit"}
    assert expected <= caught, f"checks no fault exercises: {sorted(expected - caught)}"


def test_every_failure_is_collected_not_only_the_first():
    report = check_adapter(BrokenHarness("drop"))
    assert len(failed(report)) >= 2 and len(report.results) >= 11


def test_expected_failures_need_a_reason_and_fail_when_they_pass(tmp_path):
    from conduit_conformance.runner import load_xfails
    bad = tmp_path / "x.txt"
    bad.write_text("ingest/exactly_once\n")
    with pytest.raises(ValueError, match="reason"):
        load_xfails(str(bad))
    good = tmp_path / "y.txt"
    good.write_text("# known\ningest/source_order: reorders by design\ningest/exactly_once: should pass\n")
    report = check_adapter(BrokenHarness("reorder"), xfails=load_xfails(str(good)))
    st = {r.id: r.status for r in report.results}
    assert st["ingest/source_order"] == "xfail"
    assert st["ingest/exactly_once"] == "xpass" and not report.ok


def test_report_header_names_versions_and_seed():
    report = check_adapter(example_harness(), seed=3, select=["ingest/*"])
    h = report.header
    assert h["conduit"] and h["adapter"] == "conduit_minirl" and h["framework"] == "minirl" and h["seed"] == 3
    assert "framework minirl 0.1" in report.table() and "seed 3" in report.table()
    assert all(r.id.startswith("ingest/") for r in report.results)


def test_cli_prints_table_writes_report_and_sets_exit_code(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "conduit_core.cli", "conformance", "example", "--report", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ingest/exactly_once" in r.stdout and "PASS" in r.stdout
    assert json.loads(out.read_text())["ok"] is True
    r = subprocess.run([sys.executable, "-m", "conduit_core.cli", "conformance",
                        "tests.conformance.broken_adapter:BrokenHarness"], capture_output=True, text=True)
    assert r.returncode != 0


def test_the_documented_pytest_entry_point_runs_the_suite(tmp_path):
    """``pytest --conduit-adapter=NAME --pyargs conduit_conformance.suite`` (writing-an-adapter.md),
    from a user's own folder: pytest imported suite.py as ``conformance.suite`` and its relative
    imports made a second Harness class, so every test errored (found by trying the docs)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        "--conduit-adapter=example", "--pyargs", "conduit_conformance.suite"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and " passed" in r.stdout and " error" not in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]


def test_load_harness_errors_are_clear():
    with pytest.raises(ValueError, match="module:factory"):
        load_harness("nope")
    # a Session class given where a Harness is expected (found by a user trying the docs)
    with pytest.raises(TypeError, match="expected a conformance.Harness.*Fix"):
        load_harness("conduit_conformance.examples.conduit_minirl.conformance:AdapterSession")


def test_a_delivery_drawn_one_call_ahead_is_caught_at_every_seed():
    """A prefetching path's first batch is fresh (nothing drawn ahead yet): counted, it let a stale
    adapter pass at most seeds (found in review); the check leaves that call out."""
    for seed in range(20):
        stale = check_adapter(BrokenHarness("stale_by_one"), seed=seed, select=["deliver/sees_newest"])
        fresh = check_adapter(example_harness(), seed=seed, select=["deliver/sees_newest"])
        assert [r.status for r in stale.results] == ["fail"], (seed, stale.table())
        assert [r.status for r in fresh.results] == ["pass"], (seed, fresh.table())


def test_a_misspelt_capability_is_refused_naming_the_valid_ones():
    harness = example_harness()
    harness.capabilities = frozenset({"replay", "prioritised"})   # (an instance attribute: this harness only)
    with pytest.raises(ValueError, match=r"capabilities.*'prioritised'.*Fix"):
        check_adapter(harness)


def test_a_session_without_update_priorities_or_state_says_which_capability_needs_them():
    from conduit_conformance.harness import Session

    class Minimal(Session):   # what an adapter declaring 'prioritized' or 'state' may forget
        def ingest(self, rollout): ...
        def deliver(self, batch_size, *, policy_version=None): ...
        def stored_ids(self): ...
    with pytest.raises(NotImplementedError, match="Minimal has no update_priorities.*'prioritized'.*Fix"):
        Minimal().update_priorities(None, None)
    for call in (lambda s: s.state(), lambda s: s.load_state(None)):
        with pytest.raises(NotImplementedError, match="capability 'state'.*Fix"):
            call(Minimal())


def test_scaffolded_adapter_passes_the_suite_out_of_the_box(tmp_path):
    from conduit_conformance.scaffold import scaffold
    scaffold("toyfw", tmp_path)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "conduit_toyfw/tests"],
                       cwd=tmp_path, capture_output=True, text=True, env={**__import__("os").environ,
                                                                          "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # the semantic checks of its capabilities (the async ones included: they ran from pytest only once
    # conformance.testing imported checks_async, found with the time-major checks)
    assert "22 passed" in r.stdout


def test_the_pytest_base_class_runs_every_registered_check():
    """ConformanceTests' parameters are read when conformance.testing is imported: a check module
    not imported by then was never run from pytest (the n-step, sequence and row checks were not)."""
    from conduit_conformance.testing import ConformanceTests
    # the ids pytest was given when the class was defined, not the registry as it is now
    (mark,) = [m for m in ConformanceTests.test_check.pytestmark if m.name == "parametrize"]
    assert sorted(mark.args[1]) == sorted(REGISTRY)


class TestExampleAdapterThroughTheBaseClass(ConformanceTests):
    """The base class an adapter author subclasses, used on the in-repo example adapter."""

    level = "convergence"

    def make_harness(self):
        return example_harness()


def test_cli_finds_a_scaffolded_adapter_in_the_current_folder(tmp_path):
    """Right after `conduit new-adapter`, `conduit conformance pkg.conformance:harness` runs from the
    folder that holds the package, without PYTHONPATH; a package that is nowhere says where it looked."""
    import os
    from conduit_conformance.scaffold import scaffold
    scaffold("toyfw", tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "conduit_core.cli", "conformance", "conduit_toyfw.conformance:harness",
                        "-k", "ingest/"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "conduit_core.cli", "conformance", "conduit_nowhere.conformance:harness"],
                       cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "conduit_nowhere" in r.stderr and "pip install -e" in r.stderr


def test_nothing_passes_silently_a_filter_that_selects_nothing_is_an_error(tmp_path):
    report = check_adapter(example_harness(), select=["nosuchcheck"])
    assert not report.ok and [r.id for r in report.results] == ["select:nosuchcheck"]
    r = subprocess.run([sys.executable, "-m", "conduit_core.cli", "conformance", "example", "-k", "nosuchcheck"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "selects no check" in r.stdout


def test_what_is_not_certified_is_listed_and_a_required_capability_cannot_be_skipped():
    report = check_adapter(example_harness())
    assert report.ok
    assert set(report.not_certified) == {"nstep", "sequences", "continuous", "time_major"}
    assert "deliver/nstep_rows_true" in report.not_certified["nstep"]
    assert "not certified" in report.table() and json.loads(report.to_json())["not_certified"] == report.not_certified
    required = check_adapter(example_harness(), require=["nstep"])
    assert not required.ok
    assert failed(required) == set(report.not_certified["nstep"])
    with pytest.raises(ValueError, match="require"):
        check_adapter(example_harness(), require=["n-step"])


def test_a_harness_written_for_the_old_schedule_argument_still_runs_with_a_warning():
    """``Harness.session(schedule=)`` became ``mode=``: an outside harness keeps working for a
    release, warned, instead of failing three checks with a TypeError."""
    from conduit_conformance.examples.conduit_minirl.conformance import AdapterHarness

    class OldHarness(AdapterHarness):
        def session(self, *, seed, capacity=10_000, prioritized=False, alpha=None, onpolicy=False,
                    schedule="sequential", staleness=0):
            return super().session(seed=seed, capacity=capacity, prioritized=prioritized, alpha=alpha,
                                   onpolicy=onpolicy, mode=schedule, staleness=staleness)

    with pytest.warns(DeprecationWarning, match="mode="):
        report = check_adapter(OldHarness(), select=["overlap", "staleness", "sees_newest"])
    assert report.ok and {r.status for r in report.results} == {"pass"}, report.table()


def test_a_scaffolded_adapter_installs_as_a_package_and_registers_its_harness(tmp_path):
    """`conduit new-adapter` makes an installable package: built and installed (here into a folder
    of its own, not this environment), its harness is found by name, and it passes the suite."""
    from conduit_conformance.scaffold import scaffold
    pkg = scaffold("toyfw2", tmp_path / "src")
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(site), str(pkg)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    env = {**__import__("os").environ, "PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, "-m", "conduit_core.cli", "conformance", "toyfw2", "-k", "ingest/"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "adapter conduit_toyfw2" in r.stdout and "3 pass" in r.stdout


def test_the_eviction_message_shows_duplicates_a_set_difference_would_hide():
    import numpy as np
    from conduit_conformance.checks_semantic import held_difference
    msg = held_difference(np.array([1, 2, 2, 3]), np.array([1, 2, 3, 4]))
    assert "more than once: [2]" in msg and "not (as often) by the adapter: 4" in msg
    assert "whole-episode" not in msg                      # it describes, it does not guess a cause
