"""``conduit tune rllib-dqn``: the cost model on RLlib's DQN itself, at synthetic observation
sizes (as the paper's Table 4): profile, predict every configuration, measure them all.

The environment is a gymnasium env with a D-feature float observation (random features,
CartPole-like episode lengths), so the transition size is the only thing that changes
across D. One algorithm is built per size and every configuration is applied to it live
(``reschedule`` for overlap and granularity, ``migrate`` for the placement): the same
code path ``mode="auto"`` uses, and it removes the build-to-build variance that
separate runs carry. The 48 configurations are placement {host, shm} x schedule
{sequential, thread, process} x ingest_granularity {1, 4} x delivery_granularity {1, 2, 4, 8}.

    profile    sequential at two granularities (twice each), thread and process (twice
               each): ``profile_from_phases`` -> the cost model's Profile (``--profile
               interleaved``: those configurations' survey measurements instead)
    predict    every configuration
    measure    ``--rounds`` interleaved rounds; each round visits every configuration once
               (in a fresh random order within each placement) and times ``--iters`` RLlib
               iterations; the figure is seconds per learner step (iteration time / learner
               steps in it), reported per nominal iteration; median over rounds
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import numpy as np

from conduit_core.planning.ranking import order_stability, pair_agreement, split_half

ENV = "conduit-synthetic-obs"


class SyntheticObsEnv:
    """A CartPole-like episode structure with a D-dimensional observation."""

    def __new__(cls, config=None):
        import gymnasium as gym

        class _Env(gym.Env):
            def __init__(self, cfg):
                self.d = int((cfg or {}).get("dims", 128))
                self.observation_space = gym.spaces.Box(-1.0, 1.0, (self.d,), np.float32)
                self.action_space = gym.spaces.Discrete(2)
                self.rng = np.random.default_rng(0)
                self.t = 0

            def reset(self, *, seed=None, options=None):
                if seed is not None:
                    self.rng = np.random.default_rng(seed)
                self.t = 0
                return self.rng.uniform(-0.05, 0.05, self.d).astype(np.float32), {}

            def step(self, action):
                self.t += 1
                obs = self.rng.uniform(-1, 1, self.d).astype(np.float32)
                done = self.t >= 50 or abs(float(obs[0]) + 0.1 * (action - 0.5)) > 0.98
                return obs, 1.0, done, False, {}
        return _Env(config)


def build(dims: int, *, seed: int = 0, staleness: int = 32, steps_per_iter: int = 250):
    import conduit_rllib
    from conduit_rllib.workloads import dqn_cartpole
    from ray.tune.registry import register_env
    register_env(ENV, lambda c: SyntheticObsEnv(c))
    cfg = dqn_cartpole(seed=seed)
    cfg.environment(ENV, env_config={"dims": dims})
    cfg.reporting(min_sample_timesteps_per_iteration=steps_per_iter)
    cfg.training(num_steps_sampled_before_learning_starts=200)
    conduit_rllib.enable(cfg, mode="sequential", staleness=staleness)
    return cfg.build_algo()


class LiveRun:
    """One RLlib DQN algorithm whose data plane is switched between configurations."""

    def __init__(self, algo):
        self.algo = algo
        self.buffer = algo.local_replay_buffer
        self.placement = "host"
        self.steps_seen: list[float] = []  # learner steps per iteration, every measurement
        self.phases: list[dict] = []       # the profiling phases, as measured

    @property
    def edp(self):
        return self.buffer.edp

    def apply(self, config) -> None:
        from conduit_core.planning.tuner import migrate_to, schedule_for
        if config.placement != self.placement:
            migrate_to(self.edp, config.placement)
            self.placement = config.placement
        self.edp.reschedule(schedule_for(config, self.edp.schedule))

    def time_iters(self, iters: int):
        """(wall seconds, learner steps, metrics before, metrics after) over ``iters`` iterations."""
        m0 = self.edp.metrics()
        t0 = time.perf_counter()
        for _ in range(iters):
            self.algo.train()
        wall = time.perf_counter() - t0
        m1 = self.edp.metrics()
        return wall, max(1, m1.deliver.calls - m0.deliver.calls), m0, m1


def warm_up(run: LiveRun, least: int, most: int, window: int, tol: float) -> dict:
    """Train until the iteration time is steady (``tuner.is_steady``), between ``least`` and
    ``most`` iterations; returns the iteration times and whether steady state was reached."""
    from conduit_core.planning.tuner import is_steady
    times: list[float] = []
    while len(times) < most:
        t0 = time.perf_counter()
        run.algo.train()
        times.append(time.perf_counter() - t0)
        if len(times) >= least and is_steady(times, window=window, tol=tol):
            break
    steady = is_steady(times, window=window, tol=tol)
    print(f"warm-up: {len(times)} iterations, {'steady' if steady else 'NOT steady (max reached)'} "
          f"(last {window}: median {statistics.median(times[-window:]):.3f} s)", flush=True)
    return {"iterations": len(times), "steady": steady, "times_s": times}


def profile(run: LiveRun, iters: int, staleness: int):
    """The profile taken up front: the auto-tuner's calibration phases, each twice."""
    from conduit_core.planning.tuner import PHASES, PhaseResult
    results = []
    for c in list(PHASES) * 2:
        run.apply(c)
        run.algo.train()  # settle: the first step after a switch pays for the switch
        wall, steps, m0, m1 = run.time_iters(iters)
        results.append(PhaseResult.from_metrics(c, wall / steps, m0, m1, steps))
    return profile_of(run, results, staleness)


def profile_of(run: LiveRun, results: list, staleness: int):
    from conduit_core.planning.tuner import profile_from_phases
    bsz = max(1, round(results[0].per_step["deliver_items"]))
    run.phases = [{"config": r.config.label, "step_s": r.step_s, **r.per_step} for r in results]
    return profile_from_phases(results, transition_bytes=run.edp.buffer.spec.stored_bytes_per_transition,
                               batch_size=bsz, staleness=staleness)


def measure(run: LiveRun, configs, *, rounds: int, iters: int, rng: random.Random,
            phases: list | None = None) -> dict[str, list[float]]:
    """Seconds per learner step of each configuration, one value per round. Rounds are
    interleaved (every configuration once per round, a fresh order within each placement,
    the placements alternating) so that drift on a noisy machine spreads over all of them.
    With ``phases`` (a list), the measurements of the calibration configurations
    (``tuner.PHASES``) are also appended to it as profiling phases, and nothing else is."""
    from conduit_core.planning.tuner import PHASES, PhaseResult
    calibration = {c.label for c in PHASES}
    runs: dict[str, list[float]] = {c.label: [] for c in configs}
    placements = sorted({c.placement for c in configs})
    for rnd in range(rounds):
        for pl in placements if rnd % 2 == 0 else placements[::-1]:
            group = [c for c in configs if c.placement == pl]
            rng.shuffle(group)
            for c in group:
                run.apply(c)
                wall, steps, m0, m1 = run.time_iters(iters)
                runs[c.label].append(wall / steps)
                run.steps_seen.append(steps / iters)
                if phases is not None and c.label in calibration:
                    phases.append(PhaseResult.from_metrics(c, wall / steps, m0, m1, steps))
    return runs


def resolution(runs: dict[str, list[float]]) -> float:
    """Two standard errors of a configuration's median, relative (median over configurations):
    differences smaller than this are ties at this many rounds."""
    rel = [1.2533 * statistics.stdev(v) / np.sqrt(len(v)) / statistics.median(v) for v in runs.values() if len(v) > 1]
    return 2 * statistics.median(rel) if rel else 0.0


def main(argv=None):
    import ray

    from conduit_core.planning.costmodel import enumerate_configs, predict

    from ..common import fmt_table, machine, write_json
    p = argparse.ArgumentParser(prog="conduit tune rllib-dqn", description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", type=int, nargs="+", default=[128, 256, 512, 1000, 2000])
    p.add_argument("--iters", type=int, default=1, help="RLlib iterations per measurement")
    p.add_argument("--rounds", type=int, default=4, help="interleaved measurements per configuration (median)")
    p.add_argument("--confirm-rounds", type=int, default=6,
                   help="fresh rounds over the measured and predicted top-8 (the unbiased best and pick)")
    p.add_argument("--profile-iters", type=int, default=4, help="RLlib iterations per profiling phase")
    p.add_argument("--profile", choices=("before", "interleaved"), default="interleaved",
                   help="'before': profile, then survey; 'interleaved': the profile is the survey's "
                        "measurements of the calibration configurations (spread over the survey, so "
                        "drift averages out); either way predictions precede the confirmation rounds")
    p.add_argument("--warmup", type=int, default=5, help="RLlib iterations before profiling, at least")
    p.add_argument("--max-warmup", type=int, default=60,
                   help="at most this many: warm-up ends once iteration time is steady (tuner.is_steady)")
    p.add_argument("--steady-window", type=int, default=5)
    p.add_argument("--steady-tol", type=float, default=0.03)
    p.add_argument("--steps-per-iter", type=int, default=250, help="min_sample_timesteps_per_iteration")
    p.add_argument("--staleness", type=int, default=32, help="the semantic bound every configuration keeps")
    p.add_argument("--json", default="out/tune_rllib.json")
    a = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not ray.is_initialized():
        from conduit_core.remote.ray_local import init_local
        init_local(num_cpus=2, object_store_memory=256 << 20, log_to_driver=False)
    configs = enumerate_configs()
    by_label = {c.label: c for c in configs}
    cores = os.cpu_count() or 2
    report = {"machine": machine(), "configs": len(configs), "args": vars(a), "dims": {}}
    for dims in a.dims:
        t_start = time.perf_counter()
        run = LiveRun(build(dims, staleness=a.staleness, steps_per_iter=a.steps_per_iter))
        rng = random.Random(dims)
        try:
            warm = warm_up(run, a.warmup, a.max_warmup, a.steady_window, a.steady_tol)
            if a.profile == "before":
                prof = profile(run, a.profile_iters, a.staleness)
                survey = measure(run, configs, rounds=a.rounds, iters=a.iters, rng=rng)
            else:
                phases: list = []
                survey = measure(run, configs, rounds=a.rounds, iters=a.iters, rng=rng, phases=phases)
                prof = profile_of(run, phases, a.staleness)
            preds = {c.label: predict(c, prof, cores=cores).step_s for c in configs}
            # The minimum of 48 noisy medians is biased low (the winner's curse): the best,
            # the pick and the top-8 order are judged on fresh rounds over the candidates.
            order_s = sorted(survey, key=lambda k: statistics.median(survey[k]))
            order_p = sorted(preds, key=preds.get)
            candidates = list(dict.fromkeys(order_s[:8] + order_p[:8]))
            confirm = measure(run, [by_label[k] for k in candidates], rounds=a.confirm_rounds, iters=a.iters,
                              rng=rng)
        finally:
            run.algo.stop()
        steps_per_iter = statistics.median(run.steps_seen)
        per_iter = lambda runs: {k: statistics.median(v) * steps_per_iter for k, v in runs.items()}
        report["dims"][dims] = summarize(
            dims, {k: v * steps_per_iter for k, v in preds.items()}, per_iter(survey), per_iter(confirm),
            resolution(confirm), prof, steps_per_iter, time.perf_counter() - t_start, fmt_table,
            confirm_rounds=confirm)
        report["dims"][dims]["rounds_s_per_step"] = {"survey": survey, "confirm": confirm}
        report["dims"][dims]["profile_phases"] = run.phases
        report["dims"][dims]["warmup"] = warm
        write_json(a.json, report)
    return report


def summarize(dims, pred, survey, confirm, res, prof, steps_per_iter, seconds, fmt_table, *,
              confirm_rounds: dict[str, list[float]]) -> dict:
    order_s = sorted(survey, key=survey.get)
    order_p = sorted(pred, key=pred.get)
    order_c = sorted(confirm, key=confirm.get)
    best, pick = order_c[0], order_p[0]
    rows = [[c, f"{pred[c]:.3f}", f"{survey[c]:.3f}", f"{confirm[c]:.3f}" if c in confirm else "",
             f"{(pred[c] - confirm.get(c, survey[c])) / confirm.get(c, survey[c]):+.0%}"] for c in order_s]
    print(f"\ndims {dims}: {len(survey)} configurations, seconds per iteration ({steps_per_iter:.0f} learner steps), "
          f"survey order")
    print(fmt_table(rows, ["config", "predicted s", "survey s", "confirmed s", "error"]))
    err = abs(pred[best] - confirm[best]) / confirm[best]
    top = pair_agreement(order_p[:8], confirm, res)
    top["overlap_survey"] = len(set(order_p[:8]) & set(order_s[:8]))
    # The ceiling for "identical order": does the measurement reproduce its own top-8 order?
    top["measured_stability"] = order_stability(confirm_rounds, order_c[:8])
    top["measured_split_half"] = split_half(confirm_rounds)
    print(f"best (confirmed) {best} predicted within {err:.1%}; auto-pick {pick} is "
          f"{confirm[pick] / confirm[best] - 1:+.1%} from it; predicted top-8: {top['overlap_survey']}/8 in the "
          f"survey's top-8, pairs in confirmed order or tied within {res:.1%}: {top['pairs_ok']}/{top['pairs']} "
          f"(strictly ordered {top['pairs_strict']}/{top['pairs']}); {seconds:.0f} s")
    stab, half = top["measured_stability"], top["measured_split_half"]
    print(f"the measurement's own top-8 order: the same in {stab['p_identical']:.1%} of bootstrap resamples "
          f"of its rounds ({stab['mean_pairs']:.1f}/{stab['pairs']} pairs on average); two halves of the rounds "
          f"agree on {half['pairs_agree']}/{half['pairs']} pairs")
    return {"predicted_s": pred, "survey_s": survey, "confirmed_s": confirm, "profile": prof.to_dict(),
            "steps_per_iter": steps_per_iter, "best": best, "pick": pick, "best_error": err,
            "pick_vs_best": confirm[pick] / confirm[best] - 1, "resolution": res, "top8": top, "seconds": seconds}
