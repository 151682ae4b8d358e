"""The core's shape, read from its source: it imports no RL framework, adapter, suite or benchmark;
its subpackages import only those below them in the layering the package docstring draws (so
there is no circle, between packages or modules); and no module imports inside a function to
dodge a circle (only optional dependencies are imported late, and the command line, whose
``--help`` must not pay for torch)."""

import ast
import pathlib

CORE = pathlib.Path(__file__).resolve().parents[2] / "conduit_core"

# Ray itself is allowed (lazily): it is how tiers on other nodes run. RLlib is not.
FORBIDDEN = ("verl", "rlsrl", "gymnasium", "gym", "conduit_rllib", "conduit_verl", "conduit_srl",
             "conformance", "benchmarks", "integrations", "conduit_conformance", "conduit_benchmarks")

# Bottom to top: a module may import its own package and any package on an earlier line.
LAYERS = [
    {"errors", "_native"},
    {"state_io", "_moved"},
    {"memory"},
    {"schema"},
    {"storage"},
    {"remote"},
    {"planning"},
    {"selection"},
    {"source"},
    {"buffer"},
    {"plane"},
    {"queues", "kv"},
    {"__init__"},
    {"cli"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}

# Imported inside functions on purpose: dependencies the core does not require.
OPTIONAL = {"ray", "matplotlib", "importlib.metadata"}
LATE_IMPORTS_ALLOWED_IN = {"conduit_core.cli"}   # `conduit --help` answers without importing torch


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: pathlib.Path, root: pathlib.Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import in ``path``."""
    name = module_name(path, root)
    is_pkg = path.name == "__init__.py"
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    tree = ast.parse(path.read_text())
    in_function, for_types = set(), set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(fn) if n is not fn)
        elif isinstance(fn, ast.If) and "TYPE_CHECKING" in ast.unparse(fn.test):
            for_types.update(id(n) for n in ast.walk(fn) if n is not fn)   # annotations only: never run
    out = []
    for node in ast.walk(tree):
        if id(node) in for_types:
            continue
        late = id(node) in in_function
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, late) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            targets = [base]
            if node.module is None or (root.parent / (base.replace(".", "/"))).is_dir():
                # `from . import x` / `from .pkg import mod`: the submodules named, where they are modules
                subs = [f"{base}.{a.name}" for a in node.names
                        if (root.parent / f"{base.replace('.', '/')}/{a.name}.py").exists()
                        or (root.parent / f"{base.replace('.', '/')}/{a.name}").is_dir()]
                targets = subs or [base]
            out += [(t, node.lineno, late) for t in targets]
    return out


def top_of(module: str) -> str:
    """The first name under conduit_core: its subpackage, or the top-level module's own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layering_violations(root: pathlib.Path) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        here = top_of(name)
        if here not in LAYER_OF:
            bad.append(f"{name}: its subpackage {here!r} is in no layer (add it to LAYERS and the package docstring)")
            continue
        for target, line, _ in imports_of(path, root):
            if not target.startswith(root.name + ".") and target != root.name:
                continue
            there = top_of(target)
            if there == here or target == root.name and here == "__init__":
                continue
            if there not in LAYER_OF or LAYER_OF[there] > LAYER_OF[here] or (
                    LAYER_OF[there] == LAYER_OF[here] and there != here):
                bad.append(f"{name}:{line} imports {target}: {here!r} may import only what is below it")
    return bad


def late_imports(root: pathlib.Path) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        if name in LATE_IMPORTS_ALLOWED_IN:
            continue
        for target, line, late in imports_of(path, root):
            if late and target not in OPTIONAL and target.split(".")[0] not in OPTIONAL:
                bad.append(f"{name}:{line} imports {target} inside a function: import it at the top")
    return bad


def module_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """Module-level imports between the core's modules (a package's __init__ left out: it
    re-exports, and importing a subpackage runs it before any of its modules)."""
    graph: dict[str, set[str]] = {}
    modules = {module_name(p, root) for p in root.rglob("*.py") if p.name != "__init__.py"}
    for path in sorted(root.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        graph[module_name(path, root)] = {t for t, _, late in imports_of(path, root) if not late and t in modules}
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


def test_core_imports_none_of_the_lab_or_the_frameworks():
    bad = []
    for path in sorted(CORE.rglob("*.py")):
        for target, line, _ in imports_of(path, CORE):
            if target.split(".")[0] in FORBIDDEN or target.startswith("ray.rllib"):
                bad.append(f"{path.relative_to(CORE)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_the_subpackages_follow_the_layering():
    assert not layering_violations(CORE), "\n".join(layering_violations(CORE))


def test_every_subpackage_is_drawn_in_the_package_docstring():
    import conduit_core
    drawn = conduit_core.__doc__
    packages = sorted(p.name for p in CORE.iterdir() if (p / "__init__.py").exists() and not p.name.startswith("_"))
    assert packages and all(f"\n    {name}" in drawn or f", {name}" in drawn for name in packages), packages


def test_no_import_inside_a_function_but_optional_dependencies():
    assert not late_imports(CORE), "\n".join(late_imports(CORE))


def test_the_core_has_no_import_cycles():
    graph = module_graph(CORE)
    assert {"conduit_core.buffer.ring", "conduit_core.selection.selectors",
            "conduit_core.storage.columnar"} <= graph["conduit_core.buffer.experience_buffer"]  # the graph is read
    assert not cycles(graph), cycles(graph)


def test_the_checks_see_what_they_forbid(tmp_path):
    root = tmp_path / "conduit_core"
    for pkg in ("memory", "buffer"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "memory" / "tiers.py").write_text("from ..buffer.ring import Ring\n")          # upward
    (root / "buffer" / "ring.py").write_text("def f():\n    from ..memory.tiers import x\n")  # late
    (root / "buffer" / "draw.py").write_text("from . import ring\nimport ray\n")
    assert [v.split(":")[0] for v in layering_violations(root)] == ["conduit_core.memory.tiers"]
    assert [v.split(":")[0] for v in late_imports(root)] == ["conduit_core.buffer.ring"]
    graph = module_graph(root)
    assert graph["conduit_core.buffer.draw"] == {"conduit_core.buffer.ring"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
