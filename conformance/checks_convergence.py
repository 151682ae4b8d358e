"""Convergence checks: with Conduit, the framework's reference workload needs as many env
steps to reach its return threshold as it needs natively: not more, and not fewer.

Faster learning is a semantic bug too (a data plane that delivers a different n-step
distribution can make DQN learn faster), so the test is two-sided. Each seed runs both
paths; a run that never reaches the threshold counts as its whole budget (censored), and a
path that reaches it on no seed while the other reaches it on every seed fails outright.

The statistic is a ratio of steps, Conduit / native, which must lie within [1/R, R]. Where the
harness declares the native arm's spread on the workload (``Harness.convergence_spread``: the sd of
log-steps over seeds, measured with ``conduit conformance NAME --calibrate-convergence``), it is the
ratio of the geometric means (the mean of log-steps) and R comes from the spread: with k seeds per
arm the log-ratio of two equal arms has sd ``s * sqrt(2 / k)``, and ``R = exp(Z * s * sqrt(2 / k))``
with ``Z = 3.29`` flags a correct adapter with probability 0.1% (log-steps taken as normal), so the
check cannot fail CI by chance; the report gives the ratio it could detect at 80% power. Where no
spread is declared, it is the ratio of the medians and R the fixed bound set from RLlib's DQN
spread (2.5 with fewer than 5 seeds, 2.0 with 5 or more); the report says the margin is not
calibrated, and with 5 or more seeds a two-sided Mann-Whitney U test must not reject equal
distributions at 5% as well.

Learning curves are a coarse check: at RLlib DQN CartPole's spread (0.38) two seeds detect only a
ratio of about 6x. The sharp checks compare what is delivered on the same data
(``equivalence/nstep_matches_native``, ``equivalence/exact_with_shared_rng``). The full run is
``CONDUIT_CONVERGENCE_SEEDS=0,1,2,3,4 conduit conformance NAME --level convergence -k
'convergence/*'``.

Each workload a harness offers becomes the check ``convergence/<workload>``. A harness seeds
every random source of both paths from the seed it is given, the framework's own included, so a CI
run's draw repeats (RLlib 2.60 leaves its episode replay buffers unseeded; the RLlib harness seeds
them).

The runs are independent, so they run side by side in worker processes (``run_all``): one per
core by default, at most 4 (an RLlib run with the Ray session it starts holds ~1.1 GB, measured),
``$CONDUIT_CONVERGENCE_WORKERS`` to choose (1 runs them in this process, one after the other). A run
that cannot be sent to another process (a closure, a lambda) runs here. Each run is seeded, so where
it runs does not change its steps. A harness whose faults live in module state (a flag a test sets)
must run with 1 worker: a spawned process imports the module afresh.
"""

from __future__ import annotations

import os
import pickle
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import numpy as np

from .registry import check, ensure

SEEDS_ENV = "CONDUIT_CONVERGENCE_SEEDS"
WORKERS_ENV = "CONDUIT_CONVERGENCE_WORKERS"
DEFAULT_MAX_WORKERS = 4
DEFAULT_SEEDS = (0, 1)
FULL_SEEDS = 5


def seeds() -> tuple[int, ...]:
    """The seeds to run: ``$CONDUIT_CONVERGENCE_SEEDS`` (comma-separated) or the CI default."""
    raw = os.environ.get(SEEDS_ENV, "").strip()
    if not raw:
        return DEFAULT_SEEDS
    try:
        out = tuple(int(s) for s in raw.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"{SEEDS_ENV}: expected comma-separated integers, got {raw!r}. "
                         f"Fix: e.g. {SEEDS_ENV}=0,1,2,3,4") from None
    if not out:
        raise ValueError(f"{SEEDS_ENV}: expected at least one seed, got {raw!r}. Fix: e.g. {SEEDS_ENV}=0,1")
    return out


def workers(n_runs: int) -> int:
    """How many runs go side by side: ``$CONDUIT_CONVERGENCE_WORKERS``, or one per core up to
    ``DEFAULT_MAX_WORKERS``; never more than ``n_runs``."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if raw:
        try:
            wanted = int(raw)
        except ValueError:
            wanted = 0
        if wanted < 1:
            raise ValueError(f"{WORKERS_ENV}: expected a positive integer, got {raw!r}. "
                             f"Fix: e.g. {WORKERS_ENV}=2, or 1 to run one after the other in this process")
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        wanted = min(cores, DEFAULT_MAX_WORKERS)
    return max(1, min(wanted, n_runs))


def _sendable(run) -> bool:
    try:
        pickle.dumps(run)
    except Exception:  # noqa: BLE001 - a closure or lambda: it runs in this process
        return False
    return True


def run_all(run, calls: list[tuple[str, int]]) -> list:
    """``[run(path, seed) for path, seed in calls]``, side by side in fresh (spawned) processes
    when more than one worker is wanted and ``run`` can be sent there. A run that raises raises
    here; a worker that dies fails the call (``BrokenProcessPool``) rather than hanging it; the
    pool is joined before this returns."""
    n = workers(len(calls))
    if n == 1 or not _sendable(run):
        return [run(path, seed) for path, seed in calls]
    with ProcessPoolExecutor(max_workers=n, mp_context=get_context("spawn")) as pool:
        return list(pool.map(run, [p for p, _ in calls], [s for _, s in calls]))


Z_FALSE_ALARM = 3.29   # two-sided: a correct adapter is flagged with probability 0.1%
Z_POWER = 0.84         # 80% power, for the ratio the seeds could detect


def ratio_bound(n_seeds: int, spread: float | None = None) -> float:
    """R: a ratio outside [1/R, R] fails. From the native arm's measured spread where
    declared (a 0.1% false-alarm rate), else the fixed bound set from RLlib DQN's spread."""
    if spread is not None:
        return float(np.exp(Z_FALSE_ALARM * spread * np.sqrt(2.0 / n_seeds)))
    return 2.0 if n_seeds >= FULL_SEEDS else 2.5


def detectable_ratio(n_seeds: int, spread: float) -> float:
    """The learning-speed ratio these seeds detect with 80% power at the check's false-alarm rate."""
    return float(np.exp((Z_FALSE_ALARM + Z_POWER) * spread * np.sqrt(2.0 / n_seeds)))


def check_spread(workload: str, spread) -> float | None:
    if spread is None:
        return None
    if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not 0 < spread < 10:
        raise ValueError(f"convergence_spread()[{workload!r}]: expected the sd of log(env steps) over seeds, a "
                         f"number in (0, 10), got {spread!r}. Fix: measure it with conduit conformance NAME "
                         "--calibrate-convergence")
    return float(spread)


def compare(native_steps: list[int], conduit_steps: list[int],
            spread: float | None = None) -> tuple[float, float | None, float]:
    """(ratio Conduit/native, Mann-Whitney two-sided p or None, bound R). With a declared spread the
    ratio is that of the geometric means (the mean of log-steps: the statistic the bound is derived
    for); without, that of the medians, with the U test from 5 seeds on."""
    if spread is not None:
        logs = lambda xs: np.log(np.maximum(np.asarray(xs, dtype=np.float64), 1.0))
        ratio = float(np.exp(logs(conduit_steps).mean() - logs(native_steps).mean()))
        return ratio, None, ratio_bound(len(native_steps), spread)
    ratio = float(np.median(conduit_steps) / max(np.median(native_steps), 1))
    p = None
    if len(native_steps) >= FULL_SEEDS and spread is None:
        from scipy.stats import mannwhitneyu
        p = float(mannwhitneyu(conduit_steps, native_steps, alternative="two-sided").pvalue)
    return ratio, p, ratio_bound(len(native_steps), spread)


def native_spread(steps, reached) -> float:
    """The sd of log(env steps to the threshold) over runs, a run that never reached it counted as the
    largest budget of any (NaN for fewer than two runs): what ``convergence_spread`` declares."""
    budget = max(steps)
    logs = np.log([max(s if r else budget, 1) for s, r in zip(steps, reached)])
    return float(np.std(logs, ddof=1)) if len(logs) > 1 else float("nan")


def calibrate(harness, seed_list: list[int]) -> dict[str, dict]:
    """The native arm's spread per workload: sd of log(env steps to the threshold) over
    ``seed_list`` (runs that never reach it count as the budget), what ``convergence_spread``
    declares. Also the bound and the detectable ratio it gives at the CI's and the full seeds."""
    out = {}
    for name, run in sorted(harness.convergence_workloads().items()):
        results = run_all(run, [("native", s) for s in seed_list])
        sd = native_spread([r.env_steps for r in results], [r.reached for r in results])
        out[name] = {"spread": sd, "seeds": list(seed_list), "steps": [int(r.env_steps) for r in results],
                     "reached": [bool(r.reached) for r in results],
                     "bound_2_seeds": ratio_bound(2, sd), "detectable_2_seeds": detectable_ratio(2, sd),
                     "bound_5_seeds": ratio_bound(5, sd), "detectable_5_seeds": detectable_ratio(5, sd)}
    return out


@dataclass(frozen=True)
class Verdict:
    """The convergence check's decision on two arms' steps to the threshold (``judge``)."""
    ok: bool
    ratio: float            # Conduit / native: geometric means with a declared spread, else medians
    bound: float            # R: a ratio outside [1/R, R] fails
    p: float | None         # two-sided Mann-Whitney p (undeclared spread, 5 seeds or more), else None
    failure: str = ""       # why it fails, in words (empty when ok)


def judge(native_steps, native_reached, conduit_steps, conduit_reached, spread: float | None = None) -> Verdict:
    """The check's decision, a pure function of the runs: steps to the threshold per seed and
    whether each run reached it (a run that did not counts as the largest budget of any run). What
    ``convergence/<workload>`` applies, and what the lab's power study replays on stored runs
    (benchmarks/suite/convergence_power.py) to measure its false-alarm rate and what it detects."""
    budget = max(list(native_steps) + list(conduit_steps))
    censor = lambda steps, reached: [s if r else budget for s, r in zip(steps, reached)]   # noqa: E731
    ns, cs = censor(native_steps, native_reached), censor(conduit_steps, conduit_reached)
    ratio, p, bound = compare(ns, cs, spread)
    reached_n, reached_c = sum(map(bool, native_reached)), sum(map(bool, conduit_reached))
    # a censored run counts as the budget, which caps the ratio: a path that never reaches the
    # threshold while the other always does fails however large the budget (found in review)
    if reached_n == len(ns) and reached_c == 0:
        return Verdict(False, ratio, bound, p, "Conduit never reaches the threshold, native does on every seed")
    if reached_c == len(cs) and reached_n == 0:
        return Verdict(False, ratio, bound, p, "Conduit reaches the threshold on every seed, native on none "
                                               "(learns faster)")
    if not 1 / bound <= ratio <= bound:
        return Verdict(False, ratio, bound, p,
                       f"Conduit {'learns faster' if ratio < 1 else 'learns slower'} than native: "
                       f"{'geometric-mean' if spread is not None else 'median'} ratio {ratio:.2f} "
                       f"outside [{1 / bound:.2f}, {bound:.2f}]")
    if p is not None and not p >= 0.05:   # (a NaN p fails, as it did)
        return Verdict(False, ratio, bound, p, f"steps to the threshold differ (Mann-Whitney two-sided p={p:.3f})")
    return Verdict(True, ratio, bound, p)


@check("convergence/*", needs=("convergence",), level="convergence")
def convergence(ctx, workload: str, run) -> None:
    """Conduit needs as many env steps to the reference return as native: not more, not fewer."""
    calls = [(path, seed) for seed in seeds() for path in ("native", "conduit")]
    results = run_all(run, calls)
    native, conduit = results[0::2], results[1::2]
    budget = max(r.env_steps for r in native + conduit)
    spread = check_spread(workload, ctx.harness.convergence_spread().get(workload))
    v = judge([r.env_steps for r in native], [r.reached for r in native],
              [r.env_steps for r in conduit], [r.reached for r in conduit], spread)
    ratio, p, bound = v.ratio, v.p, v.bound
    shown = lambda rs: "[" + ", ".join(f"{r.env_steps}" if r.reached else f">{budget} (not reached)"
                                         for r in rs) + "]"
    detail = f"env steps to the threshold over seeds {list(seeds())}: native {shown(native)}, Conduit {shown(conduit)}"
    ensure(v.ok, f"{v.failure}; {detail}")
    margin = (f"margin from the native spread {spread:.2f} (false alarms 0.1%; detects {detectable_ratio(len(native), spread):.1f}x "
              f"at 80% power)" if spread is not None else
              "margin not calibrated: the suite's fixed bound (declare Harness.convergence_spread, measured with "
              "--calibrate-convergence)")
    kind = "geometric-mean" if spread is not None else "median"
    return f"{kind} ratio {ratio:.2f} within [{1 / bound:.2f}, {bound:.2f}], {margin}" + \
        ("" if p is None else f", Mann-Whitney p={p:.2f}") + f"; {detail}"
