"""Saving the replay buffer with the algorithm's checkpoint (RLlib 2.60's new stack drops it).

``save_to_path`` writes RLlib's checkpoint as usual, then the buffer's state beside it
as ``conduit_replay_buffer.bin`` (Conduit's pickle-free format). ``restore_from_path``
(used by ``Algorithm.from_checkpoint`` and ``algo.restore_from_path``) reads it back.
"""

from __future__ import annotations

import os

from conduit_core import ConfigError, state_io

BUFFER_FILE = "conduit_replay_buffer.bin"


class BufferCheckpointMixin:
    """Mixed into an RLlib Algorithm subclass; touches nothing but checkpoints."""

    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False):
        path = super().save_to_path(path, state=state, filesystem=filesystem, use_msgpack=use_msgpack)
        buf = getattr(self, "local_replay_buffer", None)
        if buf is not None and hasattr(buf, "get_state") and filesystem is None:
            state_io.save(buf.get_state(), os.path.join(str(path), BUFFER_FILE))
        return path

    def restore_from_path(self, path, *args, **kwargs):
        super().restore_from_path(path, *args, **kwargs)
        f = os.path.join(str(path), BUFFER_FILE)
        buf = getattr(self, "local_replay_buffer", None)
        if buf is not None and os.path.exists(f) and kwargs.get("component") is None:
            buf.set_state(state_io.load(f))


def check_capacity(algo) -> None:
    """Raise at build time when the buffer cannot hold one train batch."""
    buf = getattr(algo, "local_replay_buffer", None)
    if buf is None:
        return
    need = algo.config.total_train_batch_size
    if buf.capacity < need:
        raise ConfigError("replay_buffer_config['capacity']", f">= the train batch size ({need})", buf.capacity,
                          "raise the capacity or lower train_batch_size")
