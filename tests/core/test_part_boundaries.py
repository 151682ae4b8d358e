"""No part of the core reaches into another part's private attributes (issue 14): every
``<expr>._name`` in conduit_core must be on ``self``/``cls`` (its own object). A part that
needs something of another asks through a public method (e.g. the buffer's
``attach_dual_writer`` / ``stored_columns`` / ``adopt_layout`` for a migration). The
exceptions are listed with their reason."""

import ast
import pathlib

CORE = pathlib.Path(__file__).resolve().parents[2] / "conduit_core"

ALLOWED = {
    # the standard library's SharedMemory registers its segment under the private name
    ("tiers.py", "self._shm._name"),
    # RaggedStore.from_state fills the store it has just built (same class, before anyone sees it)
    ("ragged.py", "store._slots_for_write"), ("ragged.py", "store._slot_of"), ("ragged.py", "store._tensors"),
    ("ragged.py", "store._slots"), ("ragged.py", "store._objects"), ("ragged.py", "store._object_set"),
}


def private_reaches(folder: pathlib.Path = CORE) -> list[tuple[str, int, str]]:
    out = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and node.value.func.id == "super":
                continue
            out.append((path.name, node.lineno, ast.unparse(node)))
    return out


def test_no_part_touches_another_parts_private_attributes():
    bad = [f"{f}:{line}: {src}" for f, line, src in private_reaches() if (f, src) not in ALLOWED]
    assert not bad, "private attributes of another part:\n" + "\n".join(bad)


def test_the_lint_sees_a_reach_and_lets_own_attributes_be(tmp_path):
    (tmp_path / "part.py").write_text("class Migration:\n"
                                      "    def start(self):\n"
                                      "        self._cursor = 0\n"
                                      "        return self.buffer._migration, super()._setup()\n")
    assert [src for _, _, src in private_reaches(tmp_path)] == ["self.buffer._migration"]
