"""The object kinds the store itself defines: blobs, chunked blobs and trees.

Records of MedOmni (templates, atom tasks, runs…) live in the porcelain packages and are
`Record` subclasses registered by kind; the store treats every kind alike.

Entry names
-----------
The rules for a tree entry's name live here, beside `Tree`, which checks them in its
constructor; `medomni_cas.store.trees` re-checks them on every tree it reads from raw bytes
(`check_tree_body`), and so does every object that comes in from outside: the function is
registered with `encoding.validate_canonical`, so put, import, sync and fsck refuse a tree
that no reader would read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from medomni_cas.errors import InvalidName, InvalidObject
from medomni_cas.store import encoding
from medomni_cas.store.encoding import TREE, Record
from medomni_cas.store.ids import ObjectId

__all__ = [
    "CHUNKED",
    "CHUNK_SIZE",
    "MAX_ENTRY_NAME",
    "ChunkedBlob",
    "Tree",
    "UnknownObject",
    "check_entry_name",
    "check_tree_body",
]

#: Blobs longer than this are stored as chunks of this size under a `ChunkedBlob`.
#: Part of identity: a blob's id depends on it, so it never changes for the kind's v1.
CHUNK_SIZE = 1 << 20
#: Longest tree entry name, in UTF-8 bytes (as on common filesystems).
MAX_ENTRY_NAME = 255


def check_entry_name(name: object) -> str:
    """Return ``name`` if it can name a tree entry, else raise `InvalidName` saying why."""
    if not isinstance(name, str):
        raise InvalidName(f"a tree entry name must be a string, got {type(name).__name__}")
    if name in ("", ".", ".."):
        raise InvalidName(f"tree entry name {name!r} is not allowed")
    if "/" in name or "\\" in name:
        raise InvalidName(f"tree entry name {name!r} contains a path separator")
    if "\x00" in name:
        raise InvalidName(f"tree entry name {name!r} contains NUL")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_ENTRY_NAME:
        raise InvalidName(f"tree entry name is longer than {MAX_ENTRY_NAME} bytes: {name[:40]!r}…")
    return name


def check_tree_body(body: object) -> dict[str, ObjectId]:
    """A tree's entries from its generically decoded body (links as `ObjectId`): a map of
    checked names to links; `InvalidName` or `InvalidObject` saying what is wrong."""
    if not isinstance(body, dict):
        raise InvalidObject("malformed tree: its body is not a map")
    for name, link in body.items():
        check_entry_name(name)
        if type(link) is not ObjectId:
            raise InvalidObject(f"tree entry {name!r} is not a link (a {type(link).__name__})")
    return body


encoding.register_body_check(TREE, 1, check_tree_body)


class ChunkedBlob(Record, frozen=True, kw_only=True):
    """A large blob: its size and the blobs of its consecutive chunks.

    The sizes must add up: every chunk but the last holds ``chunk_size`` bytes and the last
    holds the rest (1 to ``chunk_size``). A manifest that breaks this is refused (`InvalidObject`)
    when made and when decoded; the chunks' own lengths are checked as they are read.
    """

    __kind__ = "chunked-blob"

    size: int
    chunk_size: int
    chunks: list[ObjectId]

    def __post_init__(self) -> None:
        # a manifest whose sizes do not add up is crafted or corrupt: refused when made and
        # when decoded, so no reader can report a size that reading then refuses
        n, cs = len(self.chunks), self.chunk_size
        if cs <= 0 or self.size < 0 or not (n - 1) * cs < self.size <= n * cs:
            raise InvalidObject(f"size {self.size} does not fit {n} chunks of {cs} bytes")


#: The kind of a `ChunkedBlob`, beside `encoding.BLOB` and `encoding.TREE`.
CHUNKED = ChunkedBlob.__kind__


class Tree(Mapping[str, ObjectId]):
    """A folder: entry name -> the id of a blob, chunked blob or tree. Immutable."""

    __slots__ = ("_entries",)
    kind = TREE

    def __init__(self, entries: Mapping[str, ObjectId] | None = None) -> None:
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
