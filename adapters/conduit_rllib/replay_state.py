"""The replay buffer's checkpoint state: ``get_state`` / ``set_state`` (all or nothing) and
the state of a buffer as built (``empty_state``). Mixed into ``ConduitEpisodeReplayBuffer``
ahead of RLlib's buffer, whose own state methods it replaces."""

from __future__ import annotations

from typing import Any

import numpy as np

from conduit_core import ExperienceSpec, StateError

from .episode_ingest import EpisodeIngest
from .episode_ledger import EpisodeLedger
from .info_store import InfoStore


class ReplayStateMixin:
    """Needs the buffer's ``edp``, ``ingest``, ``ledger``, ``infos``, ``options``, ``capacity``,
    ``_ring``, ``_seed``, ``_sampled``, ``_sequence_rng``, ``last_sampled``, ``replay_metrics`` and
    ``_build_for``."""

    def get_state(self) -> dict[str, Any]:
        """Everything to continue exactly; numpy arrays and plain values (no pickle needed)."""
        # the ingestion's part: sources, next_source, added, source_ids, lookback_rows
        return {"conduit_rllib": 1, "edp": None if self.edp is None else self.edp.state_dict(),
                "spec": None if self.edp is None else self.edp.buffer.spec.to_config(), "capacity": self.capacity,
                **self._adapter_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore ``get_state``'s output, all or nothing: the adapter's own parts (ingestion,
        ledger, infos, counters) are loaded first and put back as they were if anything after
        fails; the core's part is loaded last and is itself all or nothing."""
        if not isinstance(state, dict) or state.get("conduit_rllib") != 1:
            raise StateError("replay buffer state: expected a conduit_rllib state (version 1). "
                             "Fix: restore a checkpoint written with conduit_rllib enabled.")
        saved = state.get("capacity")   # (states before 2026-12-02 have none: the core's check names ring slots)
        if saved is not None and state.get("edp") is not None and saved != self.capacity:
            raise StateError(f"replay_buffer_config['capacity']: expected {saved} (the checkpoint's), got "
                             f"{self.capacity}. Fix: restore with the capacity the checkpoint was saved with; "
                             "nothing was loaded")
        before = self._adapter_state()
        built = False
        try:
            self._load_adapter_state(state)
            if state["edp"] is not None:
                if self.edp is None:
                    self._build_for(ExperienceSpec.from_config(state["spec"]))
                    built = True
                self.edp.load_state_dict(state["edp"])
            elif self.edp is not None:   # a state saved before the first add: the buffer is empty again
                self.edp.close()         # (the data plane is built anew by the next add, as at the start)
                self.edp, self.tuner = None, None
            self.last_sampled = None   # (a batch sampled before the load names rows of another past)
        except BaseException as exc:
            if built:   # a data plane built for this load goes with it
                self.edp.close()
                self.edp, self.tuner = None, None
            self._load_adapter_state(before)
            if isinstance(exc, (KeyError, TypeError, ValueError, IndexError)) and not isinstance(exc, StateError):
                raise StateError(f"replay buffer state: a damaged part ({type(exc).__name__}: {exc}). Fix: restore "
                                 "a checkpoint this version wrote; nothing was loaded") from exc
            raise

    def empty_state(self) -> dict[str, Any]:
        """This buffer's state as built, before its first add (what a checkpoint without a buffer
        file restores to with ``restore_missing_buffer=True``)."""
        ledger, infos = EpisodeLedger(), InfoStore(self._ring)
        ingest = EpisodeIngest(ledger, infos, capacity=self.capacity, store_infos=self.options.store_infos)
        return {"conduit_rllib": 1, "edp": None, "spec": None, **ingest.state(), "sampled": 0,
                "ledger": ledger.state(), "infos": infos.state(np.zeros(0, np.int64)),
                "sequence_rng": np.random.default_rng([self._seed, 1]).bit_generator.state}

    def _adapter_state(self) -> dict[str, Any]:
        return {**self.ingest.state(), "sampled": self._sampled, "ledger": self.ledger.state(),
                "infos": self.infos.state(self.ledger.stored_seqs() if self.options.store_infos
                                          else np.zeros(0, np.int64)),
                "sequence_rng": self._sequence_rng.bit_generator.state}

    def _load_adapter_state(self, state: dict[str, Any]) -> None:
        if "ledger" not in state:
            raise StateError("replay buffer state: expected 'ledger' (the stored episodes), it is missing (a state "
                             "older than it). Fix: restore a checkpoint this version wrote; nothing was loaded")
        self.ingest.load(state)
        self._sampled = int(state["sampled"])
        self.ledger.load(state["ledger"])
        if "infos" in state:
            self.infos.load(state["infos"])
        else:   # written before 2026-11-30, without infos: the restored rows get RLlib's default, {}
            seqs = self.ledger.stored_seqs() if self.options.store_infos else np.zeros(0, np.int64)
            self.infos.load({"seqs": seqs.tolist(), "obs": [{}] * len(seqs), "next": [{}] * len(seqs)})
        if "sequence_rng" in state:
            self._sequence_rng.bit_generator.state = state["sequence_rng"]
        self.replay_metrics.restart()   # counted from the restored counters (RLlib saves no metrics either)

