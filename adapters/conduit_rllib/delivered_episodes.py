"""RLlib's own sample objects, rebuilt from Conduit's rows.

The fast path hands the learner a columnar ``DeliveredBatch``. Some configs need what
RLlib's buffers return instead, a list of ``SingleAgentEpisode``:

- a learner connector piece the user added (it reads episodes; RLlib's whole learner
  pipeline then runs, the user's pieces included);
- ``include_infos`` (infos live on episodes, never in the train batch);
- sequences for stateful modules (``batch_length_T``, ``lookback``,
  ``min_batch_length_T``): slices of stored episodes with their lookback, which RLlib's
  stateful connectors turn into ``[B, T]`` batches with states.

Selection stays Conduit's (the same distribution as RLlib's; see ``replay_buffer``);
these functions only build the objects, the way RLlib's buffers build them
(``PrioritizedEpisodeReplayBuffer.sample``, ``EpisodeReplayBuffer._sample_episodes``
in RLlib 2.60), with one deliberate difference: where RLlib's uniform buffer labels a
shortened window wrongly (the drawn ``n_step``, ``terminated`` dropped, step 0's extra
model outputs), these carry the true values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from conduit_core.schema.nested import unflatten

from .columns import EXTRA


@dataclass(frozen=True)
class EpisodeContext:
    """What every rebuilt episode shares: the spaces and RLlib's ids for them."""

    observation_space: Any = None
    action_space: Any = None
    agent_id: Any = None
    module_id: Any = None


def _per_step(value, count: int) -> list:
    """A batched leaf (array) or nesting (dict of them) as RLlib's per-step list of items."""
    if isinstance(value, dict):
        return [{k: _per_step(v, count)[t] for k, v in value.items()} for t in range(count)]
    return list(value)


def _extras(cols: dict[str, np.ndarray], rows: slice) -> dict[str, list]:
    """Extra model outputs at ``rows`` of the gathered columns, per step, nesting rebuilt."""
    flat = [(name[len(EXTRA):], cols[name][rows]) for name in cols if name.startswith(EXTRA)]
    if not flat:
        return {}
    count = flat[0][1].shape[0]
    return {k: _per_step(v, count) for k, v in unflatten(flat).items()}


def one_step_episodes(cols: dict[str, np.ndarray], *, weights: np.ndarray | None, starts: np.ndarray,
                      first_infos: list | None, last_infos: list | None, ids: list, include_extras: bool,
                      uniform: bool, lookback: int, ctx: EpisodeContext) -> list:
    """RLlib's one-step episodes for delivered n-step rows (host numpy columns: obs,
    next_obs, action, reward as the discounted return, terminated, truncated, n_step and
    the extra model outputs at each window's first step). ``starts``: each row's step
    within its stored episode; ``ids``: the stored episode ids (the uniform buffer keeps
    them; the prioritized one makes new ones)."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

    out = []
    for i in range(cols["obs"].shape[0]):
        n = int(cols["n_step"][i])
        extras = _extras(cols, slice(i, i + 1)) if include_extras else {}
        infos = None if first_infos is None else [first_infos[i], last_infos[i]]
        common = dict(observations=[cols["obs"][i], cols["next_obs"][i]], actions=[cols["action"][i]],
                      rewards=[float(cols["reward"][i])], infos=infos, terminated=bool(cols["terminated"][i]),
                      truncated=bool(cols["truncated"][i]), observation_space=ctx.observation_space,
                      action_space=ctx.action_space, len_lookback_buffer=0, t_started=int(starts[i]))
        if uniform:
            ep = SingleAgentEpisode(id_=ids[i], agent_id=ctx.agent_id, module_id=ctx.module_id,
                                    extra_model_outputs=extras, **common)
            ep.extra_model_outputs["n_step"] = InfiniteLookbackBuffer(np.full((1 + lookback,), n), lookback=lookback)
            ep.extra_model_outputs["weights"] = InfiniteLookbackBuffer(np.ones((1 + lookback,)), lookback=lookback)
        else:
            w = 1.0 if weights is None else float(weights[i])
            ep = SingleAgentEpisode(extra_model_outputs={"weights": [w], "n_step": [n], **extras}, **common)
        out.append(ep)
    return out


def sequence_episode(cols: dict[str, np.ndarray], *, lookback_steps: int, lookback: int, infos: list,
                     id_: str | None, t_started: int, ctx: EpisodeContext):
    """One slice of a stored episode, ``episode.slice(slice(ts, ts + L),
    len_lookback_buffer=lookback)`` as RLlib's uniform buffer returns it: ``cols`` holds
    the rows of steps ``ts - lookback_steps .. ts + L - 1`` (``lookback_steps =
    min(lookback, ts)``: RLlib's slice has no lookback before a stored episode's first
    step), ``infos`` their ``L + lookback_steps + 1`` observation infos."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

    rows = cols["obs"].shape[0]
    length = rows - lookback_steps
    observations = list(cols["obs"]) + [cols["next_obs"][-1]]
    extras = _extras(cols, slice(None))
    ep = SingleAgentEpisode(
        id_=id_, agent_id=ctx.agent_id, module_id=ctx.module_id, observations=observations,
        actions=list(cols["action"]), rewards=[float(r) for r in cols["reward"]], infos=list(infos),
        terminated=bool(cols["terminated"][-1]), truncated=bool(cols["truncated"][-1]),
        extra_model_outputs=extras, observation_space=ctx.observation_space, action_space=ctx.action_space,
        len_lookback_buffer=lookback_steps, t_started=int(t_started))
    ep.to_numpy()
    # RLlib sizes these by the requested lookback, not the slice's (one entry per step + lookback)
    ep.extra_model_outputs["n_step"] = InfiniteLookbackBuffer(np.full((length + lookback,), 1), lookback=lookback)
    ep.extra_model_outputs["weights"] = InfiniteLookbackBuffer(np.ones((length + lookback,)), lookback=lookback)
    return ep


def shard_order(count: int, shards: int) -> np.ndarray:
    """The order to hand ``count`` one-step episodes to RLlib's ``ShardEpisodesIterator``
    (it deals equal-length episodes round-robin: position j goes to learner j % k) so
    that learner i trains on rows ``i*m .. (i+1)*m - 1`` and the learners' TD errors,
    concatenated in learner order, line up with the rows as delivered."""
    if count % shards:
        from conduit_core import ConfigError
        raise ConfigError("batch size", f"a multiple of the {shards} learners", count,
                          "sample a batch size that divides among the learners (as Batch.split requires)")
    m = count // shards
    j = np.arange(count)
    return (j % shards) * m + j // shards
