"""The two-sample test the distribution checks share."""

from __future__ import annotations

import numpy as np
from scipy import stats

MIN_CELL = 20  # categories seen fewer times than this (both samples together) are pooled into one


def two_sample_chi2(a: list, b: list) -> float:
    """p-value of a chi-square test that samples ``a`` and ``b`` of hashable categories come
    from one distribution; rare categories are pooled so every cell's expectation is large
    enough for the test. 1.0 when there is a single category."""
    cats = sorted(set(a) | set(b))
    ca, cb = dict.fromkeys(cats, 0), dict.fromkeys(cats, 0)
    for c in a:
        ca[c] += 1
    for c in b:
        cb[c] += 1
    table, rest = [], [0, 0]
    for c in cats:
        if ca[c] + cb[c] < MIN_CELL:
            rest[0] += ca[c]
            rest[1] += cb[c]
        else:
            table.append([ca[c], cb[c]])
    if rest[0] + rest[1]:
        table.append(rest)
    if len(table) < 2:
        return 1.0
    return float(stats.chi2_contingency(np.array(table).T).pvalue)
