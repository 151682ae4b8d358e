"""Conduit's log lines in verl's processes (conduit_verl.logs): shown where verl configures nothing,
left to the process's own configuration where it has one, a bad level refused with the fix."""

import os
import subprocess
import sys

import pytest

PROBE = """
import logging, sys
{setup}
from conduit_verl.logs import show_in_verl
show_in_verl()
logging.getLogger("conduit_verl.tq_backend").info("conduit_verl: built")
logging.getLogger("conduit").debug("conduit: detail")
print("handlers", len(logging.getLogger("conduit_verl").handlers), file=sys.stderr)
"""


def _run(setup: str = "", **env) -> str:
    r = subprocess.run([sys.executable, "-c", PROBE.format(setup=setup)], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stderr


def test_an_unconfigured_process_prints_conduits_info_lines_with_their_own_handler():
    out = _run()
    assert "INFO - conduit_verl.tq_backend - conduit_verl: built" in out and "handlers 1" in out
    assert "detail" not in out


def test_a_configured_root_prints_them_through_its_own_handlers_and_no_handler_is_added():
    out = _run('logging.basicConfig(format="%(levelname)s|%(message)s")')   # (root level: WARNING)
    assert "INFO|conduit_verl: built" in out and "handlers 0" in out and out.count("built") == 1


def test_the_level_comes_from_the_environment_and_a_level_set_by_the_user_stays():
    assert "conduit: detail" in _run(CONDUIT_LOGGING_LEVEL="debug")
    assert "built" not in _run(CONDUIT_LOGGING_LEVEL="WARNING")
    assert "built" not in _run('logging.getLogger("conduit_verl").setLevel(logging.ERROR)')


def test_a_level_that_is_not_one_is_refused_naming_the_variable(monkeypatch):
    from conduit_core import ConfigError
    from conduit_verl.logs import show_in_verl
    monkeypatch.setenv("CONDUIT_LOGGING_LEVEL", "loud")
    with pytest.raises(ConfigError, match="CONDUIT_LOGGING_LEVEL.*'loud'.*WARNING"):
        show_in_verl()
