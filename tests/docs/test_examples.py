"""The docs' examples run as written, and the buffer follows what they define: a consuming
selector of one's own (LIFO) is asked by take() and its rows leave; a codec of one's own stores
and decodes exactly on every delivery route, and round-trips through a spec's config and a
buffer's saved state."""

import importlib.util
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from conduit_core import (ConfigError, ExperienceBuffer, ExperienceDataPlane, ExperienceSpec, Fifo, RateLimitTimeout,
                          Schedule, Selector, Uniform)

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_each_example_runs_as_a_script(path):
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def rows(values, spec_obs=(1,)):
    n = len(values)
    v = np.asarray(values, np.float32)
    return {"obs": v.reshape(n, 1), "action": np.zeros(n, np.int64), "reward": v, "next_obs": v.reshape(n, 1) + 1,
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}


def test_lifo_take_follows_the_selector_against_a_stack():
    lifo = load("lifo_selector")
    assert lifo.main() == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    calls = []

    class CountedLifo(lifo.Lifo):
        def select(self, batch_size, size, rng):
            calls.append((batch_size, size))
            return super().select(batch_size, size, rng)

    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(1,)), capacity=8, selector=CountedLifo())
    stack, rng, nxt = [], np.random.default_rng(3), 0
    for _ in range(300):
        # a ring frees slots oldest first: room is what lies beyond the oldest queued row
        room = 8 - (nxt - (min(stack) if stack else nxt))
        if rng.random() < 0.5 and room > 0:
            n = int(rng.integers(1, room + 1))
            buf.add(rows(range(nxt, nxt + n)))
            stack += list(range(nxt, nxt + n))
            nxt += n
        elif stack:
            k = int(rng.integers(1, len(stack) + 1))
            got = buf.take(k)["reward"].tolist()
            want = [float(stack.pop()) for _ in range(k)]
            assert got == want
        assert len(buf) == len(stack)
    assert calls and all(size >= b for b, size in calls)
    if stack:   # the oldest queued row holds its slot: one more row than the room would overwrite it
        with pytest.raises(RateLimitTimeout):
            buf.add(rows(range(nxt, nxt + 8 - (nxt - min(stack)) + 1)), timeout=0.05)
    buf.close()


def test_a_full_lifo_queue_never_overwrites_a_queued_row():
    lifo = load("lifo_selector")
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(1,)), capacity=4, selector=lifo.Lifo())
    buf.add(rows([0, 1, 2, 3]))
    assert buf.take(2)["reward"].tolist() == [3.0, 2.0]
    with pytest.raises(RateLimitTimeout):      # slot 0 still holds queued row 0: the insert waits
        buf.add(rows([4]), timeout=0.05)
    assert buf.take()["reward"].tolist() == [1.0, 0.0]
    buf.add(rows([4, 5, 6, 7]))
    state = buf.state_dict()
    assert buf.take(1)["reward"].tolist() == [7.0]
    again = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(1,)), capacity=4, selector=lifo.Lifo())
    again.load_state_dict(state)
    assert again.take()["reward"].tolist() == [7.0, 6.0, 5.0, 4.0]
    buf.close()
    again.close()


def test_a_consuming_selector_that_repeats_a_row_is_refused_with_nothing_taken():
    class Twice(Selector):
        name, consumes = "twice", True

        def select(self, batch_size, size, rng):
            return np.zeros(batch_size, np.int64), None

    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(1,)), capacity=8, selector=Twice())
    buf.add(rows([0, 1, 2]))
    with pytest.raises(ConfigError, match="distinct"):
        buf.take(2)
    assert len(buf) == 3
    buf.close()


def test_fifo_take_is_still_the_oldest_in_order():
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(1,)), capacity=8, selector=Fifo())
    buf.add(rows([0, 1, 2, 3, 4]))
    assert buf.take(2)["reward"].tolist() == [0.0, 1.0]
    assert buf.take()["reward"].tolist() == [2.0, 3.0, 4.0]
    buf.close()


@pytest.mark.parametrize("route", ["sample", "take", "deliver", "deliver_overlapped", "read"])
def test_a_custom_codec_delivers_exactly_what_was_stored(route):
    cc = load("custom_codec")
    spec = cc.spec_with_mask(20)
    assert spec["mask"].stored_bytes < 20             # stored as bits
    rng = np.random.default_rng(1)
    masks = rng.random((50, 20)) < 0.5
    obs = rng.normal(size=(50, 4)).astype(np.float32)
    buf = ExperienceBuffer(spec=spec, capacity=64, selector=Fifo() if route == "take" else Uniform(), seed=0)
    if route.startswith("deliver"):
        schedule = Schedule.sequential() if route == "deliver" else Schedule.overlapped(depth=1)
        with ExperienceDataPlane(buffer=buf, schedule=schedule) as edp:
            edp.ingest({"obs": obs, "mask": masks}, source=0)
            edp.flush()
            batch = edp.deliver(16)
        seqs = np.asarray(batch.seqs)
    else:
        buf.add({"obs": obs, "mask": masks})
        if route == "read":
            seqs = np.array([3, 0, 49, 7])
            batch = buf.read(seqs)
        else:
            batch = buf.take(16) if route == "take" else buf.sample(16)
            seqs = np.asarray(batch.seqs)
        buf.close()
    assert batch["mask"].dtype == torch.bool
    assert np.array_equal(batch["mask"].numpy(), masks[seqs])
    assert np.array_equal(batch["obs"].numpy(), obs[seqs])


def test_a_custom_codec_round_trips_through_config_and_state():
    cc = load("custom_codec")
    spec = cc.spec_with_mask(11)
    assert ExperienceSpec.from_config(spec.to_config()) == spec
    masks = np.random.default_rng(2).random((9, 11)) < 0.3
    buf = ExperienceBuffer(spec=spec, capacity=16)
    buf.add({"obs": np.zeros((9, 4), np.float32), "mask": masks})
    again = ExperienceBuffer(spec=ExperienceSpec.from_config(spec.to_config()), capacity=16)
    again.load_state_dict(buf.state_dict())
    assert np.array_equal(again.read(np.arange(9))["mask"].numpy(), masks)
    buf.close()
    again.close()
