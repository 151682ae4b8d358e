"""RLlib's per-observation ``infos``, kept beside the buffer's rows.

Infos are Python objects (dicts, whatever the env returns), not columns, so the core does
not store them. RLlib's buffers keep them with the episodes and hand them out with
``include_infos`` (the info of a transition's first and last observation) and inside
sequence slices; a learner connector piece may read them. This store holds, for every
stored row (by seq), the info of its observation and of its next observation, in two
object rings of the same size as the core's ring: a row's infos are overwritten exactly
when its slot is, and a slot's ``seq`` says whether it still holds the row asked for.
"""

from __future__ import annotations

import numpy as np

from conduit_core import SemanticError


class InfoStore:
    def __init__(self, ring: int):
        self.ring = int(ring)
        self._obs = np.empty(self.ring, dtype=object)
        self._next = np.empty(self.ring, dtype=object)
        self._seq = np.full(self.ring, -1, dtype=np.int64)

    def put(self, first: int, infos: list) -> None:
        """Infos of a chunk of ``len(infos) - 1`` rows stored at seqs ``first, first+1, ...``:
        ``infos[i]`` belongs to row i's observation, ``infos[i + 1]`` to its next one."""
        n = len(infos) - 1
        if n < 1:
            return
        if n <= 8:   # DQN's chunks are a step or a few: item by item beats five array operations
            ring, obs, nxt, seq = self.ring, self._obs, self._next, self._seq
            for i in range(n):
                slot = (first + i) % ring
                obs[slot], nxt[slot], seq[slot] = infos[i], infos[i + 1], first + i
            return
        seqs = np.arange(first, first + n, dtype=np.int64)
        slots = seqs % self.ring
        obs = np.empty(n, dtype=object)
        obs[:] = infos[:n]
        nxt = np.empty(n, dtype=object)
        nxt[:] = infos[1:]
        self._obs[slots] = obs
        self._next[slots] = nxt
        self._seq[slots] = seqs

    def _slots(self, seqs) -> np.ndarray:
        seqs = np.asarray(seqs, dtype=np.int64)
        slots = seqs % self.ring
        held = self._seq[slots] == seqs
        if not held.all():
            bad = int(seqs.reshape(-1)[np.argmin(held.reshape(-1))])
            raise SemanticError(f"infos: row seq {bad} has no stored infos (overwritten or never stored). "
                                "Fix: read infos only for rows the buffer still holds.")
        return slots

    def obs_infos(self, seqs) -> list:
        return list(self._obs[self._slots(seqs)])

    def next_infos(self, seqs) -> list:
        return list(self._next[self._slots(seqs)])

    # ------------------------------------------------------------------ state
    def state(self, seqs: np.ndarray) -> dict:
        """The infos of rows ``seqs`` (the stored ones), as plain lists."""
        slots = self._slots(seqs)
        return {"seqs": np.asarray(seqs, dtype=np.int64).tolist(), "obs": list(self._obs[slots]),
                "next": list(self._next[slots])}

    def load(self, state: dict) -> None:
        seqs = np.asarray(state["seqs"], dtype=np.int64)
        if not (len(state["obs"]) == len(state["next"]) == seqs.size):
            raise SemanticError("infos state: 'seqs', 'obs' and 'next' differ in length. Fix: restore a "
                                "checkpoint written by this adapter.")
        self._obs[:] = None
        self._next[:] = None
        self._seq[:] = -1
        slots = seqs % self.ring
        for i, s in enumerate(slots):
            self._obs[s] = state["obs"][i]
            self._next[s] = state["next"][i]
        self._seq[slots] = seqs
