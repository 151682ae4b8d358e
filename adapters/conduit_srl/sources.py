"""Readers of SRL's two sample streams, opened lazily in the process that reads (SRL's trainer
worker, after the fork), each behind :class:`~conduit_srl.ingest.Source`: ``receive(max_n)`` never
blocks and returns samples in stream order; ``close()`` releases everything the reader holds.

- :class:`ZmqSource`: a ZMQ ``PULL`` socket bound as SRL's ``IpSampleConsumer`` binds it (a random
  port on the host's address, or the given one), registered under SRL's sample-stream name for
  ``NAME`` streams so SRL's producers find it; messages decoded by SRL's ``namedarray.loads``. A
  message that does not decode is counted (``undecodable``) and skipped, as SRL skips it.
- :class:`ShmSource`: SRL's shared-memory sample dock read through the stream's
  ``OutOfOrderSharedMemoryControl`` (one per stream, made by SRL's launcher before the fork; the
  trainer worker hands it over, see :mod:`~conduit_srl.trainer_worker`). ``receive(n)`` claims up to
  ``n`` slots in one call of the control (one lock round trip and one gather per field for the
  group), copies them out and releases them. ``order``: ``"fresh"`` (SRL's reader: freshest first)
  or ``"old"`` (oldest first: each producer's samples in the order it wrote them). With SRL's
  ``buffer_zero_copy`` (``batch_size`` set) a read is one batch of ``batch_size`` slots, as SRL's
  reader does, served ``reuses`` times by the control.

SRL is imported inside the methods only.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np

from conduit_core.errors import ConfigError

from . import samples

SHM_ORDERS = ("fresh", "old")


class ZmqSource:
    """SRL's ZMQ sample stream, receiving side (see module doc)."""

    def __init__(self, *, address: str = "", register_as: str | None = None, rcvhwm: int = 10):
        self.requested_address, self.register_as, self.rcvhwm = address, register_as, rcvhwm
        self.address: str | None = None
        self.undecodable = 0
        self.last_decode_error: str | None = None
        self._ctx = self._sock = self._entry = None

    @property
    def opened(self) -> bool:
        return self._sock is not None

    def open(self) -> None:
        import socket

        import zmq
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, self.rcvhwm)
        try:
            if self.requested_address == "":
                host_ip = socket.gethostbyname(socket.gethostname())
                address = f"{host_ip}:{sock.bind_to_random_port(f'tcp://{host_ip}')}"
            else:
                sock.bind(f"tcp://{self.requested_address}")
                address = self.requested_address
            if self.register_as is not None:
                from rlsrl.base import name_resolve
                self._entry = name_resolve.add_subentry(self.register_as, json.dumps({"address": address}),
                                                        keepalive_ttl=15)
        except Exception:
            sock.close(linger=0)
            ctx.term()
            raise
        self._ctx, self._sock, self.address = ctx, sock, address

    def receive(self, max_n: int) -> list[Any]:
        import zmq
        from rlsrl.base import namedarray
        if self._sock is None:
            self.open()
        out = []
        while len(out) < max_n:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                out.append(namedarray.loads(frames))
            except Exception as e:  # noqa: BLE001 - a message that does not decode is counted, not fatal
                self.undecodable += 1
                self.last_decode_error = f"{type(e).__name__}: {e}"
        return out

    def close(self) -> None:
        if self._entry is not None:
            from rlsrl.base import name_resolve
            try:
                name_resolve.delete(self._entry)
            except Exception:  # noqa: BLE001 - gone already (its keepalive expired, or the repository closed)
                pass
            self._entry = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._ctx.term()          # joins the context's I/O thread
            self._sock = self._ctx = None


class ShmSource:
    """SRL's shared-memory sample stream, reading side (see module doc)."""

    def __init__(self, *, experiment_name: str, trial_name: str, stream_name: str, qsize: int, ctrl: Any,
                 batch_size: int | None = None, order: str = "fresh"):
        if order not in SHM_ORDERS:
            raise ConfigError("shm_order", f"one of {SHM_ORDERS}", repr(order),
                              "use 'fresh' (SRL's reader) or 'old' (each producer's order)")
        if ctrl is None:
            raise ConfigError("ctrl", "SRL's OutOfOrderSharedMemoryControl of the stream", None,
                              "call conduit_srl.enable() before SRL forks its workers: Conduit's trainer worker "
                              "hands the control to the consumer (SRL's make_consumer drops it)")
        self.experiment_name, self.trial_name, self.stream_name = experiment_name, trial_name, stream_name
        self.qsize, self.batch_size, self.order, self.ctrl = int(qsize), batch_size, order, ctrl
        self.undecodable = 0
        self._dock = None
        self._codec = None
        self._failed: Exception | None = None   # a read's failure after it had read samples (next call)

    @property
    def opened(self) -> bool:
        return self._dock is not None

    def open(self) -> bool:
        """Attach to the dock once a producer has created it (non-blocking). True when attached."""
        from rlsrl.base import name_resolve, names, shared_memory
        dock_name = self.stream_name + "_sample"
        try:
            name_resolve.get(names.shared_memory(self.experiment_name, self.trial_name, dock_name))
        except name_resolve.NameEntryNotFoundError:
            return False            # no producer has written yet: nothing can be readable
        self._dock = shared_memory.reader_make_shared_memory_dock(self.qsize, self.experiment_name, self.trial_name,
                                                                  dock_name, second_dim_index=True, timeout=0)
        return self._dock is not None

    def receive(self, max_n: int) -> list[Any]:
        """Up to ``max_n`` samples. A slot that fails to copy out (counted in ``undecodable``) after
        others were read in this call: those are handed over (their slots are released already, so
        dropping them would lose them uncounted) and the failure is raised by the next call."""
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        if self._dock is None and not self.open():
            return []
        out: list[Any] = []
        try:
            if self.batch_size:         # buffer_zero_copy: one read = one batch, as SRL's reader
                while len(out) < max_n:
                    ids = self.ctrl.acquire_read(batch_size=self.batch_size, preference=self.order)
                    if ids is None:
                        break
                    out.append(self._copy_out(ids))
                return out
            ids = self.ctrl.acquire_read(batch_size=max_n, preference=self.order)
            if ids is None and max_n > 1:   # fewer than max_n readable: take them one at a time
                while len(out) < max_n:
                    one = self.ctrl.acquire_read(batch_size=1, preference=self.order)
                    if one is None:
                        break
                    out += self._samples(one)
                return out
            return [] if ids is None else self._samples(ids)
        except Exception as exc:
            if not out:
                raise
            self._failed = exc
            return out

    def close(self) -> None:
        if self._dock is not None:
            self._dock.close()     # as SRL's reader closes it (its blocks are unlinked)
            self._dock = None

    # ---------------------------------------------------------------- internals
    def _copy_out(self, ids, *, one: bool = False) -> Any:
        """The slots' samples, copied, batch on axis 1 in ascending slot order (``one``: the single
        slot's ``[T, ...]`` sample, as SRL's reader copies it); the slots are released whatever
        happens, as SRL's reader releases them."""
        try:
            if one:
                return copy.deepcopy(self._dock.get(int(ids[0])))
            return self._dock.get(np.asarray(ids))
        except Exception:
            self.undecodable += len(ids)
            raise
        finally:
            self.ctrl.release_read(ids)

    def _samples(self, ids) -> list[Any]:
        """One ``[T, ...]`` sample per slot, in the order the control gave the slots (its preference),
        not the gather's ascending slot order; several slots are one gather per field."""
        if len(ids) == 1:
            return [self._copy_out(ids, one=True)]
        batch = self._copy_out(ids)
        ids = np.asarray(ids)
        pos = np.searchsorted(np.sort(ids), ids)
        if self._codec is None:   # the samples' nesting, learned once (SRL's generic rebuild costs ~25 us a sample)
            self._codec = samples.SampleCodec(batch)
        flat = self._codec.flatten(batch)
        rebuild = self._codec.rebuild
        return [rebuild({k: None if v is None else v[:, p] for k, v in flat.items()}) for p in pos]
