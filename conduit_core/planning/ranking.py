"""How well a predicted order agrees with a measured one, and how well the measurement
determines that order in the first place.

A tuner is judged on whether its predicted top-k configurations come in the measured order.
That judgement means something only if the measured order would come out the same when
measured again: configurations whose true times differ by less than the machine's noise
swap places from one run to the next, and no prediction can match an order the measurement
itself does not reproduce. So alongside the agreement (``pair_agreement``) this module
estimates the measurement's own reproducibility from the rounds it already has:

``order_stability``  bootstrap over rounds: how often a resampled measurement gives the same
                     order of the same k configurations (the chance that a second, equally
                     long measurement would confirm the first one's order exactly)
``split_half``       the top-k of half the rounds, ordered by the other half: how many pairs
                     two independent half-measurements agree on (of k(k-1)/2; chance is half)

Rounds are resampled jointly (round r of every configuration together) because the tuner
interleaves them: round r of all configurations ran in the same minutes, so a drift in the
machine is shared within a round and must stay shared in the resample.

Pure functions over ``{config: [seconds per round]}``; no I/O, no framework.
"""

from __future__ import annotations

import random
import statistics
from itertools import combinations


def _medians(runs: dict[str, list[float]], idx: list[int] | None = None) -> dict[str, float]:
    if idx is None:
        return {k: statistics.median(v) for k, v in runs.items()}
    return {k: statistics.median([v[i] for i in idx]) for k, v in runs.items()}


def concordant_pairs(order: list[str], times: dict[str, float]) -> int:
    """Pairs (a before b in ``order``) that ``times`` puts the same way round (b not faster)."""
    return sum(int(times[b] >= times[a]) for a, b in combinations(order, 2))


def pair_agreement(order: list[str], times: dict[str, float], resolution: float) -> dict:
    """How far ``order`` (fastest first) agrees with ``times``: a pair (a before b) agrees
    strictly when b measured no faster, and within the resolution when the two differ by
    less than ``resolution`` (relative: a tie at the measurement's sample size)."""
    ok = strict = total = 0
    for a, b in combinations(order, 2):
        ta, tb = times[a], times[b]
        total += 1
        strict += int(tb >= ta)
        ok += int(tb >= ta or (ta - tb) / tb <= resolution)
    return {"identical": list(order) == sorted(order, key=times.get), "pairs_ok": ok,
            "pairs_strict": strict, "pairs": total}


def _aligned(runs: dict[str, list[float]], keys) -> int:
    lengths = {len(runs[k]) for k in keys}
    if len(lengths) != 1:
        raise ValueError(f"runs: every configuration needs the same number of rounds to resample them "
                         f"together, got lengths {sorted(lengths)}; pass the rounds of one interleaved measurement")
    n = lengths.pop()
    if n < 2:
        raise ValueError(f"runs: need at least 2 rounds per configuration, got {n}")
    return n


def order_stability(runs: dict[str, list[float]], top: list[str], *, resamples: int = 2000,
                    seed: int = 0) -> dict:
    """Bootstrap the rounds (jointly) and re-order ``top`` by each resample's medians.

    Returns ``p_identical`` (the share of resamples whose order of ``top`` equals the order
    the full rounds give), ``mean_pairs`` (concordant pairs with that order, averaged) and
    ``pairs``. A ``p_identical`` near 0 says the measured order of these configurations is
    not determined by the data: they are ties at this sample size.
    """
    n = _aligned(runs, top)
    sub = {k: runs[k] for k in top}
    reference = sorted(top, key=_medians(sub).get)
    rng = random.Random(seed)
    same = pairs = 0
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        med = _medians(sub, idx)
        same += int(sorted(top, key=med.get) == reference)
        pairs += concordant_pairs(reference, med)
    k = len(top)
    return {"p_identical": same / resamples, "mean_pairs": pairs / resamples, "pairs": k * (k - 1) // 2,
            "resamples": resamples}


def split_half(runs: dict[str, list[float]], k: int = 8) -> dict:
    """The top-``k`` by the even rounds, ordered again by the odd rounds: whether two disjoint
    halves of one measurement agree on the order (``identical``) and on how many pairs."""
    n = _aligned(runs, runs)
    first = _medians(runs, list(range(0, n, 2)))
    second = _medians(runs, list(range(1, n, 2)))
    top = sorted(runs, key=first.get)[:k]
    return {"identical": top == sorted(top, key=second.get), "pairs_agree": concordant_pairs(top, second),
            "pairs": len(top) * (len(top) - 1) // 2}
