"""Everything the API reference documents (``docs/api/*.md``, each ``:::`` object with the members it
shows) is annotated: every parameter and every return, read by griffe, the library mkdocstrings reads
the reference with, so the check covers exactly what a reader of the reference (or an IDE) sees. A new
public function without types fails here, naming it."""

import re
import sys
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe", reason="needs the [docs] extra (mkdocstrings' griffe)")

ROOT = Path(__file__).resolve().parents[2]


def documented() -> list[tuple[str, str, list[str] | None]]:
    """(page, object path, the members it lists or None for every public one) per ``:::`` block."""
    out = []
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        for m in re.finditer(r"^::: (\S+)((?:\n    .*)*)", page.read_text(), re.M):
            listed = re.search(r"members: \[([^\]]*)\]", m.group(2).replace("\n", " "))
            out.append((page.name, m.group(1), [x.strip() for x in listed.group(1).split(",")] if listed else None))
    return out


def functions(obj, members):
    """The functions ``obj`` shows: itself, or its members (those listed, else the public ones and
    ``__init__``), a module's classes' too; re-exports are checked where they are documented."""
    if obj.is_function:
        yield obj
        return
    names = members if members is not None else [n for n in obj.members if not n.startswith("_") or n == "__init__"]
    for name in names:
        member = obj.members[name]
        if member.is_alias:
            if obj.is_module:
                continue
            member = member.final_target
        if member.is_function:
            yield member
        elif member.is_class and obj.is_module:
            yield from functions(member, None)


def test_every_documented_function_is_annotated():
    loader = griffe.GriffeLoader(search_paths=[str(ROOT), str(ROOT / "adapters"), *sys.path])
    blocks = documented()
    assert len(blocks) >= 60, blocks   # the pages were read (a broken pattern would check nothing)
    checked, missing = 0, []
    for page, path, members in blocks:
        head, *rest = path.split(".")
        obj = loader.load(head)
        for part in rest:
            obj = obj.members[part]
            while obj.is_alias:
                obj = obj.final_target
        for fn in functions(obj, members):
            checked += 1
            bare = [p.name for p in fn.parameters if p.name not in ("self", "cls") and p.annotation is None]
            if fn.returns is None and fn.name != "__init__":
                bare.append("return")
            if bare:
                missing.append(f"{page}: {fn.path}({', '.join(bare)})")
    assert checked >= 500, checked
    assert not missing, ("annotate these (parameters named, 'return' for the return type):\n"
                         + "\n".join(sorted(set(missing))))
