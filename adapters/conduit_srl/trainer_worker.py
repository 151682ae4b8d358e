"""Conduit's trainer worker for SRL: SRL's ``TrainerWorker`` plus one step, handing a Conduit
``SampleConsumer`` what SRL's ``make_consumer`` gives only its own consumers.

SRL's ``TrainerWorker._configure`` (``system/impl/trainer_worker.py:298``) calls
``make_consumer(cfg.sample_stream, worker_info, ctrl)``, which returns an instance of
``SampleConsumer`` unchanged (``system/api/sample_stream.py:136``), dropping the worker's names and,
for a shared-memory stream, the stream's ``OutOfOrderSharedMemoryControl`` (made by SRL's launcher
before the fork, ``system/api/worker_control.py``). This subclass runs SRL's ``_configure`` and
then binds and opens the consumer: ``bind(worker_info=cfg.worker_info, ctrl=self.ctrl.spl_ctrls[index])``.
Every other trainer worker behaves exactly as SRL's (a stream that is not Conduit's is left alone).
On ``exit``, after SRL's own (which saves the buffer and stops the training thread), the buffer's
``close`` joins any thread of its own (a replay kind that prepares deliveries ahead). Each poll that
logs a training step adds the buffer's counters to the step's stats (:func:`buffer_stats_into`),
so they reach SRL's terminal log and wandb with SRL's own.

:func:`install` puts this class in SRL's worker table (``rlsrl.system.RL_WORKERS["trainer"]``) in the
launching process; SRL's ``run_worker`` loads the class from the table in each forked worker. The
class is built on first use (it subclasses SRL's), so importing this module imports nothing of SRL.
"""

from __future__ import annotations

from typing import Any

_CLASS = None
_saved_spec = None
CLASS_NAME = "ConduitTrainerWorker"


def bind_consumer(worker: Any, cfg: Any) -> bool:
    """Bind and open ``cfg.sample_stream`` when it is a Conduit consumer; True when it was. Opened here,
    in ``_configure``, as SRL's consumers are: SRL configures trainers before actors, and the actors'
    ZMQ producers look the trainer's address up when they are configured."""
    stream = cfg.sample_stream
    if not getattr(stream, "__conduit_consumer__", False):
        return False
    ctrl = None
    if stream.kind == "SHARED_MEMORY":
        ctrl = worker.ctrl.spl_ctrls[stream.stream_index]
    stream.bind(worker_info=cfg.worker_info, ctrl=ctrl)
    stream.open()
    return True


def flush_consumer(worker: Any) -> None:
    """Put what a Conduit consumer has staged into the buffer (SRL's ``exit`` saves the buffer
    first and closes the stream after: the staged samples would miss the snapshot)."""
    stream = getattr(worker, "_TrainerWorker__stream", None)  # SRL's TrainerWorker keeps it name-mangled
    if getattr(stream, "__conduit_consumer__", False):
        stream.flush()


def close_buffer(worker: Any) -> None:
    """Join the buffer's own threads (a replay kind preparing deliveries ahead) once SRL's training
    thread has stopped; a failure they kept is raised here. Buffers without ``close`` are left alone."""
    buffer = getattr(worker, "_TrainerWorker__buffer", None)  # SRL's TrainerWorker keeps it name-mangled
    close = getattr(buffer, "close", None)
    if callable(close):
        close()


def buffer_stats_into(worker: Any, poll_result: Any) -> None:
    """Conduit's counters in SRL's own tracker: where a poll carries the training step's stats (which
    SRL's worker logs to its terminal log and to wandb), the buffer's ``stats()`` join them as
    ``conduit/<name>`` (a queue's formed, served, dropped entries; a replay buffer's chunks put and
    stored, batches prepared ahead taken or discarded). SRL's own buffers have no ``stats``: nothing."""
    entry = getattr(poll_result, "log_entry", None)
    buffer = getattr(worker, "_TrainerWorker__buffer", None)  # SRL's TrainerWorker keeps it name-mangled
    stats = getattr(buffer, "stats", None)
    if entry is None or not callable(stats):
        return
    entry.stats.update({f"conduit/{k}": v for k, v in stats().items() if isinstance(v, (int, float))})


def worker_class():
    global _CLASS
    if _CLASS is None:
        from rlsrl.system.impl.trainer_worker import TrainerWorker

        def _configure(self, cfg):
            r = TrainerWorker._configure(self, cfg)
            bind_consumer(self, cfg)
            return r

        def _poll(self):
            r = TrainerWorker._poll(self)
            buffer_stats_into(self, r)
            return r

        def exit(self):
            try:
                try:
                    flush_consumer(self)      # before SRL's exit saves the buffer (its error after the exit)
                finally:
                    TrainerWorker.exit(self)  # saves the buffer, stops SRL's training thread
            finally:
                close_buffer(self)

        _CLASS = type(CLASS_NAME, (TrainerWorker,), {"__module__": __name__, "__qualname__": CLASS_NAME,
                                                     "_configure": _configure, "_poll": _poll, "exit": exit,
                                                     "__doc__": __doc__})
    return _CLASS


def install() -> None:
    """Make SRL's launcher run :func:`worker_class` as its trainer worker (idempotent)."""
    global _saved_spec
    import rlsrl.system as system
    spec = system.RL_WORKERS["trainer"]
    if spec.module == __name__:
        return
    _saved_spec = spec
    system.RL_WORKERS["trainer"] = system.WorkerSpec(short_name=spec.short_name, class_name=CLASS_NAME,
                                                     config_field_name=spec.config_field_name, module=__name__)


def uninstall() -> None:
    global _saved_spec
    if _saved_spec is not None:
        import rlsrl.system as system
        system.RL_WORKERS["trainer"] = _saved_spec
        _saved_spec = None


def installed() -> bool:
    try:
        import rlsrl.system as system
    except ImportError:
        return False
    return system.RL_WORKERS["trainer"].module == __name__


def __getattr__(name: str):
    """SRL's ``WorkerSpec.load_worker`` does ``getattr(module, class_name)``: built on first use."""
    if name == CLASS_NAME:
        return worker_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
