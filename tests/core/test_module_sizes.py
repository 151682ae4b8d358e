"""No module of the library over ~400 lines (issue 14): a module that grows past it holds more
than one concept and is split into parts with public contracts (see how buffer.py, storage.py,
edp.py and the adapters' buffers were split). Tests are exempt; everything that ships or that
a user reads as a reference (adapters, the suite, the lab, integrations) is not."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = ("conduit_core", "conformance", "adapters", "benchmarks", "integrations")
LIMIT = 400


def long_modules(root: pathlib.Path = ROOT, limit: int = LIMIT) -> list[str]:
    out = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            lines = path.read_text().count("\n")
            if lines > limit:
                out.append(f"{path.relative_to(root)}: {lines} lines")
    return out


def test_no_module_is_over_the_limit():
    assert not long_modules(), f"modules over {LIMIT} lines (split them into parts):\n" + "\n".join(long_modules())


def test_the_check_sees_a_long_module(tmp_path):
    (tmp_path / "conduit_core").mkdir()
    (tmp_path / "conduit_core" / "big.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "conduit_core" / "small.py").write_text("x = 1\n" * LIMIT)
    assert long_modules(tmp_path) == [f"conduit_core/big.py: {LIMIT + 1} lines"]
