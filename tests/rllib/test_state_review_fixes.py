"""Found in review (session 16): three ways a restore changed the buffer wrongly or left it
changed after failing. Each case below is one of them, as the reviewer's reproducer found it."""

import pytest

from conduit_core import StateError, state_io
from conduit_rllib.checkpointing import BUFFER_FILE, BufferCheckpointMixin
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer

from .rllib_episodes import make_chunks


def _buffer():
    return ConduitEpisodeReplayBuffer(capacity=200, conduit={"mode": "sequential"})


def test_a_state_saved_before_the_first_add_empties_the_buffer():
    """It used to reset the ledger and counters and keep the core's rows: later adds were
    recorded at seq 0 while stored from seq 36, and sampling failed."""
    buf = _buffer()
    empty = buf.get_state()
    buf.add(make_chunks(0, episodes=5)[0])
    assert len(buf) > 0
    buf.set_state(empty)
    assert len(buf) == 0 and buf.get_num_episodes() == 0 and buf.get_added_timesteps() == 0
    more, truth = make_chunks(1, episodes=4, with_extras=True)
    buf.add(more)
    assert len(buf) == sum(len(t) for t in truth)
    assert len(buf.sample(num_items=8, include_infos=True)) == 8
    buf.close()


def test_a_state_without_infos_restores_its_rows_with_empty_infos():
    """States written before infos were saved: the restored rows used to keep the loading
    buffer's infos (or none, and every later get_state failed)."""
    src = _buffer()
    src.add(make_chunks(0, episodes=5, with_extras=True)[0])
    old = src.get_state()
    del old["infos"]
    for fresh in (True, False):
        buf = _buffer()
        if not fresh:
            buf.add(make_chunks(7, episodes=9, with_extras=True)[0])
        buf.set_state(old)
        seqs = buf.ledger.stored_seqs()
        assert buf.infos.obs_infos(seqs) == [{}] * len(seqs) == buf.infos.next_infos(seqs)
        buf.set_state(buf.get_state())   # and it saves and loads again
        buf.close()
    no_ledger = src.get_state()
    del no_ledger["ledger"]
    buf = _buffer()
    buf.add(make_chunks(3, episodes=3)[0])
    before = buf.get_state()
    with pytest.raises(StateError, match="'ledger'.*missing.*nothing was loaded"):
        buf.set_state(no_ledger)
    assert buf.ledger.state() == before["ledger"] and buf.get_added_timesteps() == before["added"]
    src.close()
    buf.close()


def test_a_failed_algorithm_restore_puts_the_buffer_back(tmp_path):
    """The buffer is loaded before RLlib's own restore (a damaged buffer file fails first);
    when RLlib's restore fails after it, the buffer used to stay loaded."""
    class FailingRLlib:
        def restore_from_path(self, path, *args, **kwargs):
            raise ValueError("RLlib: the learner's state does not match")

    class Algo(BufferCheckpointMixin, FailingRLlib):
        pass

    saved = _buffer()
    saved.add(make_chunks(0, episodes=3)[0])
    (tmp_path / BUFFER_FILE).write_bytes(state_io.dumps(saved.get_state()))
    algo = Algo()
    algo.local_replay_buffer = _buffer()
    algo.local_replay_buffer.add(make_chunks(5, episodes=9)[0])
    before = (len(algo.local_replay_buffer), algo.local_replay_buffer.get_num_episodes(),
              algo.local_replay_buffer.ledger.stored_seqs().tolist())
    with pytest.raises(ValueError, match="does not match"):
        algo.restore_from_path(str(tmp_path))
    after = (len(algo.local_replay_buffer), algo.local_replay_buffer.get_num_episodes(),
             algo.local_replay_buffer.ledger.stored_seqs().tolist())
    assert after == before
    saved.close()
    algo.local_replay_buffer.close()
