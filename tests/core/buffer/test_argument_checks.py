"""Every numeric and identity argument is checked before anything changes: a float slot is not
slot 3, a version 1.5 is not version 1, a priority update without the batch's seqs cannot land on
the rows that replaced it, and a device the machine lacks is named, not a raw torch error."""

import math

import numpy as np
import pytest
import torch

from conduit_core import ConduitError, ConfigError, ExperienceBuffer, ExperienceSpec, Prioritized, RateLimiter

from ..helpers import assert_same_state

SPEC = ExperienceSpec.transition(obs_shape=(1,))


def rows(values):
    v = np.asarray(values, np.float32)
    n = v.shape[0]
    return {"obs": v.reshape(n, 1), "action": np.zeros(n, np.int64), "reward": v, "next_obs": v.reshape(n, 1) + 1,
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}


@pytest.fixture
def buf():
    b = ExperienceBuffer(spec=SPEC, capacity=8, selector=Prioritized(alpha=0.6, beta=0.4))
    b.add(rows(range(8)))
    yield b
    b.close()


def test_a_priority_update_without_seqs_is_refused_unless_asked_for_by_slots(buf):
    batch = buf.sample(4)
    buf.add(rows(range(8, 16)))          # every slot now holds another row
    before = buf.state_dict()
    with pytest.raises(ConfigError, match="seqs"):
        buf.update_priorities(batch.slots, np.full(4, 50.0))
    assert_same_state(before, buf.state_dict())
    assert buf.update_priorities(batch.slots, np.full(4, 50.0), seqs=batch.seqs) == 0   # all replaced: none updated
    assert buf.update_priorities(batch.slots, np.full(4, 50.0), slots_only=True) == 4    # the explicit opt-in


@pytest.mark.parametrize("call", [
    lambda b, s: b.update_priorities(s.slots + 0.7, np.ones(4), seqs=s.seqs),
    lambda b, s: b.update_priorities(s.slots, np.ones(4), seqs=s.seqs + 0.5),
    lambda b, s: b.update_priorities(s.slots, np.ones(4), seqs=s.seqs[:2]),
    lambda b, s: b.read([1.5]),
    lambda b, s: b.evict(np.array([2.7])),
    lambda b, s: b.add(rows([1]), policy_version=1.5),
    lambda b, s: b.add(rows([1]), policy_version="x"),
    lambda b, s: b.add(rows([1]), source=-5),
    lambda b, s: b.add(rows([1]), source=2 ** 70),
    lambda b, s: b.add(rows([1]), source=True),
    lambda b, s: b.sample(2, device="nonsense"),
], ids=["float slots", "float seqs", "seqs of another length", "read a float seq", "evict a float seq",
        "version 1.5", "version 'x'", "source -5", "source 2**70", "source True", "unknown device"])
def test_a_bad_argument_is_named_and_changes_nothing(buf, call):
    batch = buf.sample(4)
    before = buf.state_dict()
    with pytest.raises(ConduitError, match="Fix:"):
        call(buf, batch)
    assert_same_state(before, buf.state_dict())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_a_cuda_device_without_cuda_is_named(buf):
    with pytest.raises(ConfigError, match="no CUDA devices"):
        buf.sample(2, device="cuda")
    with pytest.raises(ConfigError, match="no CUDA devices"):
        buf.read([0], device="cuda:0")


@pytest.mark.parametrize("kw", [dict(seed="x"), dict(seed=1.5), dict(seed=-1), dict(reuse_outputs=-1),
                                dict(reuse_outputs=2.0)])
def test_constructor_numbers_are_checked(kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        ExperienceBuffer(spec=SPEC, capacity=8, **kw)


@pytest.mark.parametrize("timeout", [math.inf, 0, -1, float("nan"), "10", True])
def test_every_wait_has_a_finite_timeout(timeout):
    with pytest.raises(ConfigError, match="timeout"):
        RateLimiter(timeout=timeout)
