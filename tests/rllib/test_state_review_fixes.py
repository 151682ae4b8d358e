"""Found in review (session 16): three ways a restore changed the buffer wrongly or left it
changed after failing. Each case below is one of them, as the reviewer's reproducer found it."""

import numpy as np
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
    assert len(buf.sample(num_items=8, n_step=1, include_infos=True, sample_episodes=True)) == 8
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


# ---- found in review (session 22): a save that failed destroyed the checkpoint; restores that
# changed less or more than they said

class _FakeAlgorithm:
    """RLlib's ``Algorithm`` save/restore, reduced to one file per checkpoint: what
    ``BufferCheckpointMixin`` wraps (the order of writes is what these tests check)."""

    def __init__(self):
        self.iteration = 0

    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False):
        import os
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "algorithm_state.txt"), "w") as fh:
            fh.write(str(self.iteration))
        return path

    def restore_from_path(self, path, *args, **kwargs):
        import os
        with open(os.path.join(path, "algorithm_state.txt")) as fh:
            self.iteration = int(fh.read())


class _Algo(BufferCheckpointMixin, _FakeAlgorithm):
    pass


def _algo(**conduit):
    algo = _Algo()
    algo.local_replay_buffer = ConduitEpisodeReplayBuffer(capacity=500, conduit={"mode": "sequential", **conduit})
    return algo


def test_a_save_that_fails_leaves_the_previous_checkpoint_whole(tmp_path):
    """The buffer file used to be emptied (and RLlib's files replaced) before its state was
    found unsaveable: the checkpoint could no longer be restored."""
    import os
    algo, ckpt = _algo(), str(tmp_path / "ckpt")
    chunks, _ = make_chunks(0, episodes=6, with_extras=True)
    algo.local_replay_buffer.add(chunks[:3])
    algo.iteration = 10
    algo.save_to_path(ckpt)
    files = {f: open(os.path.join(ckpt, f), "rb").read() for f in os.listdir(ckpt)}
    more, _ = make_chunks(1, episodes=2, with_extras=True)
    more[0].infos[0]["handle"] = object()   # no state format holds this
    algo.local_replay_buffer.add(chunks[3:] + more)
    algo.iteration = 20
    with pytest.raises(StateError, match=r"infos.*handle|handle.*builtins.object"):
        algo.save_to_path(ckpt)
    assert {f: open(os.path.join(ckpt, f), "rb").read() for f in os.listdir(ckpt)} == files
    back = _algo()
    back.restore_from_path(ckpt)
    assert back.iteration == 10 and len(back.local_replay_buffer) == sum(len(c) for c in chunks[:3])


def test_numpy_bools_in_infos_are_saved_and_restore_as_bools(tmp_path):
    algo, ckpt = _algo(), str(tmp_path / "ckpt")
    chunks, _ = make_chunks(0, episodes=3, with_extras=True)
    chunks[0].infos[0]["is_success"] = np.bool_(True)
    algo.local_replay_buffer.add(chunks)
    algo.save_to_path(ckpt)
    back = _algo()
    back.restore_from_path(ckpt)
    assert back.local_replay_buffer.get_state()["infos"] == algo.local_replay_buffer.get_state()["infos"]


def test_restore_missing_buffer_restarts_the_buffer_empty(tmp_path):
    """It used to log "restoring with an empty buffer" and keep the rows of after the checkpoint."""
    import os
    algo, ckpt = _algo(restore_missing_buffer=True), str(tmp_path / "ckpt")
    algo.save_to_path(ckpt)
    os.remove(os.path.join(ckpt, BUFFER_FILE))
    buf = algo.local_replay_buffer
    buf.add(make_chunks(0, episodes=5)[0])
    algo.iteration = 7
    algo.restore_from_path(ckpt)
    assert algo.iteration == 0 and len(buf) == 0 and buf.get_num_episodes() == 0 and buf.get_added_timesteps() == 0
    more, truth = make_chunks(1, episodes=4)
    buf.add(more)
    assert len(buf) == sum(len(t) for t in truth) and len(buf.sample(num_items=8, n_step=1, sample_episodes=True)) == 1


def test_a_restore_into_another_capacity_names_rllibs_capacity():
    a = ConduitEpisodeReplayBuffer(capacity=500, prioritized=True, alpha=0.6, conduit={"mode": "sequential"})
    a.add(make_chunks(0, episodes=5)[0])
    state = state_io.loads(state_io.dumps(a.get_state()))
    b = ConduitEpisodeReplayBuffer(capacity=1000, prioritized=True, alpha=0.6, conduit={"mode": "sequential"})
    b.add(make_chunks(1, episodes=2)[0])
    before = len(b)
    with pytest.raises(StateError, match=r"replay_buffer_config\['capacity'\]: expected 500 .*got 1000"):
        b.set_state(state)
    assert len(b) == before
    c = ConduitEpisodeReplayBuffer(capacity=500, prioritized=True, alpha=1.0, conduit={"mode": "sequential"})
    with pytest.raises(StateError, match=r"selector\.alpha: expected 1\.0 .*got 0\.6"):
        c.set_state(state)
    for buf in (a, b, c):
        buf.close()


def test_a_buffer_file_that_cannot_be_written_after_rllibs_leaves_a_checkpoint_that_fails_its_restore(tmp_path):
    """The old buffer file stayed beside this save's algorithm state and restored silently."""
    import pyarrow.fs

    class DiskFullPartWay:   # a filesystem whose buffer write fails after 10 bytes (ENOSPC)
        def __init__(self):
            self.fs = pyarrow.fs.LocalFileSystem()

        def open_output_stream(self, path):
            stream = self.fs.open_output_stream(path)

            class Writer:
                def __enter__(self):
                    return self

                def __exit__(self, *exc):
                    stream.close()

                def write(self, data):
                    stream.write(data[:10])
                    raise OSError(28, "No space left on device")
            return Writer()

        def move(self, src, dst):
            self.fs.move(src, dst)

        def delete_file(self, path):
            self.fs.delete_file(path)
    import os
    algo, ckpt = _algo(), str(tmp_path / "ckpt")
    algo.local_replay_buffer.add(make_chunks(0, episodes=3)[0])
    algo.iteration = 10
    algo.save_to_path(ckpt)
    algo.iteration = 20
    with pytest.raises(OSError):
        algo.save_to_path(ckpt, filesystem=DiskFullPartWay())
    assert sorted(os.listdir(ckpt)) == ["algorithm_state.txt"]
    with pytest.raises(StateError, match="expected the replay buffer file"):
        _algo().restore_from_path(ckpt)
