"""``conduit new-adapter NAME``: scaffold an adapter package with its conformance test.

The scaffold is the example adapter (``conformance/examples/conduit_minirl``) copied and
renamed, so it passes the suite out of the box against the example framework. Replace
the lines marked ``STAGE MAP`` with your framework's calls, then run
``pytest conduit_NAME/tests`` (or ``conduit conformance conduit_NAME.conformance:harness``).
"""

from __future__ import annotations

import argparse
import keyword
import os
import shutil
import sys
from pathlib import Path

TEMPLATE = Path(__file__).parent / "examples" / "conduit_minirl"

# the scaffolded package's own pyproject: installable alone, its harness registered by name
PYPROJECT = """[build-system]
requires = ["setuptools>=77", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "Conduit adapter for {name}"
requires-python = ">=3.11"
dependencies = ["conduit-edp[test]>=0.1,<1"]   # add your framework here

# `conduit conformance {name}` finds the harness through this entry point
[project.entry-points."conduit.harnesses"]
{name} = "{pkg}.conformance:harness"

[tool.setuptools]
package-dir = {{"{pkg}" = "."}}
packages = ["{pkg}", "{pkg}.tests"]
"""


def scaffold(name: str, dest: str | os.PathLike = ".") -> Path:
    if not name.isidentifier() or keyword.iskeyword(name) or not name.islower():
        raise ValueError(f"NAME: expected a lowercase Python identifier, got {name!r}. Fix: e.g. 'myframework'")
    pkg = f"conduit_{name}"
    target = Path(dest) / pkg
    if target.exists():
        raise FileExistsError(f"{target} exists. Fix: choose another NAME or --dest, or remove it")
    shutil.copytree(TEMPLATE, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path in target.rglob("*.py"):
        text = path.read_text()
        path.write_text(text.replace("conduit_minirl", pkg).replace(
            "Conduit adapter for minirl (the example framework in ``conformance/examples/minirl.py``).",
            f"Conduit adapter for {name} (scaffolded from the minirl example: it passes the suite as is)."))
    (target / "pyproject.toml").write_text(PYPROJECT.format(name=name, pkg=pkg, dist=pkg.replace("_", "-")))
    (target / "README.md").write_text(
        f"# {pkg}\n\nScaffolded by `conduit new-adapter {name}`. It targets the example framework `minirl`\n"
        "and passes the conformance suite as is. To adapt it to your framework:\n\n"
        "1. Replace every line marked `STAGE MAP` (imports, `to_columns`, `to_transitions`, the native\n"
        "   session, the framework's name, the convergence workload) with your framework's experience\n"
        "   types and calls.\n"
        "2. Adjust the declared `capabilities` in `conformance.py` to what your adapter supports.\n"
        f"3. Run `pytest {pkg}/tests` or `conduit conformance {pkg}.conformance:harness`.\n\n"
        f"It is a package of its own: `pip install -e {pkg}` installs it (and the core), and registers\n"
        f"its harness, so `conduit conformance {name}` finds it by name.\n\n"
        "See docs/writing-an-adapter.md in the Conduit repository.\n")
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="conduit new-adapter", description=__doc__.split("\n\n")[0])
    p.add_argument("name", help="the framework's short name, e.g. 'myframework' -> package conduit_myframework")
    p.add_argument("--dest", default=".", help="directory to create the package in")
    a = p.parse_args(argv)
    try:
        target = scaffold(a.name, a.dest)
    except (ValueError, FileExistsError) as exc:
        print(f"conduit new-adapter: {exc}", file=sys.stderr)
        return 2
    print(f"created {target}\nnext: pytest {target}/tests  (it passes as is; then edit the STAGE MAP lines)")
    return 0
