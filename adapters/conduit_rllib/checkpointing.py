"""Saving the replay buffer with the algorithm's checkpoint (RLlib 2.60's new stack drops it).

``save_to_path`` encodes the buffer's state first (a state that cannot be saved fails
before anything is written), writes RLlib's checkpoint as usual, then the buffer's state
beside it as ``conduit_replay_buffer.bin`` (Conduit's pickle-free format, a checksum per
section), through the same pyarrow filesystem RLlib writes to: written whole under a
temporary name, then moved over the old file, so an earlier checkpoint's buffer is never
left empty or torn. A buffer file that cannot be written once RLlib's files are is removed
with the old one: the checkpoint then fails its restore (or restores an empty buffer with
``restore_missing_buffer``) instead of pairing this save's algorithm with older rows. ``restore_from_path`` (used by
``Algorithm.from_checkpoint`` and ``algo.restore_from_path``) reads and checks that file
and loads the buffer (all or nothing) *before* RLlib restores anything: a missing,
truncated or damaged buffer file fails the restore with ``StateError`` and the algorithm
is left as it was. ``conduit_rllib.enable(config, restore_missing_buffer=True)`` restores
a checkpoint that has no buffer file with an empty buffer instead (the rows it held are
dropped, as the rest of the algorithm goes back to the checkpoint), and logs a warning.
"""

from __future__ import annotations

import logging
import pathlib

from conduit_core import ConfigError, StateError, state_io

BUFFER_FILE = "conduit_replay_buffer.bin"
log = logging.getLogger("conduit_rllib")


def _fs(path, filesystem):
    """(pyarrow filesystem, path within it), as RLlib resolves them."""
    import pyarrow.fs
    path = path if isinstance(path, str) else pathlib.Path(path).as_posix()
    if filesystem is None:
        filesystem, path = pyarrow.fs.FileSystem.from_uri(path)
    return filesystem, path


class BufferCheckpointMixin:
    """Mixed into an RLlib Algorithm subclass; touches nothing but checkpoints."""

    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False):
        # the buffer's bytes first: a state that cannot be saved fails the call before RLlib writes
        # anything, so the checkpoint already at ``path`` stays whole (algorithm and buffer alike)
        buf = getattr(self, "local_replay_buffer", None)
        blob = state_io.dumps(buf.get_state()) if buf is not None and hasattr(buf, "get_state") else None
        path = super().save_to_path(path, state=state, filesystem=filesystem, use_msgpack=use_msgpack)
        if blob is not None:
            fs, where = _fs(path, filesystem)
            final, tmp = f"{where}/{BUFFER_FILE}", f"{where}/{BUFFER_FILE}.tmp"
            try:
                with fs.open_output_stream(tmp) as fh:   # written whole, then moved over the old file
                    fh.write(blob)
                fs.move(tmp, final)
            except BaseException:
                # RLlib's files are this save's now: an older buffer file beside them would restore
                # silently with the wrong rows; without one the restore fails and says so
                for stale in (tmp, final):
                    try:
                        fs.delete_file(stale)
                    except Exception:  # noqa: BLE001 - not there (or gone with the disk): nothing to remove
                        pass
                raise
        return path

    def restore_from_path(self, path, *args, **kwargs):
        buf = getattr(self, "local_replay_buffer", None)
        if buf is not None and hasattr(buf, "set_state") and kwargs.get("component") is None:
            state = self._read_buffer_state(path, kwargs.get("filesystem"), buf)
            if state is None:   # no buffer file, and restore_missing_buffer=True: the buffer restarts empty
                state = buf.empty_state()
            prior = buf.get_state()   # put back if RLlib's own restore fails after the buffer's
            buf.set_state(state)  # all or nothing; before RLlib's own restore changes anything
            try:
                super().restore_from_path(path, *args, **kwargs)
            except BaseException:
                buf.set_state(prior)
                raise
            return
        super().restore_from_path(path, *args, **kwargs)

    @staticmethod
    def _read_buffer_state(path, filesystem, buf):
        import pyarrow
        fs, where = _fs(path, filesystem)
        f = f"{where}/{BUFFER_FILE}"
        try:
            with fs.open_input_stream(f) as fh:
                blob = fh.readall()
        except (FileNotFoundError, OSError, pyarrow.ArrowException) as exc:
            if getattr(getattr(buf, "options", None), "restore_missing_buffer", False):
                log.warning("conduit_rllib: %s has no replay buffer file (%s); restoring with an empty buffer, as "
                            "restore_missing_buffer=True asks", path, BUFFER_FILE)
                return None
            raise StateError(f"checkpoint {path}: expected the replay buffer file {BUFFER_FILE}, it cannot be read "
                             f"({type(exc).__name__}: {exc}). Fix: restore a complete checkpoint, or pass "
                             "restore_missing_buffer=True to conduit_rllib.enable() to start from an empty buffer; "
                             "nothing was restored") from None
        try:
            return state_io.loads(blob)
        except StateError as exc:
            raise StateError(f"checkpoint {path}: the replay buffer file is damaged: {exc}") from None


def check_capacity(algo) -> None:
    """Raise at build time when the buffer cannot hold one train batch."""
    buf = getattr(algo, "local_replay_buffer", None)
    if buf is None:
        return
    need = algo.config.total_train_batch_size
    if buf.capacity < need:
        raise ConfigError("replay_buffer_config['capacity']", f">= the train batch size ({need})", buf.capacity,
                          "raise the capacity or lower train_batch_size")
