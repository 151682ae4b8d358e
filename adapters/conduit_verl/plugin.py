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
  that makes a TransferQueue client imports verl first, so each one registers the backend.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys

REGISTRY_MODULE = "verl.trainer.ppo.v1.trainer_base"
STORAGE_MODULE = "transfer_queue.interface"
log = logging.getLogger(__name__)


def _register_trainer() -> None:
    from .v1_trainer import register
    register()


def _register_storage() -> None:
    from . import tq_backend  # noqa: F401 - registering is what importing it does


HOOKS = {REGISTRY_MODULE: _register_trainer, STORAGE_MODULE: _register_storage}


def _register(module: str) -> None:
    try:
        HOOKS[module]()
    except Exception:
        log.exception("conduit_verl: registering with %s failed; verl will not know Conduit's part there", module)
        raise


class _RegisterAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets the normal finders locate a hooked module, executes it with their loader, then
    registers. One shot per module: it leaves ``sys.meta_path`` when every hook has fired."""

    def __init__(self, pending: set[str]):
        self.pending = pending
        self._inner: dict[str, importlib.abc.Loader] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)
        if not self.pending:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self._inner[fullname] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._inner[spec.name].create_module(spec)

    def exec_module(self, module):
        self._inner.pop(module.__name__).exec_module(module)
        _register(module.__name__)


def install() -> None:
    """Register now where a registry is already imported, else when it is."""
    if any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        return
    pending = set()
    for module in HOOKS:
        if module in sys.modules:
            _register(module)
        else:
            pending.add(module)
    if pending:
        sys.meta_path.insert(0, _RegisterAfterImport(pending))


install()  # verl's plugin loader only imports the entry point's module
