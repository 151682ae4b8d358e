"""Fidelity on real CartPole data: what Conduit's RLlib buffer delivers vs what RLlib's own
buffers deliver, on the same stored episodes, at the tuned DQN config's sampling.

    python -m benchmarks.rllib.fidelity            # ~1 min; docs/benchmarks.md section 10

Random-policy CartPole episodes (real observations) are handed to both buffers as an env
runner hands them over: in chunks of ``--fragment`` steps, the last episodes still running.
Each delivered row is located in its episode by its observation (CartPole's are unique
floats), and the joint distribution of (steps left after the window, window length,
terminated) is compared with a two-sample chi-square test, per buffer kind. Conduit with
the rule it had before (windows cut by an episode's end delivered shortened) is measured
beside it: the difference the old rule made is the one the issue reported.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
from conduit_conformance.stats import two_sample_chi2


def cartpole_chunks(episodes: int, fragment: int, seed: int, open_last: int = 4):
    """(chunks in hand-over order, {obs bytes: (episode, t)}, episode lengths)."""
    import gymnasium as gym
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    chunks, where, lengths = [], {}, []
    for e in range(episodes):
        obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
        os_, acts, rews, term, trunc = [obs], [], [], False, False
        cap = int(rng.integers(5, 30)) if e >= episodes - open_last else 10_000  # still running when handed over
        while not (term or trunc) and len(acts) < cap:
            a = int(rng.integers(2))
            obs, r, term, trunc, _ = env.step(a)
            os_.append(obs)
            acts.append(a)
            rews.append(float(r))
        n = len(acts)
        lengths.append(n)
        for t in range(n):
            where[np.asarray(os_[t], np.float32).tobytes()] = (e, t)
        for a in range(0, n, fragment):
            b = min(n, a + fragment)
            last = b == n
            ep = SingleAgentEpisode(id_=f"ep{e}", observations=os_[a:b + 1], actions=acts[a:b], rewards=rews[a:b],
                                    terminated=term and last, truncated=trunc and last,
                                    observation_space=env.observation_space, action_space=env.action_space,
                                    t_started=a, len_lookback_buffer=0)
            ep.to_numpy()
            chunks.append(ep)
    return chunks, where, lengths


def rows_native(eps, where):
    out = []
    for e in eps:
        ep, t = where[np.asarray(e.get_observations(0), np.float32).tobytes()]
        k = int(np.asarray(e.get_extra_model_outputs("n_step")).reshape(-1)[0])
        out.append((ep, t, k, bool(e.is_terminated)))
    return out


def rows_conduit(batch, where):
    obs = batch["obs"].numpy()
    k = batch["n_step"].numpy()
    term = batch["terminated"].numpy()
    return [(*where[np.asarray(o, np.float32).tobytes()], int(kk), bool(tt)) for o, kk, tt in zip(obs, k, term)]


def summary(rows, lengths, *, uniform: bool):
    """Fractions and the categories: (steps left after the window, window length) and, for
    the prioritized buffer, terminated. RLlib's uniform buffer reports the drawn n and drops
    ``terminated`` on a shortened window (docs section 10), so for it the true length is read
    from the window's position and the flag is left out of the comparison."""
    cats, last_step, term_n = [], 0, 0
    for ep, t, k, term in rows:
        k = min(k, lengths[ep] - t) if uniform else k
        cats.append((lengths[ep] - t - k, k) if uniform else (lengths[ep] - t - k, k, term))
        last_step += t == lengths[ep] - 1
        term_n += term
    n = len(rows)
    return {"terminated": term_n / n, "last_step": last_step / n, "mean_k": sum(c[1] for c in cats) / n,
            "cats": cats}


def measure(prioritized: bool, chunks, where, lengths, *, draws: int, seed: int) -> dict:
    from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer, DeliveredBatch
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (
        PrioritizedEpisodeReplayBuffer,
    )
    cap = sum(lengths) + 1000
    native = PrioritizedEpisodeReplayBuffer(capacity=cap, alpha=0.6) if prioritized else EpisodeReplayBuffer(capacity=cap)
    native.rng = np.random.default_rng(seed)
    conduit = ConduitEpisodeReplayBuffer(capacity=cap, prioritized=prioritized, alpha=0.6, beta=0.4, seed=seed + 1)
    for c in chunks:
        native.add([c])
        conduit.add([c])
    kw = {"n_step": (2, 5), "gamma": 0.99}
    nat, con, old = [], [], []
    for _ in range(draws // 500):
        nat += rows_native(native.sample(num_items=500, sample_episodes=True, **kw,
                                         **({"beta": 0.4} if prioritized else {})), where)
        con += rows_conduit(conduit.sample(500, sample_episodes=True, **kw)[0].batch, where)
        if prioritized:
            b = conduit.edp.deliver(500, episode_end="shorten", beta=0.4, **kw)
            old += rows_conduit(DeliveredBatch(b).batch, where)
    conduit.close()
    sn, sc = summary(nat, lengths, uniform=not prioritized), summary(con, lengths, uniform=not prioritized)
    res = {"rllib": {k: v for k, v in sn.items() if k != "cats"}, "conduit": {k: v for k, v in sc.items() if k != "cats"},
           "p_conduit_vs_rllib": two_sample_chi2(sn["cats"], sc["cats"]), "draws": len(nat)}
    if old:
        so = summary(old, lengths, uniform=False)
        res["conduit_shortened_rule"] = {k: v for k, v in so.items() if k != "cats"}
        res["p_shortened_rule_vs_rllib"] = two_sample_chi2(sn["cats"], so["cats"])
    return res


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rllib.fidelity", description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=400)
    p.add_argument("--fragment", type=int, default=8, help="steps per chunk handed over (rollout fragment)")
    p.add_argument("--draws", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="out/fidelity_rllib.json")
    a = p.parse_args(argv)
    chunks, where, lengths = cartpole_chunks(a.episodes, a.fragment, a.seed)
    report = {"args": vars(a), "steps": sum(lengths), "episodes": len(lengths)}
    for kind in ("prioritized", "uniform"):
        report[kind] = measure(kind == "prioritized", chunks, where, lengths, draws=a.draws, seed=a.seed)
    print(f"CartPole, random policy: {report['episodes']} episodes, {report['steps']} steps, chunks of "
          f"{a.fragment}; n_step=(2,5), {report['prioritized']['draws']} draws per buffer")
    print(f"{'buffer':12s} {'path':28s} {'terminated':>10s} {'last step':>9s} {'mean n':>7s} {'chi2 p vs RLlib':>15s}")
    for kind in ("prioritized", "uniform"):
        r = report[kind]
        rows = [("RLlib", r["rllib"], None), ("Conduit", r["conduit"], r["p_conduit_vs_rllib"])]
        if "conduit_shortened_rule" in r:
            rows.append(("Conduit, old shortened rule", r["conduit_shortened_rule"], r["p_shortened_rule_vs_rllib"]))
        for name, s, pv in rows:
            print(f"{kind:12s} {name:28s} {s['terminated']:10.2%} {s['last_step']:9.2%} {s['mean_k']:7.3f} "
                  f"{'' if pv is None else f'{pv:.3g}':>15s}")
    print("(uniform: RLlib's terminated is low because its buffer drops the flag on shortened windows; the "
          "comparison is of window position and true length)")
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as fh:
        json.dump(report, fh, indent=2)
    print(f"JSON: {a.json}")
    return report


if __name__ == "__main__":
    main()
