"""Row contents: every delivered row holds its own transition's values, exactly.

The other checks of ``deliver`` read which transitions were delivered (the ids, ``obs[:, 0]``).
A delivery path can hand the learner the right ids with the wrong contents: another row's
reward, ``next_obs`` equal to ``obs``, a column shifted by one, a flag lost, a sign flipped, a
lossy cast. These checks read the rows as the learner gets them (``Delivered.rows``, keys among
``ROW_FIELDS``, mapped from the framework's names by the harness) and compare every field of
every row with ``SyntheticRollout.columns()`` of the row with that id. The synthetic values are
exact in float32 (ids start past 2**22, so a cast to float16 or bfloat16 loses them), so the
comparison is exact. n-step rows (``Session.deliver_rows``) are checked by
``deliver/nstep_rows_true``; these checks read ``Session.deliver``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .checks_semantic import _closing
from .checks_windows import episodes_for, priority_of
from .harness import ROW_FIELDS, Delivered, SyntheticRollout
from .registry import CheckSkipped, check, ensure

FIRST_ID = (1 << 22) + 3      # ids and ids + 0.5 stay exact in float32 (below 2**23), not in float16/bfloat16
REQUIRED = ("obs", "reward")  # every learner gets these; the others are checked where the learner gets them
BATCH, DRAWS = 64, 8


def _value(a) -> str:
    return repr(a.tolist())


@dataclass
class Truth:
    """Every ingested transition's columns, by id."""

    index: dict[int, int]
    columns: dict[str, np.ndarray]

    @classmethod
    def of(cls, rollouts: list[SyntheticRollout]) -> "Truth":
        cols = [r.columns() for r in rollouts]
        ids = np.concatenate([r.ids for r in rollouts]).astype(np.int64)
        return cls({int(i): k for k, i in enumerate(ids)}, {f: np.concatenate([c[f] for c in cols]) for f in ROW_FIELDS})

    def _whose(self, field: str, value: np.ndarray) -> str:
        """' (the <field> of id N)' where exactly one transition has that value, else ''."""
        col = self.columns[field]
        hit = np.flatnonzero((col.reshape(col.shape[0], -1) == value.reshape(1, -1)).all(axis=1))
        if hit.size != 1:
            return ""
        owner = next(i for i, k in self.index.items() if k == hit[0])
        return f" (the {field} of id {owner})"

    def verify(self, d: Delivered, where: str) -> list[str]:
        """Every row of ``d`` holds its id's values, field by field; returns the fields compared."""
        ids = np.asarray(d.ids).astype(np.int64)
        if ids.size == 0:
            return []     # nothing delivered, nothing to compare (the callers require some rows in all)
        if d.rows is None:
            raise CheckSkipped(f"{where}: deliver() returned no rows (Delivered.rows is None), so the suite cannot "
                               "see what the learner gets; fill Delivered.rows in the session's deliver() "
                               "(docs/writing-an-adapter.md, section 3)")
        unknown = sorted(set(d.rows) - set(ROW_FIELDS))
        ensure(not unknown, f"{where}: Delivered.rows has keys {unknown}; expected keys among {list(ROW_FIELDS)}. "
                            "Fix: map the framework's column names to the suite's in the harness")
        missing = [f for f in REQUIRED if f not in d.rows]
        ensure(not missing, f"{where}: Delivered.rows lacks {missing}: every learner gets {list(REQUIRED)}. Fix: "
                            "return them as the learner receives them")
        alien = [int(i) for i in ids if int(i) not in self.index]
        ensure(not alien, f"{where}: delivered ids {alien[:6]} were never ingested")
        at = np.array([self.index[int(i)] for i in ids])
        fields = [f for f in ROW_FIELDS if f in d.rows]
        for f in fields:
            want = self.columns[f][at]
            got = np.asarray(d.rows[f])
            ensure(got.ndim >= 1 and got.shape[0] == ids.size and got.size == want.size,
                   f"{where}: Delivered.rows[{f!r}] has shape {got.shape} for {ids.size} delivered rows; expected "
                   f"{want.shape} (one entry per row, in the order of Delivered.ids)")
            got = got.reshape(want.shape)
            same = (got == want).reshape(ids.size, -1).all(axis=1)
            if not same.all():
                k = int(np.flatnonzero(~same)[0])
                ensure(False, f"{where}: {f} of the row with id {ids[k]} is {_value(got[k])}, expected "
                              f"{_value(want[k])}{self._whose(f, got[k])}; {int((~same).sum())} of {ids.size} "
                              f"delivered rows differ in {f} (delivered as {got.dtype}, ingested as {want.dtype})")
        return fields


def _summary(counts: dict[str, int], fields: set[str]) -> str:
    """What was compared, for the report: rows per path, fields, and the fields the learner does not get."""
    ensure(sum(counts.values()) > 0, f"no rows were delivered ({counts}): nothing to compare")
    absent = [f for f in ROW_FIELDS if f not in fields]
    return ("; ".join(f"{where}: {n} rows" for where, n in counts.items())
            + f"; fields {', '.join(f for f in ROW_FIELDS if f in fields)}"
            + (f" (not delivered: {', '.join(absent)})" if absent else ""))


def _replay_rows_intact(ctx, rolls: list[SyntheticRollout], *, need: tuple[str, ...] = ()) -> str:
    """Ingest ``rolls`` into uniform (and, where declared, prioritized) replay, deliver, and compare
    every delivered row with its id's columns; ``need``: fields the rows must include."""
    truth = Truth.of(rolls)
    counts, fields = {}, set()
    for prioritized in [False] + (["prioritized"] if "prioritized" in ctx.harness.capabilities else []):
        where = "prioritized replay" if prioritized else "uniform replay"
        with _closing(ctx.session(prioritized=bool(prioritized))) as s:
            for r in rolls:
                s.ingest(r)
            s.flush()
            for _ in range(DRAWS):
                d = s.deliver(BATCH)
                got = truth.verify(d, where)
                missing = [f for f in need if len(d.ids) and f not in got]
                ensure(not missing, f"{where}: Delivered.rows has no {missing}, so the suite cannot see what the "
                       "learner gets. Fix: return them in Delivered.rows, or do not declare the capability that "
                       "needs them")
                fields |= set(got)
                counts[where] = counts.get(where, 0) + len(d.ids)
                if prioritized:   # unequal priorities: weighted draws, through the path's own update
                    s.update_priorities(d, priority_of(d.ids))
    return _summary(counts, fields)


@check("deliver/rows_intact", needs=("replay",))
def rows_intact(ctx) -> str:
    """Every row replay delivers (uniform, and prioritized where declared) holds its own
    transition's obs, next_obs, action, reward and flags, exactly, as the learner gets them."""
    return _replay_rows_intact(ctx, episodes_for(ctx.seed + 4, n=30, start=FIRST_ID))


@check("deliver/continuous_actions_intact", needs=("replay", "continuous"))
def continuous_actions_intact(ctx) -> str:
    """Continuous actions (3 float32 components, as SAC's or TD3's) reach the learner with the
    values they were stored with, in every delivered row, with the row's other fields. An
    adapter written for discrete actions, or one that narrows them (float16, integers), fails."""
    return _replay_rows_intact(ctx, episodes_for(ctx.seed + 6, n=30, start=FIRST_ID, action_dims=3), need=("action",))


@check("onpolicy/rows_intact", needs=("onpolicy",))
def onpolicy_rows_intact(ctx) -> str:
    """Every row an on-policy delivery hands the learner (two policy versions, one after the
    other) holds its own transition's obs, next_obs, action, reward and flags, exactly."""
    counts, fields, ingested = {}, set(), []
    with _closing(ctx.session(onpolicy=True)) as s:
        for version in (0, 1):
            rolls = episodes_for(ctx.seed + 5 + version, n=12, start=FIRST_ID + 100_000 * version)
            for r in rolls:
                r.policy_version = version
                s.ingest(r)
            s.flush()
            ingested += rolls   # which version gets which rows is onpolicy/version_isolation's business
            where = f"on-policy, version {version}"
            d = s.deliver(None, policy_version=version)
            fields |= set(Truth.of(ingested).verify(d, where))
            counts[where] = len(d.ids)
    return _summary(counts, fields)
