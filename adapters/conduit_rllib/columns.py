"""Ingestion for RLlib: episode chunks -> columns, once, and the spec they imply.

RLlib's env runners return ``SingleAgentEpisode`` chunks: an ongoing episode comes back
in pieces with the same ``id_``; chunk k+1's first observation is chunk k's last. Each
chunk becomes one rollout (one source = one episode id), so n-step returns and
sequences can follow the episode across chunks through the buffer's episode links.
"""

from __future__ import annotations

import numpy as np
import torch

from conduit_core import AffineCodec, ExperienceSpec, FieldSpec, SpecError

# Conduit field -> RLlib column (ray.rllib.core.columns.Columns)
RLLIB_COLUMNS = {"obs": "obs", "next_obs": "new_obs", "action": "actions", "reward": "rewards",
                 "terminated": "terminateds", "truncated": "truncateds"}


def _steps(buf, n: int):
    """The chunk's own items of an InfiniteLookbackBuffer, skipping its lookback, without
    RLlib's per-call getter machinery (numpy'd episodes hold one array per column)."""
    data = getattr(buf, "data", None)
    if isinstance(data, np.ndarray):
        lb = buf.lookback
        return data[lb:lb + n]
    return None


def episode_columns(ep) -> dict[str, np.ndarray]:
    """One episode chunk as columns (length = number of steps in the chunk)."""
    n = len(ep)
    obs = _steps(ep.observations, n + 1)
    act = _steps(ep.actions, n)
    rew = _steps(ep.rewards, n)
    if obs is None or act is None or rew is None or obs.shape[0] != n + 1:
        obs = np.asarray(ep.get_observations(slice(0, n + 1)))
        act = np.asarray(ep.get_actions(slice(0, n)))
        rew = np.asarray(ep.get_rewards(slice(0, n)))
    if obs.dtype == object:
        raise SpecError("observations", "a Box observation space (one array per step)", "a nested/Dict space",
                        "flatten the observations (e.g. a FlattenObservations connector) before Conduit")
    term = np.zeros(n, dtype=bool)
    trunc = np.zeros(n, dtype=bool)
    if n:
        term[-1] = ep.is_terminated
        trunc[-1] = ep.is_truncated
    return {"obs": obs[:-1], "next_obs": obs[1:], "action": act,
            "reward": rew.astype(np.float32, copy=False),
            "terminated": term, "truncated": trunc}


def looks_like_pixels_over_255(x: np.ndarray) -> bool:
    """True when float observations are exactly k/255 (k in 0..255): the AffineCodec applies."""
    if x.dtype != np.float32 or x.size == 0:
        return False
    q = np.round(x * 255.0)
    return bool(((q >= 0) & (q <= 255)).all() and np.array_equal((q.astype(np.float32) / np.float32(255)), x))


def spec_for(cols: dict[str, np.ndarray], *, obs_codec: str | None) -> ExperienceSpec:
    """The experience spec implied by the first chunk RLlib hands us."""
    obs = cols["obs"]
    codec = None
    if obs_codec == "auto" and obs.ndim >= 3 and looks_like_pixels_over_255(obs):
        codec = AffineCodec.divide(255)
    obs_dtype = torch.from_numpy(obs[:0]).dtype
    fields = [FieldSpec("obs", obs.shape[1:], obs_dtype, *(codec and [codec] or [])),
              FieldSpec("action", cols["action"].shape[1:], torch.from_numpy(cols["action"][:0]).dtype),
              FieldSpec("reward", (), torch.float32),
              FieldSpec("next_obs", obs.shape[1:], obs_dtype, *(codec and [codec] or [])),
              FieldSpec("terminated", (), torch.bool), FieldSpec("truncated", (), torch.bool)]
    return ExperienceSpec(fields)
