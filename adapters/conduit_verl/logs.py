"""Conduit's log lines where verl runs, so that a run says Conduit is in it.

verl's processes (its driver, the TaskRunner, every Ray worker) configure no Python logging: verl
and TransferQueue give their own loggers a level and a handler each (``VERL_LOGGING_LEVEL``,
TransferQueue's stream handler), and a logger without one shows only warnings, through Python's
last-resort handler. Conduit's INFO lines (a storage backend or trainer mode built, storage units
shut down) would be dropped. :func:`show_in_verl` gives the ``conduit`` and ``conduit_verl`` loggers
the same treatment: a level, ``CONDUIT_LOGGING_LEVEL`` (default INFO), unless one was set for them,
and a stream handler only where nothing would print them: where the root logger has handlers (a
user's ``basicConfig``, verl's TaskRunner) the lines go there. A bad level raises ``ConfigError``
where verl imports its trainer or TransferQueue, before anything is registered.
"""

from __future__ import annotations

import logging
import os

from conduit_core.errors import ConfigError

ENV = "CONDUIT_LOGGING_LEVEL"
LOGGERS = ("conduit", "conduit_verl")
FORMAT = "%(asctime)s - %(levelname)s - %(name)s - %(message)s"   # TransferQueue's, beside it in verl's output


def level_from_env() -> int:
    raw = os.environ.get(ENV, "INFO")
    level = logging.getLevelName(raw.strip().upper())
    if not isinstance(level, int):
        raise ConfigError(ENV, "a logging level name (DEBUG, INFO, WARNING, ERROR)", repr(raw),
                          f"set {ENV}=WARNING to hide Conduit's INFO lines in verl's output, or unset it")
    return level


def show_in_verl() -> None:
    """Give Conduit's loggers a level, and where nothing prints them, a stream handler."""
    level = level_from_env()
    configured = bool(logging.getLogger().handlers)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:   # a level set for them (by the user) stays
            logger.setLevel(level)
        if configured or logger.handlers:     # the root's handlers print them (its level is not theirs)
            continue
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(handler)   # (propagation stays: a root handler added later gets them too)
