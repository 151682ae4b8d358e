"""The distributions' shape (issue 14): the core ships only the core and the suite, under the
project's own import names; each adapter is a distribution of its own that depends on the core
at the same version and on its framework only; the lab (benchmarks, tuning) is a distribution of
its own that contributes the `conduit bench` / `conduit tune` commands; no adapter imports the lab."""

import ast
import pathlib
import re
import tomllib
from importlib import metadata

ROOT = pathlib.Path(__file__).resolve().parents[2]
ADAPTERS = {"conduit_rllib": "ray[rllib]", "conduit_verl": "verl[verl-core]", "conduit_srl": None}


def project(path: pathlib.Path) -> dict:
    return tomllib.loads(path.read_text())


def test_the_core_distribution_installs_only_the_core_and_the_suite_under_its_own_names():
    core = project(ROOT / "pyproject.toml")
    tool = core["tool"]["setuptools"]
    assert {p.split(".")[0] for p in tool["packages"]} == {"conduit_core", "conduit_conformance"}
    assert tool["package-dir"] == {"conduit_conformance": "conformance"}
    eps = core["project"].get("entry-points", {})
    assert "conduit.bench" not in eps and "conduit.tune" not in eps and "verl.plugins" not in eps
    assert not any(d.split("[")[0].startswith(("ray", "verl")) for d in core["project"]["dependencies"])


def setup_requires(folder: pathlib.Path) -> list[str]:
    """What a distribution's setup.py requires besides the core (its ``REQUIRES``), read without running it."""
    for node in ast.parse((folder / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["REQUIRES"]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{folder}/setup.py has no REQUIRES list")


def test_the_version_is_written_once():
    """conduit_core/VERSION is the only place: the core's metadata reads it, each adapter's and the lab's
    setup.py read it for their version and their pin on the core; no pyproject names a version of the core."""
    version = (ROOT / "conduit_core" / "VERSION").read_text().strip()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    core = project(ROOT / "pyproject.toml")
    assert "version" not in core["project"] and core["project"]["dynamic"] == ["version"]
    assert core["tool"]["setuptools"]["dynamic"]["version"] == {"file": "conduit_core/VERSION"}
    assert "VERSION" in core["tool"]["setuptools"]["package-data"]["conduit_core"]
    for folder in [ROOT / "adapters" / pkg for pkg in ADAPTERS] + [ROOT / "benchmarks"]:
        meta = project(folder / "pyproject.toml")["project"]
        assert "version" not in meta and set(meta["dynamic"]) == {"version", "dependencies"}, folder
        assert "conduit_core/VERSION" in (folder / "setup.py").read_text()
    # the distributions released at the core's version (the worked example and the scaffold's new adapter
    # are outside adapters: their own versions are theirs)
    ours = [p for folder in ("conduit_core", "adapters", "benchmarks") for p in (ROOT / folder).rglob("*.py")
            if "egg-info" not in str(p) and "__pycache__" not in p.parts]
    written = [str(p.relative_to(ROOT)) for p in ours if f'"{version}"' in p.read_text()]
    assert not written, f"the version {version} is written by hand in {written}: read conduit_core.__version__"


def test_the_build_scripts_are_one_script_but_for_what_each_requires():
    """Each distribution's setup.py must stand alone (its sdist has no checkout around it), so the script
    is copied; the copies may differ only in REQUIRES."""
    def without_requires(folder: pathlib.Path) -> str:
        body = [n for n in ast.parse((folder / "setup.py").read_text()).body
                if not (isinstance(n, ast.Assign) and [t.id for t in n.targets] == ["REQUIRES"])]
        return ast.dump(ast.Module(body=body, type_ignores=[]))
    scripts = {f: without_requires(ROOT / f) for f in [f"adapters/{p}" for p in ADAPTERS] + ["benchmarks"]}
    assert len(set(scripts.values())) == 1, "the setup.py copies differ beyond REQUIRES: " + ", ".join(scripts)


def test_each_adapter_depends_on_the_core_at_its_version_and_on_its_framework_only():
    for pkg, framework in ADAPTERS.items():
        meta = project(ROOT / "adapters" / pkg / "pyproject.toml")
        deps = setup_requires(ROOT / "adapters" / pkg)
        assert meta["project"]["name"] == pkg.replace("_", "-")
        others = [d for d in deps if d.startswith("conduit-")]
        assert not others, f"{pkg} pulls other Conduit distributions: {others}"
        frameworks = [d for d in deps if d.split("[")[0].split("=")[0].split(">")[0] in ("ray", "verl")]
        assert frameworks == ([] if framework is None else [d for d in deps if d.startswith(framework)]), (pkg, deps)
        assert meta["tool"]["setuptools"]["package-dir"] == {pkg: "."}


def test_the_installed_distributions_carry_the_core_version_and_pin_the_core_at_it():
    """What pip recorded when it installed them (CI installs every distribution from the checkout): each is
    at the core's version and requires the core at exactly that version."""
    import conduit_core
    version = conduit_core.__version__
    assert metadata.version("conduit-edp") == version
    for dist in [pkg.replace("_", "-") for pkg in ADAPTERS] + ["conduit-benchmarks"]:
        try:
            got = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue   # not installed here: its static shape is checked above
        assert got == version, (dist, got, version)
        assert f"conduit-edp=={version}" in (metadata.requires(dist) or []), (dist, metadata.requires(dist))


def test_the_lab_is_a_distribution_of_its_own_with_the_bench_and_tune_commands():
    lab = project(ROOT / "benchmarks" / "pyproject.toml")
    # the lab and each of its beds (a folder with an __init__) are packaged: none left out of the wheel
    beds = sorted(p.parent.name for p in (ROOT / "benchmarks").glob("*/__init__.py"))
    assert sorted(lab["tool"]["setuptools"]["packages"]) == ["conduit_benchmarks"] + [f"conduit_benchmarks.{b}" for b in beds]
    eps = lab["project"]["entry-points"]
    assert {"buffer", "rllib-dqn"} <= set(eps["conduit.bench"]) and "rllib-dqn" in eps["conduit.tune"]
    assert all(v.startswith("conduit_benchmarks.") for g in eps.values() for v in g.values())


def test_no_adapter_imports_the_lab():
    bad = []
    for pkg in ADAPTERS:
        for path in sorted((ROOT / "adapters" / pkg).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
                bad += [f"{pkg}/{path.name}:{node.lineno} imports {n}" for n in names
                        if n.split(".")[0] in ("benchmarks", "conduit_benchmarks", "integrations", "conformance")]
    assert not bad, "\n".join(bad)


def test_the_worked_example_is_packaged_like_an_outside_adapter():
    """examples/conduit_sb3: the core at the project's version, its framework at a tested range, its
    harness registered for ``conduit conformance sb3``; the version it reports is its package's."""
    from packaging.requirements import Requirement
    version = (ROOT / "conduit_core" / "VERSION").read_text().strip()
    meta = project(ROOT / "examples" / "conduit_sb3" / "pyproject.toml")
    deps = meta["project"]["dependencies"]
    core = [Requirement(d) for d in deps if d.startswith("conduit-edp")]
    assert len(core) == 1 and core[0].specifier.contains(version), (deps, version)   # a range, as any outside adapter
    assert [d for d in deps if not d.startswith("conduit-edp")] == ["stable-baselines3>=2.9,<2.10"]
    assert meta["project"]["entry-points"]["conduit.harnesses"] == {"sb3": "conduit_sb3.conformance:harness"}
    init = (ROOT / "examples" / "conduit_sb3" / "conduit_sb3" / "__init__.py").read_text()
    assert f'__version__ = "{meta["project"]["version"]}"' in init   # its own version, not the core's


def test_the_core_reports_the_version_it_is_packaged_at():
    import conduit_core
    assert conduit_core.__version__ == (ROOT / "conduit_core" / "VERSION").read_text().strip()
