"""Which transition of an n-step window a field is delivered from is declared on the field
(``FieldSpec.window_step``), not guessed from its name: a look-ahead field such as ``next_goal``
declared "last" comes from the window's last step, like ``next_obs``, on every window route (the
pooled redraw draw, the reference, the shortened rule, several shards); one left at "first" comes
from its first step. Declarations survive the spec's config."""

import numpy as np
import pytest
import torch

from conduit_core import ExperienceBuffer, ExperienceSpec, FieldSpec, ShardSpec, SpecError, Uniform


def spec(next_goal_step):
    return ExperienceSpec([FieldSpec("obs", (2,)), FieldSpec("action", (), torch.int64), FieldSpec("reward"),
                           FieldSpec("next_obs", (2,)), FieldSpec("goal"),
                           FieldSpec("next_goal", (), window_step=next_goal_step),
                           FieldSpec("terminated", (), torch.bool), FieldSpec("truncated", (), torch.bool)])


def episode(n: int, start: int) -> dict:
    """obs[:, 0] = step index; goal = 100 + index, next_goal = the next step's goal."""
    idx = np.arange(start, start + n, dtype=np.float32)
    obs = np.stack([idx, np.zeros(n, np.float32)], 1)
    nxt = obs.copy()
    nxt[:, 0] += 1
    term = np.zeros(n, bool)
    term[-1] = True
    return {"obs": obs, "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32), "next_obs": nxt,
            "goal": 100 + idx, "next_goal": 101 + idx, "terminated": term, "truncated": np.zeros(n, bool)}


@pytest.mark.parametrize("shards", [None, 2])
@pytest.mark.parametrize("episode_end", ["redraw", "shorten"])
@pytest.mark.parametrize("reuse", [0, 2])
def test_a_declared_look_ahead_field_comes_from_the_windows_last_step(shards, episode_end, reuse):
    for step in ("last", "first"):
        kw = {} if shards is None else {"shards": [ShardSpec("pageable", 32), ShardSpec("pageable", 32)]}
        buf = ExperienceBuffer(spec=spec(step), capacity=64, selector=Uniform(), seed=1, reuse_outputs=reuse, **kw)
        for e in range(5):
            buf.add(episode(9, 10 * e), source=e)
        b = buf.sample(32, n_step=3, episode_end=episode_end)
        first, steps = b["obs"][:, 0], b["n_step"].to(torch.float32)
        torch.testing.assert_close(b["next_obs"][:, 0], first + steps, rtol=0, atol=0)   # (the window's last step)
        want = 101 + first + steps - 1 if step == "last" else 101 + first
        torch.testing.assert_close(b["next_goal"], want, rtol=0, atol=0)
        torch.testing.assert_close(b["goal"], 100 + first, rtol=0, atol=0)
        buf.close()


def test_the_declaration_is_checked_and_kept_by_the_config():
    assert FieldSpec("next_obs", (2,)).window_step == "last" and FieldSpec("obs", (2,)).window_step == "first"
    assert FieldSpec("next_obs", (2,), window_step="first").window_step == "first"
    with pytest.raises(SpecError, match="window_step"):
        FieldSpec("next_goal", window_step="end")
    s = spec("last")
    again = ExperienceSpec.from_config(s.to_config())
    assert again["next_goal"].window_step == "last" and again["next_obs"].window_step == "last"
    assert "window_step" not in s.to_config()[3]   # (next_obs at its default: configs stay as they were)
