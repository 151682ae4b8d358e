"""The core imports no RL framework, adapter, conformance suite or benchmark, not even lazily
(its CLI finds those through entry points): checked on the source, so a lazy import inside a
function counts too."""

import ast
import pathlib

# Ray itself is allowed (lazily): it is how tiers on other nodes run. RLlib is not.
FORBIDDEN = ("verl", "rlsrl", "gymnasium", "gym", "conduit_rllib", "conduit_verl", "conduit_srl",
             "conformance", "benchmarks", "integrations", "conduit_conformance", "conduit_benchmarks")


def test_core_imports_none_of_the_lab_or_the_frameworks():
    core = pathlib.Path(__file__).resolve().parents[2] / "conduit_core"
    bad = []
    for path in sorted(core.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bad += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in FORBIDDEN or n.startswith("ray.rllib")]
    assert not bad, "\n".join(bad)
