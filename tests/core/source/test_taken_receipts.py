"""The ingest ledger's set of taken receipts: the same answers as a plain set of every key, in
memory that stays a few ints per writer when tickets arrive about in order."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conduit_core.errors import StateError
from conduit_core.source.source_commit import CommitLedger
from conduit_core.source.taken_receipts import TakenReceipts

keys = st.lists(st.tuples(st.sampled_from(["w0", "w1", "w2"]), st.integers(0, 40)), max_size=120)


def bad(part, expected, got):
    return StateError(f"ingest.{part}: expected {expected}, got {got}")


@settings(max_examples=200, deadline=None)
@given(keys)
def test_answers_as_a_set_of_every_key_and_survives_its_state(added):
    taken, model = TakenReceipts(), set()
    for key in added:
        taken.add(key)
        model.add(key)
        assert len(taken) == len(model)
    probe = [(w, t) for w in ("w0", "w1", "w2", "other") for t in range(45)]
    assert [k in taken for k in probe] == [k in model for k in probe]
    again = TakenReceipts.from_state(taken.state(), bad)
    assert [k in again for k in probe] == [k in model for k in probe] and len(again) == len(model)
    # the form saved before (every key with its first seq) loads to the same set
    writers = sorted({w for w, _ in model})
    legacy = {"writers": writers, "committed": np.asarray([(writers.index(w), t, -1) for w, t in sorted(model)],
                                                          dtype=np.int64).reshape(-1, 3)}
    old = TakenReceipts.from_state(legacy, bad)
    assert [k in old for k in probe] == [k in model for k in probe]


def test_in_order_tickets_keep_one_int_per_writer():
    taken = TakenReceipts()
    for w in range(4):                            # 4 writers x 100k receipts, each a little out of order
        tickets = np.arange(100_000)
        for i in range(0, tickets.size - 1, 7):
            tickets[i], tickets[i + 1] = tickets[i + 1], tickets[i]
        for t in tickets.tolist():
            taken.add((f"w{w}", t))
    assert len(taken) == 400_000 and taken.above == {} and taken.floors == {f"w{w}": 100_000 for w in range(4)}
    state = CommitLedger(taken=taken).state()
    assert state["floors"].tolist() == [100_000] * 4 and state["above"].shape == (0, 2)


def test_a_hole_keeps_only_the_tickets_after_it():
    taken = TakenReceipts()
    for t in [0, 1, 3, 4, 5]:                     # ticket 2 never committed nor declined
        taken.add(("w", t))
    assert taken.floors == {"w": 2} and taken.above == {"w": {3, 4, 5}} and ("w", 2) not in taken
    taken.add(("w", 2))
    assert taken.floors == {"w": 6} and taken.above == {}


@pytest.mark.parametrize("part,value,named", [
    ("floors", np.array([-1]), "ingest.floors"), ("floors", np.array([1, 2]), "ingest.floors"),
    ("above", np.array([[1, 5]]), "ingest.above"), ("above", np.array([[0, 0]]), "ingest.above"),
    ("writers", [3], "ingest.writers"), ("writers", ["w", "w"], "ingest.writers"),   # (found in review:)
    ("above", None, "ingest.above"), ("floors", None, "ingest.floors"),               # a part missing
    ("above", [[0, 5], [1]], "ingest.above")])                                          # ragged rows
def test_a_damaged_state_names_its_part(part, value, named):
    taken = TakenReceipts()
    for t in [0, 1, 4]:
        taken.add(("w", t))
    state = dict(CommitLedger(taken=taken).state(), **{part: value})
    with pytest.raises(StateError, match=named):
        CommitLedger.check_state(state)


def test_a_state_of_the_earlier_form_without_its_rows_is_refused():
    with pytest.raises(StateError, match="ingest.committed"):
        CommitLedger.check_state({"buffer": "b", "writers": []})
