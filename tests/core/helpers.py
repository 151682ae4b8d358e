"""Shared builders for the core tests."""

import numpy as np
import torch

from conduit_core import ExperienceSpec

SPEC = ExperienceSpec.transition(obs_shape=(4,))


def rollout(n: int, start: int = 0, *, done_at: int | None = None, source_tag: float = 0.0) -> dict:
    """n transitions whose obs[:, 0] is their index (start, start+1, ...), obs[:, 1] a tag."""
    idx = np.arange(start, start + n, dtype=np.float32)
    obs = np.zeros((n, 4), np.float32)
    obs[:, 0] = idx
    obs[:, 1] = source_tag
    nxt = obs.copy()
    nxt[:, 0] += 1
    term = np.zeros(n, bool)
    if done_at is not None:
        term[done_at] = True
    return {"obs": obs, "action": (idx % 2).astype(np.int64), "reward": np.ones(n, np.float32),
            "next_obs": nxt, "terminated": term, "truncated": np.zeros(n, bool)}


def assert_same_state(a, b, path="state"):
    """Two ``state_dict()``s equal part by part (arrays by value), naming the first part that
    differs; each buffer's own id for its writers' receipts (``...ingest.buffer``, and the ids it
    was restored from, ``...ingest.earlier``) is skipped."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for k in a:
            if not (path.endswith(".ingest") and k in ("buffer", "earlier")):
                assert_same_state(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{path}[{i}]")
    elif isinstance(a, (np.ndarray, torch.Tensor)):
        assert np.array_equal(np.asarray(a), np.asarray(b)), path
    else:
        assert a == b, (path, a, b)
