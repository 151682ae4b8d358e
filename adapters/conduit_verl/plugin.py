"""verl's ``verl.plugins`` entry point: registers Conduit's trainer mode without changing verl.

verl imports every ``verl.plugins`` entry point on ``import verl`` (in the driver and in
every Ray worker; ``VERL_USE_EXTERNAL_PLUGINS=none`` turns them off) and swallows a
plugin's import error at debug level. So importing this module does almost nothing: loading
verl's V1 trainer here would pull Ray, TransferQueue and the worker classes into every
``import verl``, from inside verl's half-initialised package, where failures go unseen.
Instead a post-import hook waits for verl's trainer registry module
(``verl.trainer.ppo.v1.trainer_base``) and registers ``trainer_mode=conduit`` right after it
has executed; a registration failure is logged at ERROR and raised in that import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys

REGISTRY_MODULE = "verl.trainer.ppo.v1.trainer_base"
log = logging.getLogger(__name__)


def _register() -> None:
    from .v1_trainer import register
    try:
        register()
    except Exception:
        log.exception("conduit_verl: registering trainer_mode=conduit failed; verl will not know the mode")
        raise


class _RegisterAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets the normal finders locate ``REGISTRY_MODULE``, executes it with their loader,
    then registers Conduit's trainer. One shot: it leaves ``sys.meta_path`` when used."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != REGISTRY_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _register()


def install() -> None:
    """Register now if verl's registry is already imported, else when it is."""
    if REGISTRY_MODULE in sys.modules:
        _register()
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())


install()  # verl's plugin loader only imports the entry point's module
