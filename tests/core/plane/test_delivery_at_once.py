"""A sequential schedule drawing one batch per call hands each replay batch out from the call
that draws it (no request, no prepared entry, the n-step windows' columns in one native take):
the same batches, the same RNG sequence and the same counts as the route through the delivery
operator, which a delivery hook still takes; a failed draw counts nothing as sampled."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from conduit_core import ExperienceBuffer, ExperienceDataPlane, Prioritized, Schedule, ShardSpec, Uniform

from ..helpers import SPEC, rollout


def run(selector, *, hook: bool, steps: int, n_step, episode_end: str, fields, seed: int):
    buf = ExperienceBuffer(spec=SPEC, capacity=64, selector=selector, seed=seed)
    hooks = [lambda b: b] if hook else None   # a hook sends every batch through the operator's run
    if hook:   # ... and the windows' columns through gather, not the one-pass take
        buf.storage.takes_fresh = lambda names: False
    out = []
    with ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential(), delivery_hooks=hooks) as edp:
        rng = np.random.default_rng(seed)
        for i in range(steps):
            n = 12 if i == 0 else int(rng.integers(1, 9))   # the first: windows of every n fit
            edp.ingest(rollout(n, 9 * i, done_at=n - 1 if rng.random() < 0.5 else None), source=i % 3)
            b = edp.deliver(6, n_step=n_step, episode_end=episode_end, fields=fields)
            out.append((dict(b), b.slots.copy(), b.seqs.copy(), b.versions.copy(),
                        None if b.weights is None else b.weights.clone()))
            if isinstance(selector, Prioritized):
                edp.update_priorities(b, rng.random(6) + 0.1)
        return out, buf.sampled, buf.rng.bit_generator.state


@settings(max_examples=25, deadline=None)
@given(prioritized=st.booleans(), n_step=st.sampled_from([None, 1, 3, (2, 5)]),
       episode_end=st.sampled_from(["shorten", "redraw"]),
       fields=st.sampled_from([None, ("obs", "action", "reward", "next_obs", "terminated", "truncated"),
                               ("obs", "reward", "next_obs")]), seed=st.integers(0, 2**16))
def test_handed_out_at_once_equals_the_operator_route(prioritized, n_step, episode_end, fields, seed):
    if n_step is None and episode_end == "redraw":
        episode_end = "shorten"
    make = (lambda: Prioritized(alpha=0.6, beta=0.4)) if prioritized else Uniform
    fast = run(make(), hook=False, steps=12, n_step=n_step, episode_end=episode_end, fields=fields, seed=seed)
    slow = run(make(), hook=True, steps=12, n_step=n_step, episode_end=episode_end, fields=fields, seed=seed)
    assert fast[1] == slow[1] and fast[2] == slow[2]   # counts and the RNG where it ends
    for (data_a, *prov_a), (data_b, *prov_b) in zip(fast[0], slow[0]):
        assert list(data_a) == list(data_b)
        for k in data_a:
            assert data_a[k].dtype == data_b[k].dtype and torch.equal(data_a[k], data_b[k]), k
        for a, b in zip(prov_a, prov_b):
            if a is None:
                assert b is None
            else:
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_failed_draw_counts_nothing_as_sampled(monkeypatch):
    buf = ExperienceBuffer(spec=SPEC, capacity=64, selector=Uniform(), seed=0)
    with ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential()) as edp:
        edp.ingest(rollout(20))
        edp.deliver(4)
        before = buf.sampled

        def broken(slots):
            raise RuntimeError("injected: the provenance gather failed")
        monkeypatch.setattr(buf.ring, "gather_meta", broken)
        with pytest.raises(RuntimeError, match="injected"):
            edp.deliver(4)
        assert buf.sampled == before
        monkeypatch.undo()
        assert edp.deliver(4).size == 4 and buf.sampled == before + 4


FIELDS = ("obs", "reward", "next_obs", "terminated")


@pytest.mark.parametrize("hook", [False, True])
@pytest.mark.parametrize("form", ["list", "generator", "numpy int", "tuple"])
def test_every_form_of_fields_and_n_step_delivers_what_the_tuple_form_does(hook, form):
    """A list or generator of fields, and n_step as a list, an array or a numpy int, are read
    as the tuple/int they stand for, whichever route the batch takes."""
    fields, n_step, want_n = {"list": (list(FIELDS), [2, 5], (2, 5)),
                              "generator": ((f for f in FIELDS), np.array([2, 5]), (2, 5)),
                              "numpy int": (FIELDS, np.int64(3), 3), "tuple": ([*FIELDS], (2, 5), (2, 5))}[form]
    got = []
    for f, n in ((fields, n_step), (FIELDS, want_n)):
        buf = ExperienceBuffer(spec=SPEC, capacity=64, selector=Uniform(), seed=3)
        with ExperienceDataPlane(buffer=buf, delivery_hooks=[lambda b: b] if hook else None) as edp:
            edp.ingest(rollout(30, done_at=14))
            got.append(edp.deliver(8, n_step=n, fields=f))
    assert list(got[0]) == [*FIELDS, "n_step"] == list(got[1])
    for k in got[0]:
        assert torch.equal(got[0][k], got[1][k]), k


def test_take_fresh_equals_gather_and_says_what_it_takes():
    buf = ExperienceBuffer(spec=SPEC, capacity=32, selector=Uniform(), seed=0)
    buf.add(rollout(32))
    slots = np.random.default_rng(0).integers(0, 32, 50)
    for names in (FIELDS, tuple(SPEC.names), ("action",), ()):
        assert buf.storage.takes_fresh(names)
        got, want = buf.storage.take_fresh(slots, names), buf.storage.gather(slots, fields=list(names))
        assert list(got) == list(names)
        for k in names:
            assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    assert not buf.storage.takes_fresh(tuple(f"f{i}" for i in range(17)))   # past the native pass's columns
    with pytest.raises(RuntimeError, match="a bug in the draw"):           # slots no draw makes: refused loudly
        buf.storage.take_fresh(np.array([32]), FIELDS)
    buf.close()
    two = ExperienceBuffer(spec=SPEC, capacity=32, selector=Uniform(), seed=0,
                           shards=[ShardSpec("pageable", 16), ShardSpec("pageable", 16)])
    assert not two.storage.takes_fresh(FIELDS)   # two shards: the windows take gather_each
    two.close()


def test_windows_after_a_migration_read_the_new_layout():
    buf = ExperienceBuffer(spec=SPEC, capacity=64, selector=Uniform(), seed=5)
    with ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential()) as edp:
        for i in range(4):
            edp.ingest(rollout(12, 12 * i, done_at=11), source=i)
        before = edp.deliver(16, n_step=3, episode_end="redraw")
        edp.migrate(shards=[ShardSpec("pageable", 32), ShardSpec("pageable", 32)], capacity=64, background=False)
        for i in range(4, 6):
            edp.ingest(rollout(12, 12 * i, done_at=11), source=i)
        after = edp.deliver(16, n_step=3, episode_end="redraw")
        for b in (before, after):   # each window: three steps of one stored episode, read from where it is now
            start = b["obs"][:, 0]
            assert torch.equal(b["next_obs"][:, 0], start + 3) and torch.equal(b["n_step"], torch.full((16,), 3))
            assert torch.equal(b["reward"], torch.full((16,), 1 + 0.99 + 0.99 ** 2, dtype=torch.float32))


@pytest.mark.parametrize("bad, match", [
    (dict(batch_size=True), "batch_size"), (dict(gamma=1), None), (dict(n_step=(True, 3)), "n_step"),
    (dict(fields=("obs", "nope")), "nope"), (dict(episode_end="cut"), "episode_end"), (dict(batch_size=0), "batch_size"),
    (dict(episode_end=["redraw"]), "episode_end"), (dict(fields=(["obs", "reward"],)), "fields")])
def test_remembered_checks_still_refuse_what_only_compares_equal(bad, match):
    """sample()'s checks remember argument tuples that passed; a value equal to an accepted
    one but of another type (True for 1, 1 for 1.0, (True, 3) for (1, 3)) is checked anew."""
    from conduit_core import ConfigError, SpecError
    buf = ExperienceBuffer(spec=SPEC, capacity=32, selector=Uniform(), seed=0)
    buf.add(rollout(32))
    good = dict(batch_size=1, gamma=1.0, n_step=(1, 3), fields=("obs", "reward", "next_obs"), episode_end="shorten")
    for _ in range(2):
        buf.sample(good["batch_size"], **{k: v for k, v in good.items() if k != "batch_size"})
    args = {**good, **bad}
    if match is None:   # an int gamma is a valid discount: checked (not looked up) and accepted
        assert buf.sample(args.pop("batch_size"), **args).size == 1
    else:
        with pytest.raises((ConfigError, SpecError), match=match):
            buf.sample(args.pop("batch_size"), **args)
    buf.close()


def test_a_hook_that_changes_a_rollouts_rows_leaves_the_accepted_count_alone():
    """Rows are counted as accepted (the input's), whatever a hook makes of the rollout."""
    import dataclasses
    buf = ExperienceBuffer(spec=SPEC, capacity=64, selector=Uniform(), seed=0)
    hook = lambda rs: [dataclasses.replace(r, rows=0) for r in rs]
    with ExperienceDataPlane(buffer=buf, ingest_hooks=[hook]) as edp:
        edp.ingest_many([rollout(5), rollout(3, 5)])
        assert edp.metrics().ingest.items_in == 8 and len(buf) == 8
