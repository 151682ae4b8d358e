"""The learner's train batch for a delivered batch: RLlib's ``MultiAgentBatch`` of
``SampleBatch`` es, as ``Learner._make_batch_if_necessary`` builds it, with the
``SampleBatch`` copied from one RLlib's constructor built instead of constructed per update.

Why: after the learner connector, RLlib wraps its columns in a ``SampleBatch`` on every
update; the constructor is some 25 Python calls (isinstance checks per column, sequence-length
handling, a timestep count that walks the columns) for columns Conduit has just handed over as
tensors of one row each. That wrapping is on the exposed path issue 18 counts
(``benchmarks/rllib/timing.py``: the learner's whole batch building) and was about half of it.

A copy is only made where the constructor's work does not depend on the data: every column a
``torch.Tensor`` with at least one row, under the same keys (in the same order) as the batch
the copied one was built from, none of them a key the constructor treats specially (sequence
lengths, infos, recurrent states, ``is_training``, ``dones``). Anything else goes through
RLlib's constructor. ``tests/rllib/test_learner_batch.py`` compares every field, the contents
and the order with what RLlib's own ``_make_batch_if_necessary`` builds.
"""

from __future__ import annotations

import torch

from .constructed import PLAIN_CONTAINERS, constructed_fields

SPECIAL_KEYS = frozenset(("seq_lens", "infos", "is_training", "dones"))
MAX_LAYOUTS = 8   # key layouts remembered (a learner sees one or two)


def _copyable(cols: dict) -> bool:
    for k, v in cols.items():
        if type(v) is not torch.Tensor or type(k) is not str or k in SPECIAL_KEYS \
                or k.startswith(("state_in_", "state_out_")):
            return False
    return bool(cols)


def _rows(cols: dict) -> int:
    """RLlib's count (``attempt_count_timesteps``) of tensor columns: the first non-zero length."""
    for v in cols.values():
        if not v.is_nested and v.dim() and v.shape[0]:   # (a nested tensor has no len: RLlib skips it)
            return v.shape[0]
    return 0


class SampleBatchMaker:
    def __init__(self, sample_batch_cls):
        self._cls = sample_batch_cls
        self._layouts: dict[tuple, tuple | None] = {}

    def _layout(self, keys: tuple, cols: dict) -> tuple | None:
        if len(self._layouts) >= MAX_LAYOUTS or not _copyable(cols):
            return None
        made = constructed_fields(lambda: self._cls(dict(cols)), containers=PLAIN_CONTAINERS + (set,))
        if made is None or made.clocks or made.fields.get("count") != _rows(cols):
            layout = None   # (a field it cannot copy, or a count that is not the columns' rows)
        else:
            layout = (made.fields, made.containers)   # (its count replaced in place: field order kept)
        self._layouts[keys] = layout
        return layout

    def build(self, cols: dict):
        """``SampleBatch(cols)``: a copy where it can be, else RLlib's constructor."""
        keys = tuple(cols)
        layout = self._layouts.get(keys, False)
        if layout is False:
            layout = self._layout(keys, cols)
        if layout is not None:
            for v in cols.values():   # (tensors all: RLlib's constructor would convert nothing)
                if type(v) is not torch.Tensor:
                    break
            else:
                first = cols[keys[0]]
                rows = first.shape[0] if first.dim() and not first.is_nested else 0
                if rows:   # (RLlib counts the first column with rows: this one)
                    fields, containers = layout
                    sb = dict.__new__(self._cls)
                    dict.update(sb, cols)
                    d = fields.copy()
                    for k, make in containers:
                        d[k] = make()
                    d["count"] = rows
                    sb.__dict__ = d
                    return sb
        return self._cls(cols)
