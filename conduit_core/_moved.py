"""Module paths from before the core was split into subpackages (0.1.x), kept importable for a
release: ``import conduit_core.buffer_state`` still works, warns once with a DeprecationWarning
naming the new path, and gives the same module object (so ``isinstance`` and monkeypatching see
one module). CHANGELOG.md lists every move. Names that are now subpackages (``buffer``,
``storage``, ``memory``, ``remote``, ``selection``) need no entry: the subpackage exports the old
module's main names; its helpers moved where the CHANGELOG's table says."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old path -> new path (both under conduit_core)
MOVED = {
    "_affine": "_native._affine", "_draws": "_native._draws", "_frames": "_native._frames", "_pages": "_native._pages",
    "_rows": "_native._rows", "_scan": "_native._scan", "_segments": "_native._segments", "_sumtree": "_native._sumtree",
    "page_commit": "memory.page_commit", "output_pool": "memory.output_pool", "staging": "memory.staging",
    "tiers": "memory.tiers",
    "spec": "schema.spec", "codecs": "schema.codecs", "framestack": "schema.framestack",
    "shifted_rows": "schema.shifted_rows", "batch": "schema.batch", "nested": "schema.nested",
    "shards": "storage.shards", "local_shard": "storage.local_shard", "disk_shard": "storage.disk_shard",
    "shard_gather": "storage.shard_gather",
    "ray_local": "remote.ray_local",
    "selectors": "selection.selectors", "sumtree": "selection.sumtree", "rate_limiter": "selection.rate_limiter",
    "rate_gate": "selection.rate_gate",
    "source_writer": "source.source_writer", "source_commit": "source.source_commit",
    "taken_receipts": "source.taken_receipts", "writer_placement": "source.writer_placement",
    "ring": "buffer.ring", "buffer_state": "buffer.buffer_state", "insertion": "buffer.insertion",
    "inline_insert": "buffer.inline_insert", "delivery": "buffer.delivery", "row_draw": "buffer.row_draw",
    "window_draw": "buffer.window_draw", "episodes": "buffer.episodes", "walk_rows": "buffer.walk_rows",
    "sampling_args": "buffer.sampling_args", "shard_loss": "buffer.shard_loss", "migration": "buffer.migration",
    "placement": "planning.placement", "topology": "planning.topology", "costmodel": "planning.costmodel",
    "tuner": "planning.tuner", "simulate": "planning.simulate", "ranking": "planning.ranking",
    "schedule": "planning.schedule",
    "edp": "plane.edp", "edp_state": "plane.edp_state", "ingestion": "plane.ingestion",
    "delivery_operator": "plane.delivery_operator", "prepared_deliveries": "plane.prepared_deliveries",
    "prepared_replay": "plane.prepared_replay", "background_worker": "plane.background_worker",
    "background_errors": "plane.background_errors", "workers": "plane.workers", "hooks": "plane.hooks",
    "metrics": "plane.metrics",
    "entry_queue": "queues.entry_queue", "queue_args": "queues.queue_args", "reuse_order": "queues.reuse_order",
    "sample_layout": "queues.sample_layout", "slot_arena": "queues.slot_arena",
    "ragged": "kv.ragged", "ragged_column": "kv.ragged_column", "byte_segments": "kv.byte_segments",
    "shared_arena": "kv.shared_arena",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``conduit_core.<old>`` for a moved module and hands back the module at its new path."""

    def __init__(self, package: str):
        self.prefix = package + "."
        self.specs: dict[int, object] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.prefix) and fullname[len(self.prefix):] in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = self.prefix + MOVED[spec.name[len(self.prefix):]]
        warnings.warn(f"{spec.name} moved to {new} in conduit-edp 0.2; the old path is removed in 0.3. "
                      f"Fix: import {new} (or the name from conduit_core itself)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self.specs[id(module)] = module.__spec__   # the import system sets the old path's spec on it next
        return module

    def exec_module(self, module):
        """The module at its new path is already executed: only its own spec is put back (reload,
        find_spec and relative imports inside it keep working under the new path)."""
        own = self.specs.pop(id(module), None)
        if own is not None:
            module.__spec__ = own
            module.__loader__ = own.loader


def install(package: str) -> None:
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder(package))   # before the path finders: a stale build at an old path never shadows it
