"""A new selector is one class in one file (issue 14): the buffer chooses by behaviour
(``consumes``, ``weighted``), never by type, so a selector the core has never seen works
with every delivery path. This one (also the example in docs/writing-an-adapter.md) serves
the most recent rows first: a batch is the newest ``batch_size`` stored rows, newest first."""

import numpy as np
import torch

from conduit_core import ExperienceBuffer, ExperienceDataPlane, ExperienceSpec, FieldSpec, Selector


class MostRecentFirst(Selector):
    """The newest ``batch_size`` stored rows, newest first (positions count from the oldest)."""

    name = "most_recent_first"

    def select(self, batch_size, size, rng):
        return np.arange(size - 1, size - 1 - batch_size, -1, dtype=np.int64), None


def spec():
    return ExperienceSpec([FieldSpec("obs", (2,), torch.float32), FieldSpec("reward", (), torch.float32),
                           FieldSpec("next_obs", (2,), torch.float32), FieldSpec("terminated", (), torch.bool),
                           FieldSpec("truncated", (), torch.bool)])


def rows(first: int, n: int, *, done_last: bool = False) -> dict:
    ids = np.arange(first, first + n, dtype=np.float32)
    term = np.zeros(n, bool)
    term[-1] = done_last
    return {"obs": np.stack([ids, ids], 1), "reward": ids, "next_obs": np.stack([ids + 1, ids + 1], 1),
            "terminated": term, "truncated": np.zeros(n, bool)}


def test_a_new_selector_serves_every_delivery_path():
    buf = ExperienceBuffer(spec=spec(), capacity=8, selector=MostRecentFirst())
    buf.add(rows(0, 6))
    buf.add(rows(6, 6, done_last=True))          # the ring wraps: rows 4..11 are stored
    assert buf.sample(3)["obs"][:, 0].tolist() == [11, 10, 9]
    nstep = buf.sample(2, n_step=2, gamma=0.5)   # n-step windows from the same starts
    assert nstep["obs"][:, 0].tolist() == [11, 10] and nstep["n_step"].tolist() == [1, 2]
    assert nstep["reward"].tolist() == [11.0, 10.0 + 0.5 * 11.0]
    buf.evict([10])                              # a removed row is not served
    assert 10 not in buf.sample(3)["obs"][:, 0].tolist()
    with ExperienceDataPlane(buffer=buf) as edp:  # through the data plane and a state round trip
        edp.ingest(rows(12, 2))
        assert edp.deliver(2)["obs"][:, 0].tolist() == [13, 12]
        again = ExperienceBuffer(spec=spec(), capacity=8, selector=MostRecentFirst())
        again.load_state_dict(edp.state_dict()["buffer"])
        assert again.sample(2)["obs"][:, 0].tolist() == [13, 12]
