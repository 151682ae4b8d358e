"""The distributions' shape (issue 14): the core ships only the core and the suite, under the
project's own import names; each adapter is a distribution of its own that depends on the core
at the same version and on its framework only; the lab (benchmarks, tuning) is a distribution of
its own that contributes the `conduit bench` / `conduit tune` commands; no adapter imports the lab."""

import ast
import pathlib
import tomllib

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


def test_each_adapter_depends_on_the_core_at_its_version_and_on_its_framework_only():
    version = project(ROOT / "pyproject.toml")["project"]["version"]
    for pkg, framework in ADAPTERS.items():
        meta = project(ROOT / "adapters" / pkg / "pyproject.toml")
        deps = meta["project"]["dependencies"]
        assert meta["project"]["name"] == pkg.replace("_", "-") and meta["project"]["version"] == version
        assert f"conduit-edp=={version}" in deps, (pkg, deps)
        others = [d for d in deps if d.startswith("conduit-") and d != f"conduit-edp=={version}"]
        assert not others, f"{pkg} pulls other Conduit distributions: {others}"
        frameworks = [d for d in deps if d.split("[")[0].split("=")[0] in ("ray", "verl")]
        assert frameworks == ([] if framework is None else [d for d in deps if d.startswith(framework)]), (pkg, deps)
        assert meta["tool"]["setuptools"]["package-dir"] == {pkg: "."}


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
    version = project(ROOT / "pyproject.toml")["project"]["version"]
    meta = project(ROOT / "examples" / "conduit_sb3" / "pyproject.toml")
    deps = meta["project"]["dependencies"]
    assert meta["project"]["version"] == version and f"conduit-edp=={version}" in deps
    assert [d for d in deps if not d.startswith("conduit-edp")] == ["stable-baselines3>=2.9,<2.10"]
    assert meta["project"]["entry-points"]["conduit.harnesses"] == {"sb3": "conduit_sb3.conformance:harness"}
    init = (ROOT / "examples" / "conduit_sb3" / "conduit_sb3" / "__init__.py").read_text()
    assert f'__version__ = "{version}"' in init


def test_the_core_reports_the_version_it_is_packaged_at():
    version = project(ROOT / "pyproject.toml")["project"]["version"]
    assert f'__version__ = "{version}"' in (ROOT / "conduit_core" / "__init__.py").read_text()
