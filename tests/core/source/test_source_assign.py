"""The pure parts of ingestion at the source: which shard a source stages in, how a
receipt's rows are cut into shard runs (as ColumnarStorage.write cuts them), the ticket set."""

import numpy as np
import pytest

from conduit_core import ConfigError
from conduit_core.source.source_commit import shard_runs
from conduit_core.source.writer_placement import assign_sources
from conduit_core.remote.staging_area import TicketSet


def test_a_source_stages_on_its_own_node_and_the_rest_spread_evenly():
    shards = {1: "n1", 2: "n2", 3: "n2"}
    assert assign_sources({0: "n1", 1: "n2", 2: "n2", 3: "n2"}, shards) == {0: 1, 1: 2, 2: 3, 3: 2}
    assert assign_sources({0: "head", 1: None, 2: "head"}, shards) == {0: 1, 1: 2, 2: 3}
    with pytest.raises(ConfigError, match="shard_nodes"):
        assign_sources({0: "n1"}, {})


def test_shard_runs_cut_like_the_storage_and_wrap():
    bounds = np.array([0, 10, 30, 40])
    assert shard_runs(bounds, 40, 5, 10) == [(0, 5, 0, 5), (1, 0, 5, 5)]
    assert shard_runs(bounds, 40, 35, 20) == [(2, 5, 0, 5), (0, 0, 5, 10), (1, 0, 15, 5)]
    assert shard_runs(bounds, 40, 12, 3) == [(1, 2, 0, 3)]


def test_ticket_set_keeps_a_low_mark_and_the_gaps():
    t = TicketSet()
    for k in (0, 2, 1, 5):
        t.add(k)
    assert t.low == 3 and t.above == {5} and 1 in t and 4 not in t and 5 in t
