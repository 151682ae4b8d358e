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


def module_graph(package: pathlib.Path) -> dict[str, set[str]]:
    """Module-level imports between the package's modules (imports inside functions are the
    deliberate, lazy ones and are left out)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(package.glob("*.py")):
        deps = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps.update(a.name for a in node.names)
            elif isinstance(node, ast.Try):  # optional C helpers: try: from ._x import ...
                for sub in node.body:
                    if isinstance(sub, ast.ImportFrom) and sub.level == 1 and sub.module:
                        deps.add(sub.module.split(".")[0])
        graph[path.stem] = {d for d in deps if (package / f"{d}.py").exists()}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                found.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2
    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_core_has_no_import_cycles():
    core = pathlib.Path(__file__).resolve().parents[2] / "conduit_core"
    graph = module_graph(core)
    assert {"ring", "episodes", "selectors", "storage"} <= graph["buffer"]  # the graph is read
    assert not cycles(graph), cycles(graph)


def test_the_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
