"""0.1's module paths still import for a release (CHANGELOG.md): the same module object as the
new path, with a DeprecationWarning that names the new path; every path in the table exists."""

import importlib
import subprocess
import sys

import pytest

from conduit_core._moved import MOVED


CHECK_ALL = """
import importlib, sys, warnings
from conduit_core._moved import MOVED
bad = []
for old, new_path in sorted(MOVED.items()):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        old_mod = importlib.import_module("conduit_core." + old)
    new_mod = importlib.import_module("conduit_core." + new_path)
    msgs = [str(x.message) for x in w if x.category is DeprecationWarning]
    if old_mod is not new_mod or new_mod.__name__ != "conduit_core." + new_path:
        bad.append(f"{old}: {old_mod!r} is not {new_mod!r}")
    elif not any("conduit_core." + new_path in m for m in msgs):
        bad.append(f"{old}: no DeprecationWarning naming the new path ({msgs})")
print("\\n".join(bad))
sys.exit(1 if bad else 0)
"""


def test_each_old_path_is_the_new_module_with_a_warning():
    """In a fresh interpreter, so that no old path was imported (and warned) before."""
    r = subprocess.run([sys.executable, "-c", CHECK_ALL], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(MOVED) > 50


def test_an_old_path_patched_is_the_module_the_core_uses(monkeypatch):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import conduit_core.ring as old_ring
    from conduit_core.buffer import ring
    monkeypatch.setattr(old_ring, "_marker_for_this_test", 1, raising=False)
    assert ring._marker_for_this_test == 1


def test_a_path_that_never_existed_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("conduit_core.no_such_module")
