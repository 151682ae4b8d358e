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
    ("memory/tiers.py", "self._shm._name"),
    # RaggedStore.from_state fills the store it has just built (same class, before anyone sees it)
    ("kv/ragged.py", "store._slots_for_write"), ("kv/ragged.py", "store._slot_of"), ("kv/ragged.py", "store._tensors"),
    ("kv/ragged.py", "store._slots"), ("kv/ragged.py", "store._objects"), ("kv/ragged.py", "store._object_set"),
    ("kv/ragged.py", "store._fill"),
}


ADAPTERS = CORE.parent / "adapters"

# What an adapter may reach into: its framework's internals, named with the reason (never a
# part of Conduit's: those have public contracts).
ALLOWED_IN_ADAPTERS = {
    # SRL's buffers offer no way to list what they hold; the suite's oracle reads it
    ("conduit_srl/conformance.py", "buffer._total_chunks"), ("conduit_srl/conformance.py", "buffer._buffer"),
    ("conduit_srl/conformance.py", "buffer._max_size"), ("conduit_srl/conformance.py", "buffer._ptr"),
    ("conduit_srl/conformance.py", "buffer._min_tree"),   # the oracle's sentinel leaves SRL's min tree
    # a trainer worker subclass runs SRL's own configure step first
    ("conduit_srl/trainer_worker.py", "TrainerWorker._configure"),
    # ... and SRL's own poll, whose logged step the subclass adds its buffer's counters to
    ("conduit_srl/trainer_worker.py", "TrainerWorker._poll"),
    # verl's trainers: the parent's own advantage stage, called for the fallback path
    ("conduit_verl/separated.py", "SeparateRayPPOTrainer._fit_compute_advantage"),
    ("conduit_verl/v1_trainer.py", "PPOTrainerSync._compute_advantage"),
    # RLlib's LifetimeSumStats set as its push() leaves it for a finite host number (push's NaN and
    # tensor checks cost ~4 us a call, 4-5 calls per get_metrics(), on every training step);
    # tests/rllib/test_replay_metrics.py compares every value with RLlib's own buffers
    ("conduit_rllib/replay_metrics.py", "s._lifetime_sum"),
    # a flag on the adapter's own class (type(self) is the class itself)
    ("conduit_verl/separated.py", "type(self)._conduit_fallback_logged"),
    ("conduit_verl/separated.py", "type(self)._conduit_mode_logged"),
    ("conduit_verl/v1_trainer.py", "type(self)._conduit_fallback_logged"),
    ("conduit_verl/v1_trainer.py", "type(self)._conduit_mode_logged"),
}


def private_reaches(folder: pathlib.Path = CORE, pattern: str = "**/*.py") -> list[tuple[str, int, str]]:
    out = []
    for path in sorted(folder.glob(pattern)):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and node.value.func.id == "super":
                continue
            out.append((str(path.relative_to(folder)), node.lineno, ast.unparse(node)))
    return out


def test_no_part_touches_another_parts_private_attributes():
    bad = [f"{f}:{line}: {src}" for f, line, src in private_reaches() if (f, src) not in ALLOWED]
    assert not bad, "private attributes of another part:\n" + "\n".join(bad)


def test_no_adapter_touches_a_private_attribute_of_another_part():
    bad = [f"{f}:{line}: {src}" for f, line, src in private_reaches(ADAPTERS, "conduit_*/*.py")
           if (f, src) not in ALLOWED_IN_ADAPTERS]
    assert not bad, "private attributes of another part (or an unlisted framework internal):\n" + "\n".join(bad)


def test_the_lint_sees_a_reach_and_lets_own_attributes_be(tmp_path):
    (tmp_path / "part.py").write_text("class Migration:\n"
                                      "    def start(self):\n"
                                      "        self._cursor = 0\n"
                                      "        return self.buffer._migration, super()._setup()\n")
    assert [src for _, _, src in private_reaches(tmp_path)] == ["self.buffer._migration"]
