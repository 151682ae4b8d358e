"""verl's ``verl.plugins`` entry point: registers Conduit's trainer mode and TransferQueue
storage backend without changing verl or TransferQueue.

verl imports every ``verl.plugins`` entry point on ``import verl`` (in the driver and in
every Ray worker; ``VERL_USE_EXTERNAL_PLUGINS=none`` turns them off) and swallows a
plugin's import error at debug level. So importing this module does almost nothing: loading
verl's V1 trainer or TransferQueue here would pull Ray, ZMQ and the worker classes into every
``import verl``, from inside verl's half-initialised package, where failures go unseen.
Instead a post-import hook waits for each registry's module and registers right after it has
executed; a registration failure is logged at ERROR and raised in that import:

- ``verl.trainer.ppo.v1.trainer_base``: ``trainer.v1.trainer_mode=conduit``;
- ``transfer_queue.interface`` (the last of TransferQueue's modules its package imports, so its
  storage registries exist): ``transfer_queue.backend.storage_backend=Conduit``. Every process
  that makes a TransferQueue client imports verl first, so each one registers the backend;
- ``verl.experimental.fully_async_policy.message_queue``, only with ``CONDUIT_VERL_MESSAGE_QUEUE=conduit``:
  the fully-async trainer's ``MessageQueue`` becomes Conduit's (async_queue.py); ``fully_async_main``
  imports it from there after this hook ran;
- ``verl.experimental.one_step_off_policy.ray_trainer``, only with ``CONDUIT_VERL_ONE_STEP_OFF=conduit``:
  its ``OneStepOffRayTrainer`` becomes ``separated.ConduitOneStepOffTrainer`` (the advantage stage over
  prompt-group chunks, ``+trainer.conduit.groups_per_chunk=N``), which the recipe's ``main_ppo`` (run as
  ``__main__``) imports from there.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from types import ModuleType
from typing import Callable

REGISTRY_MODULE = "verl.trainer.ppo.v1.trainer_base"
STORAGE_MODULE = "transfer_queue.interface"
log = logging.getLogger(__name__)


def _register_trainer() -> None:
    from .v1_trainer import register
    register()


def _register_storage() -> None:
    from . import tq_backend  # noqa: F401 - registering is what importing it does


def _register_message_queue() -> None:
    from . import async_queue
    if _opted_in(async_queue.ENV, "Conduit's queue in verl's fully-async trainer"):
        sys.modules[MESSAGE_QUEUE_MODULE].MessageQueue = async_queue.actor_class()


def _opted_in(env: str, what: str) -> bool:
    import os
    choice = os.environ.get(env, "")
    if choice in ("", "verl"):
        return False
    if choice != "conduit":
        raise ValueError(f"{env}: expected 'conduit' or 'verl' (or unset), got {choice!r}. Fix: set it to "
                         f"'conduit' for {what}")
    return True


def _register_one_step_off() -> None:
    if _opted_in(ONE_STEP_OFF_ENV, "Conduit's advantage stage in verl's one-step-off trainer"):
        from . import separated
        sys.modules[ONE_STEP_OFF_MODULE].OneStepOffRayTrainer = separated.ConduitOneStepOffTrainer


MESSAGE_QUEUE_MODULE = "verl.experimental.fully_async_policy.message_queue"
ONE_STEP_OFF_MODULE = "verl.experimental.one_step_off_policy.ray_trainer"
ONE_STEP_OFF_ENV = "CONDUIT_VERL_ONE_STEP_OFF"
HOOKS = {REGISTRY_MODULE: _register_trainer, STORAGE_MODULE: _register_storage,
         MESSAGE_QUEUE_MODULE: _register_message_queue, ONE_STEP_OFF_MODULE: _register_one_step_off}


def _register(module: str) -> None:
    from .logs import show_in_verl
    show_in_verl()   # verl configures no logging for others (a bad CONDUIT_LOGGING_LEVEL raises here, naming it)
    try:
        HOOKS[module]()
    except Exception:
        log.exception("conduit_verl: registering with %s failed; verl will not know Conduit's part there", module)
        raise


class _RunAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets the normal finders locate a watched module, executes it with their loader, then runs the
    callbacks waiting for it. It leaves ``sys.meta_path`` when no module is watched any more."""

    def __init__(self):
        self.waiting: dict[str, list[Callable[[ModuleType], None]]] = {}
        self._inner: dict[str, importlib.abc.Loader] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.waiting or fullname in self._inner:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self._inner[fullname] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._inner[spec.name].create_module(spec)

    def get_code(self, fullname):   # runpy (`python -m` a watched module): it runs as __main__, no callback
        return self._inner[fullname].get_code(fullname)

    def is_package(self, fullname):
        return self._inner[fullname].is_package(fullname)

    def exec_module(self, module):
        name = module.__name__
        self._inner.pop(name).exec_module(module)
        callbacks = self.waiting.pop(name, [])
        if not self.waiting and self in sys.meta_path:
            sys.meta_path.remove(self)
        for fn in callbacks:
            fn(module)


_finder = _RunAfterImport()


def after_import(module: str, fn: Callable[[ModuleType], None]) -> None:
    """Run ``fn(module)`` right after ``module`` has executed (now, if it already has): how Conduit
    (and a run's instruments) reach into verl's registries without importing them early."""
    if module in sys.modules:
        fn(sys.modules[module])
        return
    _finder.waiting.setdefault(module, []).append(fn)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def install() -> None:
    """Register now where a registry is already imported, else when it is. Idempotent."""
    if getattr(install, "done", False):
        return
    install.done = True
    for module in HOOKS:
        after_import(module, lambda m: _register(m.__name__))


install()  # verl's plugin loader only imports the entry point's module
