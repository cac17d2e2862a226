"""The object kinds the store itself defines: blobs, chunked blobs and trees.

Records of MedOmni (templates, atom tasks, runs…) live in the porcelain packages and are
`Record` subclasses registered by kind; the store treats every kind alike.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from medomni_cas.store.encoding import TREE, Record
from medomni_cas.store.ids import ObjectId

__all__ = ["CHUNK_SIZE", "ChunkedBlob", "Tree", "UnknownObject"]

#: Blobs longer than this are stored as chunks of this size under a `ChunkedBlob`.
#: Part of identity: a blob's id depends on it, so it never changes for the kind's v1.
CHUNK_SIZE = 1 << 20


class ChunkedBlob(Record, frozen=True, kw_only=True):
    """A large blob: its size and the blobs of its consecutive chunks."""

    __kind__ = "chunked-blob"

    size: int
    chunk_size: int
    chunks: list[ObjectId]


class Tree(Mapping[str, ObjectId]):
    """A folder: entry name -> the id of a blob, chunked blob or tree. Immutable."""

    __slots__ = ("_entries",)
    kind = TREE

    def __init__(self, entries: Mapping[str, ObjectId] | None = None) -> None:
        from medomni_cas.store.trees import check_entry_name

        items = dict(entries or {})
        for name, oid in items.items():
            check_entry_name(name)
            if type(oid) is not ObjectId:
                raise TypeError(
                    f"tree entry {name!r} must be an ObjectId, not {type(oid).__name__}"
                )
        self._entries = dict(sorted(items.items()))

    def __getitem__(self, name: str) -> ObjectId:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tree) and other._entries == self._entries

    def __hash__(self) -> int:
        return hash(tuple(self._entries.items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {v.short}" for k, v in self._entries.items())
        return f"Tree({{{inner}}})"


class UnknownObject(msgspec.Struct, frozen=True):
    """An object of a kind no installed package registers: readable, walkable, not typed."""

    kind: str
    version: int
    body: Any
