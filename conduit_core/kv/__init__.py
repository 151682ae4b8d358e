"""Keyed experience of variable length (verl's prompts and responses): rows stored by column in
arenas, local or in shared memory other processes on the node map directly."""

from .ragged import KeyNotStored, RaggedStore

__all__ = ["KeyNotStored", "RaggedStore"]
