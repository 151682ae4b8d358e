"""Where the ingestion transform runs: in the calling process or in a child process.

The data plane's background thread drives both the same way::

    encoded = transformer.transform(rollouts)   # hooks -> validate -> encode
    buffer.add_encoded(...)                     # memcpy into the ring (main process)

``InlineTransformer`` runs the hooks in the current process (used inline by the
sequential schedule and in the background thread by the overlapped one).
``ProcessTransformer`` ships rollouts to a spawned child process, which runs the
hooks and codecs outside this interpreter's GIL and sends back encoded columns. The
buffer and all its state stay in the main process, so selection, priorities and
state dicts never cross a process boundary.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import signal
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import ConfigError, WorkerError
from ..schema.spec import ExperienceSpec
from .hooks import Rollout, run_ingest_hooks


@dataclass
class Encoded:
    """A rollout after its hooks, validated and encoded, ready for ``add_encoded``."""

    ticket: int
    source: int
    policy_version: int
    rows: int            # input rows (as accepted), for the staleness accounting
    n: int               # rows to store (after hooks)
    columns: dict


def encode_rollouts(spec: ExperienceSpec, hooks: list[Callable], rollouts: list[Rollout]) -> list[Encoded]:
    out = run_ingest_hooks(hooks, rollouts)
    result = []
    for r in out:
        n, enc = spec.validate_and_encode(r.data)
        result.append(Encoded(r.ticket, r.source, r.policy_version, r.rows, n, enc))
    return result


def encode_unhooked(spec: ExperienceSpec, rollouts: list, first_ticket: int) -> list[Encoded]:
    """``encode_rollouts`` where no ingest hook runs: each rollout (a mapping of columns, or a
    ``Rollout``) validated and encoded as it came, ticket by ticket from ``first_ticket``; its
    input rows are its stored rows (nothing could drop any)."""
    out = []
    for ticket, r in enumerate(rollouts, first_ticket):
        data, source, version = (r.data, r.source, r.policy_version) if isinstance(r, Rollout) else (r, 0, 0)
        n, enc = spec.validate_and_encode(data)
        out.append(Encoded(ticket, source, version, n, n, enc))
    return out


class InlineTransformer:
    kind = "thread"

    def __init__(self, spec: ExperienceSpec, hooks: list[Callable]):
        self.spec, self.hooks = spec, hooks

    def transform(self, rollouts: list[Rollout]) -> list[Encoded]:
        return encode_rollouts(self.spec, self.hooks, rollouts)

    def close(self) -> None:
        pass


def _to_numpy(data) -> dict:
    return {k: (v.numpy() if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v) for k, v in data.items()}


def _child_main(spec_config: list, hooks_blob: bytes, inq, outq, parent_pid: int) -> None:  # pragma: no cover
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; the child stops when told
    torch.set_num_threads(1)
    try:
        spec = ExperienceSpec.from_config(spec_config)
        hooks = pickle.loads(hooks_blob)
    except BaseException as exc:  # noqa: BLE001 - reported by the parent's start-up wait
        outq.put((0, "error", (pickle.dumps(RuntimeError(repr(exc))), traceback.format_exc())))
        return
    outq.put((0, "ready", None))
    while True:
        try:
            msg = inq.get(timeout=1.0)
        except queue_mod.Empty:
            if os.getppid() != parent_pid:  # the parent died (even by SIGKILL): die with it
                break
            continue
        if msg is None:
            break
        tag, rollouts = msg
        try:
            enc = encode_rollouts(spec, hooks, rollouts)
            for e in enc:
                e.columns = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in e.columns.items()}
            outq.put((tag, "ok", enc))
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the caller
            try:
                blob = pickle.dumps(exc)
            except Exception:
                blob = pickle.dumps(RuntimeError(repr(exc)))
            outq.put((tag, "error", (blob, traceback.format_exc())))


class ProcessTransformer:
    """Runs hooks and codecs in a spawned child process (one request at a time, in order).

    The constructor returns once the child has imported its modules and unpickled the hooks
    (~1 s): start-up is paid when the schedule is chosen, not by the first rollout, and a
    child that cannot start fails there with its traceback.

    Every request carries a tag and only the answer with that tag is taken. A child that
    dies, or does not answer within ``timeout``, fails its request (the caller reports it)
    and is replaced by a new child at the next request, so a late answer can never be taken
    for another request's. The child exits by itself when its parent dies."""

    kind = "process"
    STARTUP_TIMEOUT = 120.0  # importing torch in a fresh interpreter: not a transform's budget

    def __init__(self, spec: ExperienceSpec, hooks: list[Callable], *, timeout: float = 60.0):
        try:
            blob = pickle.dumps(hooks)
        except Exception as exc:
            raise ConfigError("ingest hooks", "picklable callables for worker='process'",
                              f"unpicklable ({exc})", "define hooks at module level, or use worker='thread'") from exc
        self._spec_config, self._blob = spec.to_config(), blob
        self.timeout = timeout
        self._tag = 0
        self._proc = None
        self.late_answers_dropped = 0  # answers to requests that had already failed
        self.restarts = 0              # children started after the first (one died or hung)
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self._inq, self._outq = ctx.Queue(), ctx.Queue()
        env_threads = os.environ.get("OMP_NUM_THREADS")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        try:
            self._proc = ctx.Process(target=_child_main, args=(self._spec_config, self._blob, self._inq, self._outq,
                                                               os.getpid()), name="conduit-ingest", daemon=True)
            self._proc.start()
        finally:
            if env_threads is None:
                os.environ.pop("OMP_NUM_THREADS", None)
        try:
            self._receive(0, "start up", limit=max(self.timeout, self.STARTUP_TIMEOUT))
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        """The child's process id (None between a child's loss and its replacement)."""
        return None if self._proc is None else self._proc.pid

    def transform(self, rollouts: list[Rollout]) -> list[Encoded]:
        if self._proc is None or not self._proc.is_alive():
            # the last child died or was stopped (its request was reported): this one gets a new child
            self.close()
            self._start()
            self.restarts += 1
        self._tag += 1
        sendable = [Rollout(_to_numpy(r.data), r.source, r.policy_version, r.ticket, r.rows, r.info) for r in rollouts]
        self._inq.put((self._tag, sendable))
        return self._receive(self._tag, f"answer request {self._tag}")

    def _receive(self, expected_tag: int, what: str, *, limit: float | None = None):
        """The answer to request ``expected_tag``; an answer to an earlier request (which
        already failed) is dropped, never taken for this one's."""
        waited = 0.0
        limit_s = self.timeout if limit is None else limit
        while True:
            try:
                tag, status, payload = self._outq.get(timeout=0.5)
            except queue_mod.Empty:
                waited += 0.5
                if not self._proc.is_alive():
                    raise WorkerError(
                        f"the ingestion process died (exit code {self._proc.exitcode}) before it could {what}"
                        f"{'; the next request starts a new one' if expected_tag else ''}. Fix: check memory "
                        "limits, that hooks do not call os._exit, and that the script that builds the data plane "
                        "has an `if __name__ == '__main__':` guard")
                if waited >= limit_s:
                    if expected_tag:  # a hung child is replaced: its late answer can never arrive
                        self._proc.terminate()
                        self._proc.join(timeout=5)
                    then = "; it was stopped and the next request starts a new one" if expected_tag else ""
                    raise WorkerError(f"the ingestion process did not {what} within {limit_s:g} s{then}. "
                                      "Fix: make hooks faster or raise Schedule.timeout.")
                continue
            if tag == expected_tag:
                break
            if tag > expected_tag:  # one request is in flight at a time: this cannot happen; never guess
                raise WorkerError(f"the ingestion process answered request {tag} while {expected_tag} was the "
                                  "newest. Fix: report this as a Conduit bug.")
            self.late_answers_dropped += 1
        if status == "error":
            blob, tb = payload
            exc = pickle.loads(blob)
            exc.remote_traceback = tb  # type: ignore[attr-defined]
            raise exc
        return payload

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            if self._proc.is_alive():
                self._inq.put(None)
                self._proc.join(timeout=10)
        finally:
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(timeout=5)
            if self._proc.exitcode not in (0, None):
                # a child that died or was stopped may not have read what the feeder threads
                # still hold: joining them would block for ever
                self._inq.cancel_join_thread()
                self._outq.cancel_join_thread()
            self._inq.close()
            self._outq.close()
            self._inq.join_thread()
            self._outq.join_thread()
            self._proc = None


def make_transformer(kind: str, spec: ExperienceSpec, hooks: list[Callable], *, timeout: float):
    if kind == "process":
        return ProcessTransformer(spec, hooks, timeout=timeout)
    return InlineTransformer(spec, hooks)


def as_numpy_rows(data) -> int:
    """Rows of a rollout: the leading dim of its first array."""
    for v in data.values():
        return int(v.shape[0]) if hasattr(v, "shape") and len(v.shape) else 0
    return 0


__all__ = ["Encoded", "InlineTransformer", "ProcessTransformer", "make_transformer", "encode_rollouts",
           "encode_unhooked", "as_numpy_rows"]
