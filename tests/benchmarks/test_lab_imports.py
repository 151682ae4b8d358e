"""Every module of the lab imports under its installed name (``conduit_benchmarks.X``), as
``conduit bench`` and ``python -m conduit_benchmarks.X`` load it: none reaches for the source
folder's name (``benchmarks.``), which exists only in a checkout run from its root."""

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("conduit_benchmarks", reason="the lab is its own distribution: pip install -e benchmarks")

LAB = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
# frameworks a lab module may need that are not installed with the lab (SRL: its own venv)
OPTIONAL_FRAMEWORKS = {"rlsrl", "torchrl", "ale_py", "cv2"}

PROBE = """
import importlib, json, sys, traceback
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module("conduit_benchmarks." + name)
        out[name] = None
    except ModuleNotFoundError as exc:
        out[name] = ["missing", exc.name or "", str(exc)]
    except Exception as exc:
        out[name] = ["error", type(exc).__name__, traceback.format_exc()[-800:]]
print(json.dumps(out))
"""


def test_every_lab_module_imports_under_its_installed_name(tmp_path):
    # every module and bed (a bed by its __init__), by its dotted name under the lab
    # (inside the lab's packages only: a build/ folder a wheel build left is not the lab, nor is setup.py,
    # the build script, which the wheel leaves out)
    in_package = lambda p: all((d / "__init__.py").exists() for d in p.parents if d.is_relative_to(LAB))  # noqa: E731
    names = sorted(".".join(p.relative_to(LAB).with_suffix("").parts).removesuffix(".__init__")
                   for p in LAB.rglob("*.py") if p.relative_to(LAB).parts not in (("__init__.py",), ("setup.py",)) and in_package(p))
    assert len(names) > 20 and {"buffer", "rllib", "srl", "verl", "plane"} <= set(names)
    # from a folder that is not the checkout's root, so `benchmarks` (the folder) is not importable
    r = subprocess.run([sys.executable, "-c", PROBE, *names], capture_output=True, text=True, cwd=tmp_path,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(r.stdout.strip().splitlines()[-1])
    bad = {n: v for n, v in results.items()
           if v is not None and not (v[0] == "missing" and v[1].split(".")[0] in OPTIONAL_FRAMEWORKS)}
    assert not bad, json.dumps(bad, indent=1)
