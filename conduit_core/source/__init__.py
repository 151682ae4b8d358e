"""Ingestion at the source: a writer an actor holds validates, encodes and stages its rollouts
in the shard assigned to it (``SourceWriter``); the buffer commits their receipts, each once."""

from .source_commit import CommitReport
from .source_writer import Receipt, SourceWriter

__all__ = ["CommitReport", "Receipt", "SourceWriter"]
