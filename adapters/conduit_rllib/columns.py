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
from conduit_core.schema.nested import flatten
from conduit_core.schema.spec import as_torch_dtype

# Conduit field -> RLlib column (ray.rllib.core.columns.Columns)
RLLIB_COLUMNS = {"obs": "obs", "next_obs": "new_obs", "action": "actions", "reward": "rewards",
                 "terminated": "terminateds", "truncated": "truncateds"}

# An episode's extra model outputs (per step: RLlib's ``weights_seq_no``, action logps, a
# stateful module's ``state_out``...) are stored as fields under this prefix, nested ones
# with dotted names; RLlib's buffers keep them all, so Conduit's does too.
EXTRA = "extra_model_outputs."


def _extra_leaves(key: str, value) -> list:
    """An extra model output (an array, or a nesting of them) as ``EXTRA``-prefixed flat names."""
    return flatten({key: value}, prefix=EXTRA) if isinstance(value, dict) else [(EXTRA + key, value)]


def add_extra_model_output_columns(out: dict, ep, n: int) -> None:
    """The chunk's extra model outputs, one row per step, as ``EXTRA``-prefixed flat columns,
    written into ``out`` (``episode_columns``' dict: no second dict to build and unpack on every add)."""
    for key, buf in ep.extra_model_outputs.items():
        if type(key) is not str:   # (a column is named after its key; the learner gets the names back)
            raise SpecError(f"extra_model_outputs[{key!r}]", "a str key (Conduit stores each output as a column "
                            "named after its key)", f"a {type(key).__name__} key",
                            f"name the output with a str, e.g. {str(key)!r}; nothing of this add was stored")
        data = getattr(buf, "data", None)   # (``_steps`` and ``_extra_leaves``, inline for one array: every add comes here)
        if type(data) is np.ndarray:
            lb = buf.lookback
            out[EXTRA + key] = data[lb:lb + n]
            continue
        for name, leaf in _extra_leaves(key, ep.get_extra_model_outputs(key, slice(0, n))):
            out[name] = np.asarray(leaf)


def episode_infos(ep, n: int) -> list:
    """The chunk's ``n + 1`` infos, one per observation (RLlib's ``get_infos``), as stored."""
    data = getattr(ep.infos, "data", None)
    if isinstance(data, list) and len(data) >= ep.infos.lookback + n + 1:
        lb = ep.infos.lookback
        return data[lb:lb + n + 1]
    return list(ep.get_infos(slice(0, n + 1)))


def chunk_lookback_row(ep) -> dict | None:
    """The step before a chunk's first one (its lookback), as one row of columns plus that
    observation's info, or None if the chunk has no lookback. RLlib's env runners hand over a
    running episode's next chunk with one lookback step; when such a chunk starts a stored
    episode (its earlier steps were evicted), RLlib's sequence slices at its first steps
    include that step, and a stateful module's state is read from it."""
    buffers = [ep.observations, ep.actions, ep.rewards, *ep.extra_model_outputs.values()]
    if min(getattr(b, "lookback", 0) for b in buffers) < 1:
        return None
    kw = {"neg_index_as_lookback": True}
    row = {"obs": np.asarray(ep.get_observations(-1, **kw))[None], "next_obs": np.asarray(ep.get_observations(0))[None],
           "action": np.asarray(ep.get_actions(-1, **kw))[None],
           "reward": np.asarray([ep.get_rewards(-1, **kw)], dtype=np.float32),
           "terminated": np.zeros(1, bool), "truncated": np.zeros(1, bool)}
    for key in ep.extra_model_outputs:
        value = ep.get_extra_model_outputs(key, -1, **kw)
        for name, leaf in _extra_leaves(key, value):
            row[name] = np.asarray(leaf)[None]
    info = ep.get_infos(-1, **kw) if getattr(ep.infos, "lookback", 0) >= 1 else {}
    return {"cols": row, "info": info}


def episode_columns(ep) -> dict[str, np.ndarray]:
    """One episode chunk as columns (length = number of steps in the chunk), its extra
    model outputs included.

    Every env step's ``add()`` comes here with the caches cold after the learner's update,
    where each numpy call is microseconds: obs and next_obs are sliced straight from RLlib's
    array, and a chunk whose episode goes on shares one read-only all-False array for its
    done flags (``_not_done``) in place of building two (``add()`` over ``sample()``, cold,
    1.01-1.03 -> 0.90-0.95 by turns: docs/benchmarks.md section 2)."""
    n = len(ep)
    o, a, r = ep.observations, ep.actions, ep.rewards   # (``_steps`` of each, inline: every add comes here)
    od, ad, rd = getattr(o, "data", None), getattr(a, "data", None), getattr(r, "data", None)
    if type(od) is np.ndarray and type(ad) is np.ndarray and type(rd) is np.ndarray \
            and od.shape[0] >= o.lookback + n + 1:
        lb = o.lookback
        obs, next_obs = od[lb:lb + n], od[lb + 1:lb + n + 1]
        act, rew = ad[a.lookback:a.lookback + n], rd[r.lookback:r.lookback + n]
    else:
        both = np.asarray(ep.get_observations(slice(0, n + 1)))
        obs, next_obs = both[:-1], both[1:]
        act = np.asarray(ep.get_actions(slice(0, n)))
        rew = np.asarray(ep.get_rewards(slice(0, n)))
    if obs.dtype == object:
        raise SpecError("observations", "a Box observation space (one array per step)", "a nested/Dict space",
                        "flatten the observations (e.g. a FlattenObservations connector) before Conduit")
    if n and not ep.is_terminated and not ep.is_truncated:
        term = trunc = _not_done(n)
    else:
        term, trunc = np.zeros((2, n), dtype=bool)   # (two rows of one array: one allocation)
        if n:
            term[-1] = ep.is_terminated
            trunc[-1] = ep.is_truncated
    cols = {"obs": obs, "next_obs": next_obs, "action": act, "reward": rew.astype(np.float32, copy=False),
            "terminated": term, "truncated": trunc}
    if ep.extra_model_outputs:
        add_extra_model_output_columns(cols, ep, n)
    return cols


_NOT_DONE: dict[int, np.ndarray] = {}


_NOT_DONE_LONGEST = 256   # (longer chunks are rare and long: the cache stays under 33 KB)


def _not_done(n: int) -> np.ndarray:
    """``n`` False flags, one read-only array per length, shared by every chunk of that length
    whose episode goes on (the buffer copies its rows; nothing may write into a caller's columns)."""
    flags = _NOT_DONE.get(n)
    if flags is None:
        if n > _NOT_DONE_LONGEST:
            return np.zeros(n, dtype=bool)
        flags = np.zeros(n, dtype=bool)
        flags.flags.writeable = False
        flags = _NOT_DONE.setdefault(n, flags)
    return flags


# Affine normalisations frameworks apply to uint8 pixels, tried in order: x = q / d + offset.
PIXEL_NORMALISATIONS = ((255.0, 0.0), (128.0, -1.0), (256.0, 0.0), (127.5, -1.0))


def pixel_codec(x: np.ndarray) -> AffineCodec | None:
    """The AffineCodec that represents every value of ``x`` exactly, if one of the usual
    pixel normalisations does (checked bit for bit on this sample; every later insert is
    verified again by the codec itself)."""
    if x.dtype != np.float32 or x.size == 0:
        return None
    for d, off in PIXEL_NORMALISATIONS:
        q = np.round((x - np.float32(off)) * np.float32(d))
        back = q.astype(np.float32) / np.float32(d) + np.float32(off)
        if ((q >= 0) & (q <= 255)).all() and np.array_equal(back.view(np.uint32), x.view(np.uint32)):   # bit for bit
            return AffineCodec.divide(d, offset=off)
    return None


def stacked_axis(obs: np.ndarray, next_obs: np.ndarray) -> int | None:
    """The axis along which consecutive observations are a sliding frame stack (k frames,
    shifted by one per step), or None. Decided on the first chunk: most steps must shift."""
    if obs.ndim != 4 or obs.shape[0] < 1:
        return None
    for axis in (-1, 1):
        k = obs.shape[axis]
        if not 2 <= k <= 8:
            continue
        a = np.moveaxis(next_obs, axis, 1)
        b = np.moveaxis(obs, axis, 1)
        shifted = (a[:, :-1] == b[:, 1:]).reshape(a.shape[0], -1).all(axis=1)
        if shifted.mean() >= 0.5:
            return axis if axis == -1 else 0
    return None


def spec_for(cols: dict[str, np.ndarray], *, obs_codec: str | None) -> ExperienceSpec:
    """The experience spec implied by the first chunk RLlib hands us. With obs_codec='auto',
    pixel observations get lossless codecs: uint8 storage for normalised floats and, for
    frame stacks, each frame stored once (obs and next_obs share one frame pool)."""
    from conduit_core.schema.framestack import FrameStackCodec
    obs = cols["obs"]
    codec = None
    if obs_codec == "auto" and obs.ndim >= 3:
        inner = pixel_codec(obs)
        axis = stacked_axis(obs, cols["next_obs"])
        if axis is not None:
            codec = FrameStackCodec(k=obs.shape[axis if axis == -1 else 1], axis=axis, inner=inner)
        else:
            codec = inner
    obs_dtype = as_torch_dtype(obs.dtype)
    extra = [codec] if codec is not None else []
    fields = [FieldSpec("obs", obs.shape[1:], obs_dtype, *extra),
              FieldSpec("action", cols["action"].shape[1:], as_torch_dtype(cols["action"].dtype)),
              FieldSpec("reward", (), torch.float32),
              FieldSpec("next_obs", obs.shape[1:], obs_dtype, *extra),
              FieldSpec("terminated", (), torch.bool), FieldSpec("truncated", (), torch.bool)]
    for name, col in cols.items():
        if name.startswith(EXTRA):
            if col.dtype == object:
                raise SpecError(name, "numeric per-step values (one array per step)", "Python objects",
                                "return arrays from the RLModule's forward pass for this key")
            fields.append(FieldSpec(name, col.shape[1:], as_torch_dtype(col.dtype)))
    return ExperienceSpec(fields)
