"""Errors cross processes and Ray actors by pickle. A review (session 23) found that
``ConfigError`` (four constructor arguments, one kept) could not be unpickled, so every
refusal raised inside a Ray actor (a TransferQueue storage unit, a remote shard) reached the
caller as Ray's ``UnserializableException`` instead of the ``ConfigError`` (a ValueError)."""

import pickle

import pytest

from conduit_core.errors import CapacityError, ConfigError, ShardLost, SpecError, StateError


@pytest.mark.parametrize("error", [
    ConfigError("tier", "one of ['pageable']", "'pagable'", "pick a tier name"),
    SpecError("obs", "float32 rows of shape (4,)", "float64 (3,)", "cast the column"),
    ShardLost(1, "node_a", RuntimeError("actor died")), StateError("damaged part 'ring'"),
    CapacityError("too big. Fix: raise capacity")])
def test_every_error_survives_a_pickle_round_trip(error):
    error.stored_tickets = [3, 4]   # what a partly failed call attaches
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and back.stored_tickets == [3, 4]
    if isinstance(error, ConfigError):
        assert (back.argument, back.expected, back.actual, back.fix) == ("tier", "one of ['pageable']", "'pagable'",
                                                                         "pick a tier name")
