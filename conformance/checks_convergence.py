"""Convergence checks: with Conduit, the framework's reference workload needs as many env
steps to reach its return threshold as it needs natively: not more, and not fewer.

Faster learning is a semantic bug too (a data plane that delivers a different n-step
distribution can make DQN learn faster), so the test is two-sided. Each seed runs both
paths; a run that never reaches the threshold counts as its whole budget (censored), and a
path that reaches it on no seed while the other reaches it on every seed fails outright.

- the ratio of the median steps (Conduit / native) must lie within [1/R, R];
- with 5 or more seeds, a two-sided Mann-Whitney U test must not reject equal
  distributions at 5%.

R is 2.0 with 5 or more seeds and 2.5 with fewer (CI runs 2 seeds). The bounds are set
by the spread of steps-to-threshold across seeds, measured: RLlib DQN CartPole's log-steps
vary with sd 0.38 (PPO's 0.16). At that spread a correct adapter is flagged about 5% of
the time with 5 seeds (2% with 2), and the test catches a true 0.6x ratio (what the
shortened-window bug did) 44% of the time for DQN and 97% for PPO with 5 seeds: learning
curves are a coarse check. The sharp one is ``equivalence/nstep_matches_native``, which
compares what is delivered on the same data. The full run is
``CONDUIT_CONVERGENCE_SEEDS=0,1,2,3,4 conduit conformance NAME --level convergence -k
'convergence/*'``; docs/benchmarks.md has its figures and the power of the test.

Each workload a harness offers becomes the check ``convergence/<workload>``. A harness seeds
every random source of both paths from the seed it is given, the framework's own included, so a CI
run's draw repeats (RLlib 2.60 leaves its episode replay buffers unseeded; the RLlib harness seeds
them).

The runs are independent, so they run side by side in worker processes (``run_all``): one per
core by default, at most 4 (an RLlib run with the Ray session it starts holds ~1.1 GB, measured),
``$CONDUIT_CONVERGENCE_WORKERS`` to choose (1 runs them in this process, one after the other). A run that cannot be sent to another process (a closure, a lambda) runs here.
Each run is seeded, so where it runs does not change its steps.
"""

from __future__ import annotations

import os
import pickle
from concurrent.futures import ProcessPoolExecutor
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


def ratio_bound(n_seeds: int) -> float:
    return 2.0 if n_seeds >= FULL_SEEDS else 2.5


def compare(native_steps: list[int], conduit_steps: list[int]) -> tuple[float, float | None, float]:
    """(median ratio Conduit/native, Mann-Whitney two-sided p or None under 5 seeds, bound R)."""
    ratio = float(np.median(conduit_steps) / max(np.median(native_steps), 1))
    p = None
    if len(native_steps) >= FULL_SEEDS:
        from scipy.stats import mannwhitneyu
        p = float(mannwhitneyu(conduit_steps, native_steps, alternative="two-sided").pvalue)
    return ratio, p, ratio_bound(len(native_steps))


@check("convergence/*", needs=("convergence",), level="convergence")
def convergence(ctx, workload: str, run) -> None:
    """Conduit needs as many env steps to the reference return as native: not more, not fewer."""
    calls = [(path, seed) for seed in seeds() for path in ("native", "conduit")]
    results = run_all(run, calls)
    native, conduit = results[0::2], results[1::2]
    budget = max(r.env_steps for r in native + conduit)
    steps = lambda rs: [r.env_steps if r.reached else budget for r in rs]
    ns, cs = steps(native), steps(conduit)
    ratio, p, bound = compare(ns, cs)
    shown = lambda rs: "[" + ", ".join(f"{r.env_steps}" if r.reached else f">{budget} (not reached)"
                                         for r in rs) + "]"
    detail = f"env steps to the threshold over seeds {list(seeds())}: native {shown(native)}, Conduit {shown(conduit)}"
    reached_n, reached_c = sum(r.reached for r in native), sum(r.reached for r in conduit)
    # a censored run counts as the budget, which caps the ratio: a path that never reaches the
    # threshold while the other always does fails however large the budget (found in review)
    ensure(not (reached_n == len(native) and reached_c == 0),
           f"Conduit never reaches the threshold, native does on every seed; {detail}")
    ensure(not (reached_c == len(conduit) and reached_n == 0),
           f"Conduit reaches the threshold on every seed, native on none (learns faster); {detail}")
    ensure(1 / bound <= ratio <= bound,
           f"Conduit {'learns faster' if ratio < 1 else 'learns slower'} than native: median ratio {ratio:.2f} "
           f"outside [{1 / bound:.2f}, {bound:.2f}]; {detail}")
    if p is not None:
        ensure(p >= 0.05, f"steps to the threshold differ (Mann-Whitney two-sided p={p:.3f}); {detail}")
    return f"median ratio {ratio:.2f} within [{1 / bound:.2f}, {bound:.2f}]" + \
        ("" if p is None else f", Mann-Whitney p={p:.2f}") + f"; {detail}"
